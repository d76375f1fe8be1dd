"""The local sandbox with warm starts, for the sandbox tests: a backend whose every run of a
Python script starts from a warm process that was ready for it (asserted, not hoped)."""

from __future__ import annotations

import contextlib
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from floom.sandbox.base import LineSink, Sandbox, SandboxResult, SandboxSpec
from floom.sandbox.local.backend import LocalSandbox
from floom.sandbox.local.warm.pools import WarmKey, WarmPools
from floom.sandbox.local.warm.runs import WarmRun

READY_SECONDS = 30.0
# What the recording run of a test pool loads: what the suites' scripts import.
WARM_UP = """
import json, os, random, socket, subprocess, sys, time, mmap, ctypes, hashlib
from pathlib import Path
"""


class WarmedLocal(Sandbox):
    """`local`, with each spec opted into the warm pool `version` of worker `worker`; before
    each run a warm child is ready, and the run must have started from one."""

    name = "local-warm"

    def __init__(
        self, local: LocalSandbox, work_root: Path, *, version: str = "v1", worker: str = "w"
    ) -> None:
        assert local.warm is not None, "warm starts need a root floom"
        self.local = local
        self.pools: WarmPools = local.warm
        self.work_root = work_root
        self.version = version
        self.worker = worker
        self.ready_wanted = 1

    def warm_spec(self, spec: SandboxSpec) -> SandboxSpec:
        return replace(
            spec, warm=self.version, metadata={**spec.metadata, "floom_worker": self.worker}
        )

    def key(self, spec: SandboxSpec) -> WarmKey | None:
        return self.pools.key_of(self.warm_spec(spec))

    def warm_up(self, spec: SandboxSpec) -> WarmKey:
        """Have the pool of `spec` record (with a cold run of WARM_UP) and a child ready."""
        key = self.key(spec)
        assert key is not None, "this spec cannot start warm"
        if self.pools.process_of(key) is None and not self.pools.wait_ready(key, 0):
            run_dir = self.work_root / f"warmup-{uuid.uuid4().hex[:8]}-1"
            self.local.make_run_dir(run_dir, disk_mb=64)
            (run_dir / "work").mkdir()
            (run_dir / "output").mkdir()
            (run_dir / "work/run.py").write_text(WARM_UP)
            warm_up = self.warm_spec(
                SandboxSpec(
                    run_id="warmup",
                    command=["python3", "run.py"],
                    workdir=run_dir / "work",
                    output_dir=run_dir / "output",
                )
            )
            try:
                self.local.run(warm_up, on_line=_ignore, should_cancel=lambda: False)
            finally:
                self.local.release_run_dir(run_dir)
        assert self.pools.wait_ready(key, READY_SECONDS), "no warm child got ready"
        return key

    def run(
        self, spec: SandboxSpec, *, on_line: LineSink, should_cancel: Callable[[], bool]
    ) -> SandboxResult:
        spec = self.warm_spec(spec)
        if self.pools.key_of(spec) is None:
            return self.local.run(spec, on_line=on_line, should_cancel=should_cancel)
        self.warm_up(spec)
        # Started as `local.run` starts it, and known warm by what started: the node's hit
        # count would also count the runs of other threads meanwhile.
        started = self.local.start_ahead(spec)
        if not isinstance(started, WarmRun):
            started.discard()
            raise AssertionError("the run did not start warm")
        return started.run(on_line=on_line, should_cancel=should_cancel)

    def hits(self) -> int:
        hits = self.pools.stats()["hits"]
        assert isinstance(hits, int)
        return hits

    def close(self) -> None:
        self.local.close()

    def kill_orphans(self, work_root: Path) -> int:
        return self.local.kill_orphans(work_root)


def warm_script_spec(work_root: Path, script: str, **fields: object) -> SandboxSpec:
    """A spec running `script` as run.py in a fresh run dir under `work_root`."""
    run_dir = work_root / f"run-{uuid.uuid4().hex[:8]}-1"
    (run_dir / "work").mkdir(parents=True)
    (run_dir / "output").mkdir()
    (run_dir / "work/run.py").write_text(textwrap.dedent(script))
    return SandboxSpec(
        run_id=run_dir.name.rsplit("-", 1)[0],
        command=["python3", "run.py"],
        workdir=run_dir / "work",
        output_dir=run_dir / "output",
        **{"timeout_seconds": 30.0, **fields},  # type: ignore[arg-type]
    )


def _ignore(stream: str, line: str) -> None:
    """Lines of a warm-up run, unread."""


@contextlib.contextmanager
def cold_or_warm(
    start: str, tmp_path: Path, local: LocalSandbox | None = None
) -> Iterator[Sandbox]:
    """The local sandbox (`local`, or a default one) as a suite parametrized over both
    starts sees it: `cold`, or `warm` (every run of a Python script from a warm process,
    under `tmp_path`/root)."""
    local = local or LocalSandbox()
    if start == "cold":
        try:
            yield local
        finally:
            local.close()
        return
    (tmp_path / "root").mkdir()
    warmed = WarmedLocal(local, tmp_path / "root")
    try:
        yield warmed
    finally:
        warmed.close()
