"""The floor every bench figure is a ratio to: bubblewrap running workers/hello's `python3 run.py`
with floom's own flags, started with a plain `subprocess.Popen`.

The command line is not replicated here: it is the launch floom's LocalSandbox makes,
recorded while LocalSandbox runs the same spec once (that first run is also the slot's
warm-up), then replayed with fresh file descriptors: the launcher started, the run's binds
made in its mount namespace from this process as floom makes them (floom/sandbox/local/ns_mount.py),
and the launcher fed its script. So the floor has floom's stage (the launcher's mount
namespace, the run's binds and setpriv when floom runs as root), the shell's ulimits, the
namespaces, binds, tmpfs sizes and seccomp filter, and lacks only what floom does around the
process: starting the launcher ahead in its cgroup, the per-run cgroup, the supervisor
reading lines, the work dir, the database and the HTTP API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from floom.sandbox.base import SandboxSpec
from floom.sandbox.local import seccomp
from floom.sandbox.local.backend import LocalSandbox
from floom.sandbox.local.ns_mount import Mount, NamespaceMounter, PendingMounts
from floom.sandbox.local.standby import READY, Launcher, launcher_script, memory_file

REPO = Path(__file__).resolve().parent.parent
HELLO = REPO / "workers" / "hello"
HELLO_MEMORY_MB = 256  # limits.memory_mb of workers/hello/worker.yml
HELLO_TIMEOUT_SECONDS = 30.0
RUN_DEADLINE_SECONDS = 30.0
HELLO_INPUTS = {"name": "bench", "times": 1}
RUN_ENV = {
    "FLOOM_RUN_ID": "run_bench",
    "FLOOM_ATTEMPT": "1",
    "FLOOM_WORKER": "hello",
    "FLOOM_VERSION_ID": "ver_bench",
}
# The argv options whose value is a file descriptor floom passed to the child.
FD_OPTIONS = ("--info-fd", "--block-fd", "--seccomp", "--ro-bind-data")

_record_lock = threading.Lock()
_MOUNTER = NamespaceMounter()


@dataclass
class Launch:
    """What floom started one sandbox with: the launcher's own command line (the mount
    namespace it made ahead of the run, when root), the mounts floom made in that namespace
    from its own process, the stage's shell lines, bubblewrap's command line, what the
    sandbox's entry shell reads on its stdin (the run's environment and command), and the
    sandbox's /etc/resolv.conf."""

    launcher: list[str]
    mounts: tuple[Mount, ...]
    prelude: str
    argv: list[str]
    command_input: bytes
    resolv_conf: bytes


@contextmanager
def _recording_launches(seen: list[Launch]) -> Iterator[None]:
    """Record each sandbox launch meanwhile (floom/sandbox/local/standby.py): the lines a run
    sends its launcher ahead (`begin`) and the rest (`start`), as one prelude."""
    real_begin, real_start = Launcher.begin, Launcher.start
    real_mount = NamespaceMounter.start
    sent_ahead: dict[int, str] = {}
    mounted: dict[int, tuple[Mount, ...]] = {}

    def recording_mount(
        mounter: NamespaceMounter, pid: int, mounts: tuple[Mount, ...]
    ) -> PendingMounts:
        pending = real_mount(mounter, pid, mounts)
        made = pending.wait()
        mounted[pid] = tuple(mount for mount, done in zip(mounts, made, strict=True) if done)
        return pending

    def recording_begin(launcher: Launcher, prelude: str) -> None:
        sent_ahead[id(launcher)] = prelude
        real_begin(launcher, prelude)

    def recording_start(
        launcher: Launcher,
        argv: Sequence[str],
        command_input: bytes,
        *,
        resolv_conf: bytes,
        prelude: str = "",
    ) -> None:
        args = [str(a) for a in launcher.proc.args]  # type: ignore[union-attr]
        whole = sent_ahead.pop(id(launcher), "") + prelude
        mounts = mounted.pop(launcher.proc.pid, ())
        argv = [str(a) for a in argv]
        seen.append(Launch(args, mounts, whole, argv, command_input, resolv_conf))
        real_start(launcher, argv, command_input, resolv_conf=resolv_conf, prelude=prelude)

    with (
        _record_lock,
        mock.patch.object(Launcher, "begin", recording_begin),
        mock.patch.object(Launcher, "start", recording_start),
        mock.patch.object(NamespaceMounter, "start", recording_mount),
    ):
        yield


