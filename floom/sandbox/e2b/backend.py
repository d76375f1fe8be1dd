"""The E2B backend: script workers run in E2B microVMs, through the official `e2b` SDK.

One sandbox per attempt (per agent run for `run_command`, through a session): created from
the worker's template with metadata naming the run and this node, the files go up as one
archive, the command's lines stream back as printed, and `result.json` with the output dir
come back as one archive, read as hostile. With FLOOM_E2B_WARM the sandbox may instead come
ready from a pool created ahead of runs (warm.py): created without anything of a run, handed
to this one alone and killed after it all the same. The SDK's own settings (E2B_DOMAIN, its API and
sandbox URLs, debug) choose the E2B deployment; floom passes only its key.
"""

from __future__ import annotations

import logging
import math
import shutil
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from e2b import (
    AuthenticationException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxQuery,
)
from e2b import (
    Sandbox as E2BBox,
)

from floom.sandbox.base import (
    LineSink,
    Sandbox,
    SandboxResult,
    SandboxSession,
    SandboxSpec,
    SandboxUnavailable,
    SessionGuard,
    validate_spec,
)
from floom.sandbox.e2b.command import HOME, OUTPUT_DIR, WORKDIR, E2BCommand
from floom.sandbox.e2b.transfer import (
    Snapshot,
    changed,
    decoded_body,
    move_file,
    pack,
    replace_tree,
    snapshot,
    unpack_hostile,
)
from floom.sandbox.e2b.warm import POOL_LABEL, BoxShape, WarmBoxes

# Re-exported: floom/sandbox/__init__.py builds it with the backend, in one lazy import.
from floom.sandbox.e2b.warm import E2BWarmSettings as E2BWarmSettings
from floom.sandbox.fence import lease_clock, node_fence

log = logging.getLogger("floom.sandbox.e2b")

KEY_SETTING = "FLOOM_E2B_API_KEY"
DEFAULT_TEMPLATE = "base"
INBOX = f"{HOME}/.floom-in.tar.gz"
OUTBOX = f"{HOME}/.floom-out.tar.gz"
UNPACK_FAILED = 198
"""How the command exits when it could not unpack the uploaded files (the inbox then stays:
a script's own exit 198 leaves none)."""
UNPACK = (
    f"{{ mkdir -p {WORKDIR} {OUTPUT_DIR} && tar -xzf {INBOX} -C {HOME} && rm -f {INBOX}; }}"
    f" || exit {UNPACK_FAILED}"
)
NODE_LABEL = "floom_node"
RUN_LABEL = "floom_run_id"
# The sandbox lives this much past the run's timeout, for the files to go up and come back;
# E2B kills it then even if floom could not.
SANDBOX_SLACK_SECONDS = 120
REQUEST_TIMEOUT = 30.0
# How often a session moves its sandbox's E2B timeout on with its attempt's lease.
LEASE_KEEP_SECONDS = 1.0
KILL_TIMEOUT = 5.0
COLLECT_MIN_SECONDS = REQUEST_TIMEOUT * 4
"""Bringing back the run's files gets the rest of its timeout, and this long at least; a
sandbox that makes it take longer (an envd answering a byte at a time) ends the run as
timed out."""
KEY_HINT = f"set {KEY_SETTING} (or E2B_API_KEY) in the environment of the floom server"


@dataclass(frozen=True)
class Budgets:
    """How many bytes may come back from a sandbox: a script run's result and artifacts;
    a session's whole workspace too."""

    result_bytes: int
    artifact_bytes: int
    bundle_bytes: int


