"""The sandbox interface: where a script worker's process runs, isolated from the host.

A backend is built by `floom.sandbox.get_sandbox(name, settings)`; one module per backend (local.py:
bubblewrap on this host, floom/sandbox/e2b/backend.py: E2B microVMs, fake.py: in-memory for tests).
tests/integration/sandbox/test_sandbox_contract.py runs one suite over every backend.
"""

from __future__ import annotations

import abc
import os
import re
import stat
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from floom.errors import FloomError, InvalidRequest
from floom.sandbox import env_names

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What a sandbox's environment variable may be called: a name every shell and program
can read."""
MAX_ENV_ENTRY_BYTES = env_names.MAX_ENTRY_BYTES
MAX_ENV_BYTES = 1024 * 1024
# How far floom looks into what a run left, whichever backend ran it (the host's walk of a
# run's dirs, engine/safefiles.py; the archive coming back from E2B): a worker can create
# millions of entries, and trees deeper than any path the host can open.
MAX_WALK_ENTRIES = 10_000
MAX_WALK_DEPTH = 32
"""What a sandbox's environment and command may hold in all: half of what the kernel lets a
program start with under the usual 8 MiB stack."""


class SandboxUnavailable(FloomError):
    """The sandbox backend cannot run a process now: not installed or not configured on this
    node, or its service unreachable, rate limited, out of quota or refusing floom's key.
    An attempt that meets it fails with this code and may be retried."""

    status = 503
    code = "sandbox_unavailable"

    def __init__(
        self,
        message: str | None = None,
        *,
        hint: str | None = None,
        details: Any = None,
        retryable: bool = True,
    ) -> None:
        super().__init__(message, hint=hint, details=details)
        # False when trying again cannot help (a setting or template is missing).
        self.retryable = retryable


LineSink = Callable[[str, str], None]
"""Called with (stream, line) for each line the process prints; stream is stdout or stderr."""


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to run one attempt of a script worker.

    `workdir` is a fresh directory that already holds the version's files and `inputs.json`;
    it becomes the process's working directory. With `files` (only for a backend whose
    `layers_files` is true), `workdir` holds `inputs.json` alone and the version's files
    are in `files`, floom's cached copy, shared by runs: the backend shows the process
    `workdir` laid over them, writes (also to a version file) landing in `workdir` only,
    and `files` is never changed. `output_dir` is a fresh, empty directory
    the process sees as `$FLOOM_OUTPUT_DIR`; files left there become artifacts. `env` is
    the whole environment the process gets (declared secrets and FLOOM_* values); a backend
    adds only PATH, HOME, LANG and similar inert values, never anything of the host's.
    With `network` the process reaches public addresses, and of the host's loopback, private,
    link-local and multicast ranges only the networks in `network_allow` (IPv4 CIDRs);
    without it, it has no network at all.
    The limits hold for the whole process tree: `memory_mb` (including tmpfs and shared
    memory it fills), `processes` (tasks at once), `cpu` (cores' worth of CPU time) and
    `disk_mb` (bytes allocated in `workdir` and `output_dir`). A backend that cannot enforce
    one says so in `protections()`.
    `metadata` names the run for the backend's own records (run, attempt, worker, version);
    a remote backend labels its sandbox with it, a local one ignores it. It never holds a
    secret. `template` is the image a remote backend starts from (empty: its default).
    `read_only` names files of `workdir` (floom's own, e.g. `state.json`) the process may
    read and must not change: the local backend binds each read-only over itself, cold or
    warm (a write, chmod, rename or delete fails). A remote backend whose process owns its
    files (E2B) cannot hold it to that; floom never reads them back either way.
    `warm` names the warm pool the run may start from: the version (worker.yml `warm: true`),
    or empty. A backend that keeps warm processes (the local one, for `python3 SCRIPT.py`
    without network) may start the run from a process made for that name alone, and starts
    it cold where none is ready; every other guarantee here holds either way.
    """

    run_id: str
    command: list[str]
    workdir: Path
    output_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    network: bool = False
    network_allow: tuple[str, ...] = ()
    timeout_seconds: float = 600.0
    memory_mb: int = 512
    processes: int = 256
    cpu: float = 1.0
    disk_mb: int = 1024
    metadata: dict[str, str] = field(default_factory=dict)
    template: str = ""
    files: Path | None = None
    # The attempt's lease, as the node's watchdog knows it (floom/sandbox/fence.py): a
    # backend that can names the sandbox's processes to it while they run. Empty: none.
    fence: str = ""
    warm: str = ""
    read_only: tuple[str, ...] = ()