class FloorSlot:
    """One private copy of workers/hello (or another worker) plus an output dir, reused by
    one loop."""

    def __init__(
        self, root: Path, name: str, sandbox: LocalSandbox | None = None, *, worker: Path = HELLO
    ) -> None:
        """`worker`: the folder to run (workers/hello; any whose run.py greets as hello does)."""
        base = root / name
        self.workdir = base / "work"
        self.output_dir = base / "output"
        shutil.copytree(worker, self.workdir)
        self.output_dir.mkdir(parents=True)
        (self.workdir / "inputs.json").write_text(json.dumps(HELLO_INPUTS))
        own = sandbox is None
        recorder = sandbox or LocalSandbox()
        try:
            self.launch = self._record(recorder)
        finally:
            if own:
                recorder.close()  # its launchers: the floor starts its own
        self.argv = self.launch.argv

    def _record(self, sandbox: LocalSandbox) -> Launch:
        spec = SandboxSpec(
            run_id="run_bench",
            command=["python3", "run.py"],
            workdir=self.workdir,
            output_dir=self.output_dir,
            env=dict(RUN_ENV),
            network=False,
            timeout_seconds=HELLO_TIMEOUT_SECONDS,
            memory_mb=HELLO_MEMORY_MB,
        )
        seen: list[Launch] = []
        _await_standby(sandbox)
        with _recording_launches(seen):
            result = sandbox.run(spec, on_line=lambda _s, _l: None, should_cancel=lambda: False)
        if result.exit_code != 0 or not seen:
            raise RuntimeError(f"floom's sandbox could not run hello: {result}")
        self._check_result()
        launch = seen[-1]
        if "--bind" in launch.prelude:
            # Replayed, it would exec mount(8) twice on every floor run.
            raise RuntimeError("the recorded launch mounted its stage from its script")
        return launch

    def _check_result(self) -> None:
        report = json.loads((self.workdir / "result.json").read_text())
        if report["outputs"]["greeting"] != "Hello, bench!":
            raise RuntimeError(f"floor run gave unexpected outputs: {report}")

    def describe(self) -> str:
        """The recorded command line, file descriptors shown as N."""
        shown = list(self.argv)
        for i, arg in enumerate(shown[:-1]):
            if arg in FD_OPTIONS:
                shown[i + 1] = "N"
        return " ".join(shown)

    def run_once(self) -> float:
        """Seconds of one sandboxed `python3 run.py`; raises if the script did not succeed."""
        (self.workdir / "result.json").unlink(missing_ok=True)
        info_r, info_w = os.pipe()
        release_r, release_w = os.pipe()
        os.close(release_w)  # --block-fd: nothing to wait for, EOF releases the command
        filter_fd = os.memfd_create("floor-seccomp")
        os.write(filter_fd, seccomp.deny_filter())
        os.lseek(filter_fd, 0, os.SEEK_SET)
        resolv_r, resolv_w = os.pipe()
        os.write(resolv_w, self.launch.resolv_conf)
        os.close(resolv_w)
        input_fd = memory_file(self.launch.command_input)
        fds = {
            "--info-fd": info_w,
            "--block-fd": release_r,
            "--seccomp": filter_fd,
            "--ro-bind-data": resolv_r,
        }
        argv = list(self.argv)
        for i, arg in enumerate(argv[:-1]):
            if arg in fds:
                argv[i + 1] = str(fds[arg])
        # The launcher started and fed in one go, as floom's would be without a standby.
        stdin = f"/proc/{os.getpid()}/fd/{input_fd}"
        script = launcher_script(argv, stdin=stdin, prelude=self.launch.prelude)
        try:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                self.launch.launcher,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},
                start_new_session=True,
                pass_fds=tuple(fds.values()),
            )
            try:
                if self.launch.mounts:
                    _wait_for_own_namespace(proc.pid)
                    made = _MOUNTER.start(proc.pid, self.launch.mounts).wait()
                    if not all(made):
                        raise RuntimeError(f"floor run: the stage's mounts failed: {made}")
                _, stderr = proc.communicate(script, timeout=RUN_DEADLINE_SECONDS)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            elapsed = time.perf_counter() - t0
        finally:
            for fd in (info_r, input_fd, *fds.values()):
                os.close(fd)
        if proc.returncode != 0:
            raise RuntimeError(f"floor run failed ({proc.returncode}): {stderr[-400:]!r}")
        self._check_result()
        return elapsed


def _await_standby(sandbox: LocalSandbox) -> None:
    """Until `sandbox`'s launchers wait ready, each in a mount namespace of its own where
    floom's have one, as a serving node's do (started ahead of their runs). A launcher started
    on the spot for the run being recorded may not have made its namespace yet when floom
    mounts the run's stage: its script then execs mount(8) for the stage instead, which the
    recorded launch, replayed on every floor and Celery run, would repeat."""

    def ready(launcher: Launcher) -> bool:
        if not sandbox.layers_files:  # floom's own uid: plain shells, no namespace of their own
            return launcher.alive()
        return _has_own_mount_namespace(launcher.proc.pid)

    sandbox.standby.replenish()
    deadline = time.monotonic() + RUN_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        waiting = sandbox.standby.waiting()
        if len(waiting) >= READY and all(ready(launcher) for launcher in waiting):
            return
        time.sleep(0.005)
    raise RuntimeError("floom's sandbox launchers did not get ready")


def _wait_for_own_namespace(pid: int) -> None:
    """Until the launcher `pid` has made its mount namespace (floom's launchers have, being
    started ahead); polled with sleeps, so the wait costs the floor no CPU."""
    deadline = time.monotonic() + RUN_DEADLINE_SECONDS
    while not _has_own_mount_namespace(pid):
        if time.monotonic() > deadline:
            raise RuntimeError("floor run: the launcher made no mount namespace")
        time.sleep(0.0002)


def _has_own_mount_namespace(pid: int) -> bool:
    """Whether process `pid` is in a mount namespace other than this process's (False once it
    has ended)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    except OSError:
        return False
