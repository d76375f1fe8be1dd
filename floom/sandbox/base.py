"""The sandbox interface: where a script worker's process runs, isolated from the host."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from floom.errors import FloomError, InvalidRequest


class SandboxUnavailable(FloomError):
    """The sandbox backend cannot run on this machine."""

    status = 503
    code = "sandbox_unavailable"


LineSink = Callable[[str, str], None]
"""Called with (stream, line) for each line the process prints; stream is stdout or stderr."""


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to run one attempt of a script worker.

    `workdir` is a fresh directory that already holds the version's files and `inputs.json`;
    it becomes the process's working directory. `output_dir` is a fresh, empty directory
    the process sees as `$FLOOM_OUTPUT_DIR`; files left there become artifacts. `env` is
    the whole environment the process gets (declared secrets and FLOOM_* values); a backend
    adds only PATH, HOME, LANG and similar inert values, never anything of the host's.
    With `network` the process reaches public addresses, and of the host's loopback, private,
    link-local and multicast ranges only the networks in `network_allow` (IPv4 CIDRs);
    without it, it has no network at all.
    The limits hold for the whole process tree: `memory_mb` (including tmpfs and shared
    memory it fills), `processes` (tasks at once), `cpu` (cores' worth of CPU time) and
    `disk_mb` (bytes allocated in `workdir` and `output_dir`).
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


@dataclass(frozen=True)
class SandboxResult:
    """How the process ended. `exit_code` is None when it was killed by a timeout or cancel.

    `limit_exceeded` names the resource limit that ended the run (`memory`, `processes`,
    `disk`, `files`); `error` then says which limit it was and the manifest key that sets
    it.
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


class Sandbox(abc.ABC):
    """A place to run one process in isolation.

    `run` blocks until the process tree has ended, streaming each output line to `on_line`
    in the order it was printed per stream. It polls `should_cancel` at least every 200 ms;
    when it returns True, or the timeout passes, the whole process tree is killed before
    `run` returns. `run` never raises for the process's own failures (they are in the
    result); it raises FloomError only when the sandbox itself cannot start.
    """

    name: str = "base"

    @abc.abstractmethod
    def run(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult: ...

    def check(self) -> None:  # noqa: B027 - optional hook, default is a no-op
        """Raise FloomError with a hint when this backend cannot run on this machine."""

    def protections(self) -> dict[str, bool | str]:
        """Which protections runs get on this node (for /healthz and the start line):
        True/False per protection, or a short value such as the cgroup version."""
        return {}

    def kill_orphans(self, work_root: Path) -> int:
        """Kill sandboxes a previous process of this node left running on work dirs under
        `work_root` (it died before it could); returns how many processes it killed. Called
        at executor start, before the work root is emptied. Default: none to find."""
        return 0


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
    for label, path in (("workdir", spec.workdir), ("output_dir", spec.output_dir)):
        if not path.is_dir():
            raise InvalidRequest(
                f"{label} {path} is not a directory", hint="create it before running the sandbox"
            )
    for key, value in spec.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidRequest(
                f"environment variable {key!r} cannot be passed to a process",
                hint="use a name without '=' or NUL characters, and a value without NUL",
            )