def read_only_files(spec: SandboxSpec) -> list[str]:
    """The spec's read-only files that are in its work dir as regular files (a name with a
    slash, or a link, is not one floom wrote there: it is left alone)."""
    found = []
    for name in spec.read_only:
        if "/" in name or name in ("", ".", ".."):
            continue
        try:
            mode = os.lstat(spec.workdir / name).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISREG(mode):
            found.append(name)
    return found


@dataclass(frozen=True)
class SandboxResult:
    """How the process ended. `exit_code` is None when it was killed by a timeout or cancel.

    `limit_exceeded` names the resource limit that ended the run (`memory`, `processes`,
    `disk`, or what keeps the disk from being counted: `files`, `depth`, `unreadable`);
    `error` then says which limit it was and, where one does, the manifest key that sets it.
    """

    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None
    limit_exceeded: str | None = None


def describe_protections(protections: dict[str, bool | str]) -> str:
    """One line for the start-up banner: what is on, and what is not."""
    on = [name for name, value in protections.items() if value is True]
    off = [name for name, value in protections.items() if value is False]
    values = [
        f"{name} {value}"
        for name, value in protections.items()
        if isinstance(value, str) and name not in ("limits_not_enforced", "cgroup_problem")
    ]
    line = ", ".join([*on, *values])
    if off:
        line += f"; OFF: {', '.join(off)}"
    if protections.get("limits_not_enforced"):
        line += (
            f"; limits NOT enforced: {protections['limits_not_enforced']}"
            f" ({protections.get('cgroup_problem') or 'no usable cgroup'})"
        )
    return line


class StartedAhead(abc.ABC):
    """A sandbox started by `Sandbox.start_ahead`, its command not released yet. Exactly one
    of `run` and `discard` ends it; `discard` after `run` does nothing."""

    spec: SandboxSpec

    @abc.abstractmethod
    def run(self, *, on_line: LineSink, should_cancel: Callable[[], bool]) -> SandboxResult:
        """Release the command and supervise it as `Sandbox.run` does."""

    @abc.abstractmethod
    def discard(self) -> None:
        """End the sandbox, its command never run, and free what it holds."""