class E2BSandbox(Sandbox):
    """Runs each process in an E2B sandbox; see the module docstring. Without an API key it
    is built but not ready: `check` and every run raise SandboxUnavailable naming the
    setting."""

    name = "e2b"

    def __init__(
        self,
        *,
        api_key: str,
        template: str,
        budgets: Budgets,
        warm: E2BWarmSettings | None = None,
    ) -> None:
        self.api_key = api_key
        self.template = template or DEFAULT_TEMPLATE
        self.budgets = budgets
        # Sandboxes created ahead of runs (floom/sandbox/e2b/warm.py), with FLOOM_E2B_WARM.
        self.warm: WarmBoxes | None = None
        if warm is not None and warm.count > 0 and api_key:
            self.warm = WarmBoxes(warm, create=self._create_ready, kill=self._kill_ready)

    def check(self) -> None:
        if not self.api_key:
            raise SandboxUnavailable(
                f"the e2b sandbox is not configured: {KEY_SETTING} is not set",
                hint=KEY_HINT,
                retryable=False,
            )

    def protections(self) -> dict[str, bool | str]:
        return {
            "microvm": True,
            "template": self.template,
            "memory_limit": "template",
            "cpu_limit": "template",
            "process_limit": False,
            "disk_limit": "template",
            "network": "off unless network: full (then the internet, not floom's host)",
        }

    def run(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult:
        with E2BSession(self, whole_workspace=False) as session:
            return session.run(spec, on_line=on_line, should_cancel=should_cancel)

    def open_session(self) -> SandboxSession:
        return E2BSession(self, whole_workspace=True)

    def close(self) -> None:
        if self.warm is not None:
            self.warm.close()

    def warm_stats(self) -> dict[str, Any] | None:
        """The warm pools of E2B sandboxes (warm.py's `stats`); None with them off."""
        return None if self.warm is None else self.warm.stats()

    def _create_ready(self, shape: BoxShape, timeout: int, metadata: dict[str, str]) -> E2BBox:
        # Nothing of a run: no environment, no files; only the node and pool in metadata.
        return E2BBox.create(
            template=shape.template,
            timeout=timeout,
            metadata=metadata,
            allow_internet_access=shape.network,
            **self.api(),
        )

    def _kill_ready(self, box: E2BBox) -> bool:
        return bool(box.kill(request_timeout=KILL_TIMEOUT))

    def api(self) -> dict[str, Any]:
        """The SDK's per-call options: floom's key, bounded requests; the SDK's own settings
        (E2B_DOMAIN, E2B_API_URL, E2B_SANDBOX_URL) pick the deployment."""
        return {"api_key": self.api_key, "request_timeout": REQUEST_TIMEOUT}

    def reap_orphans(
        self,
        *,
        node_id: str,
        work_root: Path,
        live_run_ids: Callable[[], Collection[str]],
    ) -> int:
        if not self.api_key:
            return 0
        try:
            pages = E2BBox.list(query=SandboxQuery(metadata={NODE_LABEL: node_id}), **self.api())
            found = []
            while pages.has_next:
                found += pages.next_items()
            live = set(live_run_ids()) if found else set()
            killed = 0
            for info in found:
                if POOL_LABEL in info.metadata:
                    # Made ahead of runs: this process's pools keep theirs; any other's
                    # (a process of this node that died) is an orphan, run or not.
                    orphan = self.warm is None or not self.warm.keeps(
                        info.sandbox_id, info.metadata
                    )
                else:
                    orphan = info.metadata.get(RUN_LABEL) not in live
                if orphan:
                    killed += bool(E2BBox.kill(info.sandbox_id, **self.api()))
            return killed
        except Exception as exc:  # E2B down: the next pass tries again
            log.warning("could not reap orphaned E2B sandboxes: %s", self.unavailable(exc))
            return 0

    def unavailable(self, exc: BaseException, *, doing: str = "") -> SandboxUnavailable:
        """E2B's failure as floom's error, saying what to check; never with the key."""
        text = str(exc).replace(self.api_key, "***") if self.api_key else str(exc)
        text = text.strip()[:300] or type(exc).__name__
        where = f" while {doing}" if doing else ""
        if isinstance(exc, AuthenticationException):
            return SandboxUnavailable(f"E2B refused floom's API key{where}", hint=KEY_HINT)
        if isinstance(exc, RateLimitException) or "429" in text:
            if "concurrent" in text:
                return SandboxUnavailable(
                    f"E2B's limit of concurrent sandboxes is reached{where}",
                    hint="wait for running sandboxes to end, lower FLOOM_EXECUTOR_SLOTS, or "
                    "raise the limit of your E2B plan; floom retries the run",
                )
            return SandboxUnavailable(
                f"E2B rate limited floom{where}", hint="floom retries the run; run fewer at once"
            )
        if isinstance(exc, SandboxException) and "template" in text and "not found" in text:
            return SandboxUnavailable(
                f"E2B has no template {self.template!r}{where}: {text}",
                hint="build the template (e2b template build) or fix sandbox.template in "
                "worker.yml / FLOOM_E2B_TEMPLATE",
                retryable=False,
            )
        if isinstance(exc, httpx.TransportError):
            return SandboxUnavailable(
                f"E2B cannot be reached{where}: {text}",
                hint="check this node's network and E2B_DOMAIN (or E2B_API_URL); floom "
                "retries the run",
            )
        return SandboxUnavailable(
            f"E2B failed{where}: {text}", hint="check E2B's status page; floom retries the run"
        )


class E2BSession(SandboxSession):
    """One E2B sandbox, created on the first command and killed on close. A script run is a
    one-command session that brings back `result.json` and the output dir; an agent's
    session brings back the whole workspace after each command."""

    def __init__(self, backend: E2BSandbox, *, whole_workspace: bool) -> None:
        self.backend = backend
        self.whole_workspace = whole_workspace
        self.guard = SessionGuard()
        self.box: E2BBox | None = None
        self.synced: Snapshot = {}
        self.lock = threading.Lock()
        self.keeper: LeaseKeeper | None = None
        # Whether the sandbox came ready from the backend's warm pool (told when it ends).
        self.warm = False

    def run(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult:
        first = self.guard.admit(spec)
        validate_spec(spec)
        self.backend.check()
        deadline = time.monotonic() + spec.timeout_seconds
        trees = {"work": spec.workdir, "output": spec.output_dir}
        doing = "creating the sandbox"
        try:
            if first:
                asked = lease_clock()
                self.box, timeout = self._create(spec)
                if spec.fence:
                    # E2B's clock starts when it gets the request: no earlier than `asked`.
                    self.keeper = LeaseKeeper(self.box, spec.fence, ends=asked + timeout)
            box = self.box
            if box is None:
                raise SandboxUnavailable("this E2B session's sandbox is gone")
            doing = "uploading the run's files"
            uploaded = first or changed(trees, self.synced)
            if uploaded:
                self._upload(box, trees, since=None if first else self.synced)
            doing = "running the command"
            # The command unpacks what was uploaded itself: no round trip and process of its own.
            command = E2BCommand(box, spec, on_line, unpack=UNPACK if uploaded else "")
            result = command.wait(should_cancel, deadline)
            if uploaded and result.exit_code == UNPACK_FAILED and box.files.exists(INBOX):
                doing = "unpacking the run's files"
                raise SandboxUnavailable(
                    f"the run's files could not be unpacked in E2B sandbox {box.sandbox_id} "
                    "(its disk full, or its template without tar?)",
                    hint="check the template's disk size and that it has tar; floom retries "
                    "the run",
                )
            if result.cancelled or result.timed_out:
                return result
            doing = "bringing back the run's files"
            until = max(deadline, time.monotonic() + COLLECT_MIN_SECONDS)
            return self._download(box, spec, result, on_line, until=until)
        except SandboxUnavailable:
            raise
        except Exception as exc:  # an SDK or transport failure of E2B, not of the script
            raise self.backend.unavailable(exc, doing=doing) from exc

    def _create(self, spec: SandboxSpec) -> tuple[E2BBox, int]:
        """The run's sandbox and the E2B timeout (seconds) it was given."""
        template = spec.template or self.backend.template
        timeout = math.ceil(spec.timeout_seconds) + SANDBOX_SLACK_SECONDS
        left = _lease_left(spec.fence)
        if left is not None:
            # E2B ends it with the attempt's lease unless the lease is renewed (LeaseKeeper).
            timeout = min(timeout, left)
        warm, node = self.backend.warm, spec.metadata.get(NODE_LABEL, "")
        if warm is not None and node:
            box = warm.take(BoxShape(template, spec.network, node), timeout=timeout)
            if box is not None:
                self.warm = True
                return box, timeout
        try:
            box = E2BBox.create(
                template=template,
                timeout=timeout,
                metadata=dict(spec.metadata),
                allow_internet_access=spec.network,
                **self.backend.api(),
            )
            return box, timeout
        except Exception as exc:
            if isinstance(exc, SandboxException) and "not found" in str(exc):
                raise SandboxUnavailable(
                    f"E2B has no template {template!r}: {exc}",
                    hint="build the template (e2b template build) or fix sandbox.template "
                    "in worker.yml / FLOOM_E2B_TEMPLATE",
                    retryable=False,
                ) from exc
            raise

    def _upload(self, box: E2BBox, trees: dict[str, Path], *, since: Snapshot | None) -> None:
        # One archive, whatever the number of files; the command unpacks it (UNPACK).
        data, self.synced = pack(trees, since=since)
        box.files.write(INBOX, data, request_timeout=REQUEST_TIMEOUT * 4)

    def _download(
        self,
        box: E2BBox,
        spec: SandboxSpec,
        result: SandboxResult,
        on_line: LineSink,
        *,
        until: float,
    ) -> SandboxResult:
        budgets = self.backend.budgets
        if self.whole_workspace:
            paths = "set -- work output"
            budget = budgets.bundle_bytes + budgets.artifact_bytes
        else:
            paths = "set -- output; [ -f work/result.json ] && set -- output work/result.json"
            budget = budgets.result_bytes + budgets.artifact_bytes
        box.commands.run(
            f'cd {HOME} && rm -f {OUTBOX} && {paths}; tar -czf {OUTBOX} "$@" 2>/dev/null; true',
            cwd=HOME,
            timeout=max(1, math.ceil(until - time.monotonic())),
            retain_output=False,  # nothing is read of it, and the sandbox's tar may be anything
        )
        try:
            data = _read_bounded(box, OUTBOX, limit=budget + 1024 * 1024, until=until)
        except _TooSlow:
            return SandboxResult(
                exit_code=None,
                timed_out=True,
                error=f"timed out bringing back the run's files from E2B sandbox "
                f"{box.sandbox_id}: they did not come back within the run's timeout "
                f"({spec.timeout_seconds:g} s, {COLLECT_MIN_SECONDS:g} s at least)",
            )
        if data is None:
            return _files_over(result, budget)
        landing = spec.workdir.parent / f".e2b-{spec.workdir.name}-{id(self):x}"
        unpacked = unpack_hostile(data, into=landing, names=("work", "output"), budget=budget)
        try:
            for note in unpacked.notes:
                on_line("stderr", f"floom: {note}")
            if unpacked.over_budget:
                return _files_over(result, budget)
            replace_tree(spec.output_dir, unpacked.trees["output"])
            if self.whole_workspace:
                replace_tree(spec.workdir, unpacked.trees["work"])
            elif (unpacked.trees["work"] / "result.json").is_file():
                move_file(unpacked.trees["work"] / "result.json", spec.workdir / "result.json")
        finally:
            shutil.rmtree(landing, ignore_errors=True)  # whatever was not moved into place
        if self.whole_workspace:
            self.synced = snapshot({"work": spec.workdir, "output": spec.output_dir})
        return result

    def close(self) -> None:
        with self.lock:
            self.guard.closed = True
            box, self.box = self.box, None
            keeper, self.keeper = self.keeper, None
        if keeper is not None:
            keeper.stop()
        if box is None:
            return
        killed = False
        try:
            box.kill(request_timeout=KILL_TIMEOUT)
            killed = True
        except Exception as exc:  # E2B ends it at its timeout; the orphan reaper retries
            log.warning("could not kill E2B sandbox %s: %s", box.sandbox_id, exc)
        if self.warm and self.backend.warm is not None:
            self.backend.warm.done(box, killed=killed)


def _lease_left(fence: str) -> int | None:
    """Whole seconds until the attempt's lease deadline (at least 1), None without one."""
    deadline = node_fence().deadline(fence) if fence else None
    if deadline is None:
        return None
    return max(1, math.floor(deadline - lease_clock()))


class LeaseKeeper:
    """Keeps an E2B sandbox's timeout at its attempt's lease deadline, moving it on as the
    executor renews the lease (floom/sandbox/fence.py). When floom's process is frozen or
    cut off from the database, the deadline stops moving and E2B itself ends the sandbox at
    it (later by the latency of the last request at most): the SDK cannot be called from a
    frozen process, so this is the one kill that does not need floom."""

    def __init__(self, box: E2BBox, fence: str, *, ends: float) -> None:
        self._box = box
        self._fence = fence
        self._stopped = threading.Event()
        # When E2B ends the sandbox (lease_clock), as last asked: the timeout is whole seconds
        # rounded down, so this is up to a second before the lease's deadline.
        self._ends = ends
        self._thread = threading.Thread(target=self._keep, name="floom-e2b-lease", daemon=True)
        self._thread.start()

    def _next_pass(self) -> float:
        # Well before E2B's end: a short lease (whole seconds, rounded down) leaves little.
        left = self._ends - lease_clock()
        return min(LEASE_KEEP_SECONDS, max(0.05, left / 3))

    def _keep(self) -> None:
        while not self._stopped.wait(self._next_pass()):
            fence = node_fence()
            deadline = fence.deadline(self._fence)
            if deadline is None or fence.lapsed(self._fence):
                continue  # E2B ends it at the deadline it was given last
            if deadline - self._ends < 1.0:
                continue  # the lease has not moved a whole second past E2B's end
            asked = lease_clock()
            seconds = max(1, math.floor(deadline - asked))
            try:
                self._box.set_timeout(seconds, request_timeout=KILL_TIMEOUT)
                self._ends = asked + seconds
            except Exception as exc:  # the next pass tries again; E2B keeps the last one
                log.warning("could not move the E2B sandbox's timeout on: %s", exc)

    def stop(self) -> None:
        self._stopped.set()


class _TooSlow(Exception):
    """Raised by `_read_bounded` when the file is still coming at its deadline."""


def _read_bounded(box: E2BBox, path: str, *, limit: int, until: float) -> bytes | None:
    """The file's bytes, or None when it is over `limit` (read no further than that).
    Raises _TooSlow when it is still coming at `until` (a wait for the next bytes ends a
    request's timeout past it at most)."""
    chunks: list[bytes] = []
    size = 0
    wait = min(REQUEST_TIMEOUT * 4, max(1.0, until - time.monotonic()))
    try:
        stream = box.files.read(path, format="stream", request_timeout=wait)
    except NotFoundException:
        return b""  # tar made nothing: nothing came back
    with stream:
        # The reader's own iteration decodes each chunk whole (transfer.decoded_body).
        response = stream._response
        raw = response.iter_raw()
        for chunk in decoded_body(response.headers.get("content-encoding", ""), raw):
            size += len(chunk)
            if size > limit:
                return None
            if time.monotonic() > until:
                raise _TooSlow
            chunks.append(chunk)
    return b"".join(chunks)


def _files_over(result: SandboxResult, budget: int) -> SandboxResult:
    return SandboxResult(
        exit_code=result.exit_code,
        limit_exceeded="files",
        error=f"the files the run left are over {budget} bytes, more than floom brings back "
        "from E2B (FLOOM_MAX_RESULT_BYTES + FLOOM_MAX_ARTIFACT_BYTES)",
    )
