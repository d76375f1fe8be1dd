"""An in-memory sandbox for engine and agent tests: programs are Python callables, run in
the calling thread, with no process, namespace or isolation of any kind.

It keeps the Sandbox contract (lines in order, cancel and timeout end the run, the files a
program writes are in the host paths when `run` returns), so the engine above it cannot tell
the difference. It isolates nothing and is never a backend a server can be configured with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from floom.sandbox.base import (
    HostSession,
    LineSink,
    Sandbox,
    SandboxResult,
    SandboxSession,
    SandboxSpec,
    validate_spec,
)

SANDBOX_OUTPUT_DIR = "/output"


class _Ended(Exception):
    """Raised inside a program when its run was cancelled or timed out."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


@dataclass
class FakeProcess:
    """What a fake program sees: its spec, and cooperative stand-ins for a process's acts."""

    spec: SandboxSpec
    on_line: LineSink
    should_cancel: Callable[[], bool]
    deadline: float
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.env = {**self.spec.env, "FLOOM_OUTPUT_DIR": SANDBOX_OUTPUT_DIR}

    def print(self, line: str, *, stream: str = "stdout") -> None:
        self.checkpoint()
        self.on_line(stream, line)

    def write(self, name: str, data: str | bytes) -> Path:
        """Write a file in the working directory (`result.json`, say)."""
        return _write(self.spec.workdir / name, data)

    def write_output(self, name: str, data: str | bytes) -> Path:
        """Write a file under $FLOOM_OUTPUT_DIR: it becomes an artifact."""
        return _write(self.spec.output_dir / name, data)

    def sleep(self, seconds: float) -> None:
        """Wait as a process would, ending the program early on cancel or timeout."""
        until = time.monotonic() + seconds
        while True:
            self.checkpoint()
            left = until - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.02))

    def checkpoint(self) -> None:
        if time.monotonic() >= self.deadline:
            raise _Ended("timed_out")
        if self.should_cancel():
            raise _Ended("cancelled")


FakeProgram = Callable[[FakeProcess], int]
"""A program: returns the exit code; raising anything else is exit code 1 with the
exception's text as its last stderr line."""


class FakeSandbox(Sandbox):
    """Runs `programs[key]`, where key is the run's worker (`FLOOM_WORKER`) if a program is
    registered under it, else the command's last word (`run.py`)."""

    name = "fake"

    def __init__(self, programs: Mapping[str, FakeProgram] | None = None) -> None:
        self.programs = dict(programs or {})
        self.specs: list[SandboxSpec] = []  # every spec run, for tests to inspect
        self.sessions: list[HostSession] = []  # every session opened, for tests to inspect

    def open_session(self) -> SandboxSession:
        # The files stay in the host paths between commands, as the contract asks.
        session = HostSession(self)
        self.sessions.append(session)
        return session

    def run(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult:
        validate_spec(spec)
        self.specs.append(spec)
        program = self.programs.get(spec.env.get("FLOOM_WORKER", "")) or self.programs.get(
            spec.command[-1]
        )
        if program is None:
            on_line("stderr", f"fake sandbox: no program for {spec.command!r}")
            return SandboxResult(exit_code=127)
        process = FakeProcess(
            spec,
            on_line,
            should_cancel,
            deadline=time.monotonic() + spec.timeout_seconds,
        )
        try:
            return SandboxResult(exit_code=program(process))
        except _Ended as ended:
            if ended.outcome == "timed_out":
                return SandboxResult(
                    exit_code=None,
                    timed_out=True,
                    error=f"timed out after {spec.timeout_seconds:g} s",
                )
            return SandboxResult(exit_code=None, cancelled=True, error="cancelled")
        except Exception as exc:  # a failing program is a failing process, not a broken sandbox
            on_line("stderr", f"{type(exc).__name__}: {exc}")
            return SandboxResult(exit_code=1)


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path