class Sandbox(abc.ABC):
    """A place to run processes in isolation.

    `run` runs one process in a fresh workspace: the files of `spec.workdir` and
    `spec.output_dir` as they are when it is called. It blocks until the process tree has
    ended, streaming each output line to `on_line` (from the calling thread) in the order it
    was printed per stream. It polls `should_cancel` at least every 200 ms; when it returns
    True, or the timeout passes, the whole process tree is killed before `run` returns (and
    whatever the backend created for it: a remote backend kills its sandbox within 1-2 s).

    After `run` returns, `result.json` and every file the process left in its working
    directory and in `$FLOOM_OUTPUT_DIR` are in the host paths `spec.workdir` and
    `spec.output_dir` (a remote backend downloads them, bounded by the settings' result,
    artifact and bundle sizes and refusing links, devices and paths that leave the dir;
    a local one binds the paths). The engine reads them with its own safe readers.

    `run` never raises for the process's own failures: a non-zero exit, a timeout, a cancel,
    a limit reached are all in the result. It raises InvalidRequest for a spec no backend
    can run (validate_spec), and SandboxUnavailable when the sandbox itself cannot start or
    its backend failed under it (unreachable, rate limited, out of quota, refusing floom's
    key); the attempt then fails with `sandbox_unavailable` and may be retried. Nothing
    else escapes it.
    """

    # Each backend names itself ("local", "e2b", "fake"), as a manifest's sandbox.backend does.
    name: ClassVar[str]

    @property
    def layers_files(self) -> bool:
        """Whether `run` takes the version's files read-only as `spec.files`, with
        `spec.workdir` a writable layer over them: no copy of the files per run. Default:
        no; `spec.workdir` must hold them."""
        return False

    @abc.abstractmethod
    def run(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult: ...

    def make_run_dir(self, path: Path, *, disk_mb: int) -> None:
        """Make the folder `path` (its parents as needed; it must not exist yet), in which
        the caller then makes a run's work and output dirs, side by side, for specs of this
        backend. A backend whose disk limit the kernel enforces mounts a filesystem of
        `disk_mb` MiB there (the local one as root): the run's writes to both dirs end at
        it with ENOSPC, and `run` reports the limit when the run filled it. Raises OSError.
        Default: a plain folder."""
        path.mkdir(parents=True)

    def release_run_dir(self, path: Path) -> None:  # noqa: B027 - optional hook
        """Let go of what `make_run_dir` put at `path` before the caller deletes it: what it
        holds is gone after this (read the run's files first); the folder stays. Called once
        the run dir's runs have ended; raises nothing. Default: nothing."""

    def discard_run_dir(self, path: Path, *, delete: Callable[[Path], None]) -> None:
        """Let go of the run dir `path` (as `release_run_dir`), then have `delete(path)`
        remove it: both off the caller's path where the backend can (the caller has read
        what it needs of the run's files). A `make_run_dir` of the same path waits until
        both are done, as does the backend's `close`. Raises nothing. Default: both now."""
        self.release_run_dir(path)
        delete(path)

    @property
    def starts_ahead(self) -> bool:
        """Whether `start_ahead` can start a sandbox ahead of its run. Default: no."""
        return False

    def start_ahead(self, spec: SandboxSpec) -> StartedAhead | None:
        """Start `spec`'s sandbox up to, not including, its command, which waits until the
        returned handle's `run` releases it (or `discard` ends the sandbox without it ever
        running): a run's sandbox then starts while the run's queueing transaction commits.
        None when this backend cannot (`starts_ahead`); raises as `run` does."""
        return None

    def open_session(self) -> SandboxSession:
        """A session: several commands in one workspace, for an agent's `run_command`.

        Opening one is cheap and creates nothing; the backend creates what it needs on the
        first command. Default: every command runs as its own `run` over the same host
        paths, which keeps the files between commands (the local and fake backends)."""
        return HostSession(self)

    def close(self) -> None:  # noqa: B027 - optional hook, default is a no-op
        """Let go of what the backend keeps ready between runs (the local backend's
        launchers and warm processes). Runs may still follow; they start as the first one
        did (cold)."""

    def check(self) -> None:  # noqa: B027 - optional hook, default is a no-op
        """Raise SandboxUnavailable with a hint when this backend cannot run on this node
        (not installed, not configured); cheap, and without starting a sandbox."""

    def protections(self) -> dict[str, bool | str]:
        """Which protections runs get on this node (for /healthz and the start line):
        True/False per protection, or a short value such as the cgroup version."""
        return {}

    def warm_stats(self) -> dict[str, Any] | None:
        """The backend's warm pools, for /healthz and /metrics: `enabled`, node-wide `hits`
        and `misses` (runs that found a warm process ready, runs that started cold), and
        `pools`, one dict per pool (worker, version, ready, running, hits, misses, modules,
        rss_bytes). None for a backend without warm starts."""
        return None

    def reap_orphans(
        self,
        *,
        node_id: str,
        work_root: Path,
        live_run_ids: Callable[[], Collection[str]],
    ) -> int:
        """Kill the sandboxes this node started for runs it no longer runs (a previous
        process of the node died before it could); returns how many it killed.

        Called at executor start (when no run is live, before the work root is emptied) and
        periodically. `live_run_ids` is called after the backend has listed its sandboxes,
        so a run that starts meanwhile is never taken for an orphan. A local backend finds
        its processes by their work dirs under `work_root`; a remote one by the node named
        in its sandboxes' metadata. Raises nothing: a backend it cannot reach is tried again
        on the next pass. Default: none to find."""
        return 0


class SandboxSession(abc.ABC):
    """Several commands in one workspace (one sandbox for a remote backend), then closed.

    Every spec given to one session names the same `run_id`, `workdir` and `output_dir`
    (InvalidRequest otherwise, or after `close`). Before each command, the workspace holds
    what the host paths hold (files written there since the last command included); after
    it returns, the host paths hold the whole workspace and output dir as the command left
    them, so `result.json`, artifacts and the agent's file tools see them. Files elsewhere
    in the sandbox (installed packages, /tmp) may persist between commands on a remote
    backend and do not on a local one. `run` behaves as `Sandbox.run` otherwise, and
    raises the same. A cancel or timeout ends the command, not necessarily the session.

    `close` ends everything the session created; it is idempotent, also called after a
    failure, and never raises. The workspace outlives it in the host paths.
    """

    @abc.abstractmethod
    def run(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SessionGuard:
    """The checks every session makes: one workspace per session, nothing after close."""

    def __init__(self) -> None:
        self.closed = False
        self.first: SandboxSpec | None = None

    def admit(self, spec: SandboxSpec) -> bool:
        """Check `spec` against the session; True for the session's first command."""
        if self.closed:
            raise InvalidRequest(
                "this sandbox session is closed", hint="open a new session to run more"
            )
        if self.first is None:
            self.first = spec
            return True
        first = self.first
        if (spec.run_id, spec.workdir, spec.output_dir) != (
            first.run_id,
            first.workdir,
            first.output_dir,
        ):
            raise InvalidRequest(
                "a sandbox session serves one run's workspace",
                hint="open a session per run and workspace",
            )
        return False


class HostSession(SandboxSession):
    """A session of a backend whose processes see the host paths themselves: each command
    is one `run` of the backend, and the files stay in the host paths in between."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.guard = SessionGuard()
        self.commands = 0

    def run(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult:
        self.guard.admit(spec)
        self.commands += 1
        return self.sandbox.run(spec, on_line=on_line, should_cancel=should_cancel)

    def close(self) -> None:
        self.guard.closed = True


def validate_spec(spec: SandboxSpec) -> None:
    """Refuse a spec no backend can run, with InvalidRequest; every backend calls it first."""
    if not spec.command:
        raise InvalidRequest(
            "the sandbox was given no command", hint="pass a command such as ['python3', 'run.py']"
        )
    if spec.timeout_seconds <= 0 or spec.memory_mb < 1:
        raise InvalidRequest(
            f"timeout_seconds ({spec.timeout_seconds}) and memory_mb ({spec.memory_mb}) "
            "must be positive",
            hint="set a timeout in seconds and a memory limit in MiB above zero",
        )
    dirs = [("workdir", spec.workdir), ("output_dir", spec.output_dir)]
    if spec.files is not None:
        dirs.append(("files", spec.files))
    for label, path in dirs:
        if not path.is_dir():
            raise InvalidRequest(
                f"{label} {path} is not a directory", hint="create it before running the sandbox"
            )
    total = sum(len(os.fsencode(arg)) + 1 for arg in spec.command)
    for key, value in spec.env.items():
        if not ENV_NAME.fullmatch(key) or "\0" in value:
            raise InvalidRequest(
                f"environment variable {key!r} cannot be passed to a process",
                hint="use a name of letters, digits and underscores that does not start "
                "with a digit, and a value without NUL",
            )
        # The last line of floom/sandbox/env_names.py's rule: secrets and worker.yml are checked
        # where they are named, a name stored before the rule is refused here.
        if (why := env_names.refusal(key)) and key not in env_names.RUN_VARIABLES:
            raise InvalidRequest(
                f"{why}; it cannot be in a sandbox's environment", hint=env_names.RENAME_HINT
            )
        entry = len(key) + 2 + len(os.fsencode(value))
        if entry > MAX_ENV_ENTRY_BYTES:
            raise InvalidRequest(
                f"environment variable {key} holds {entry} bytes, over the "
                f"{MAX_ENV_ENTRY_BYTES} a process's variable can hold",
                hint="pass large values as inputs or files, not as secrets",
            )
        total += entry
    if total > MAX_ENV_BYTES:
        raise InvalidRequest(
            f"the sandbox's environment and command hold {total} bytes, over {MAX_ENV_BYTES}",
            hint="pass large values as inputs or files, not as secrets",
        )
    if any("\0" in arg for arg in spec.command):
        raise InvalidRequest(
            "the sandbox's command holds a NUL character",
            hint="remove it from the command in worker.yml",
        )
