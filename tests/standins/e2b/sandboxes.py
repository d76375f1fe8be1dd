"""The stand-in's sandboxes: each one a host directory serving the sandbox's /home/user, and
its commands run through floom's own LocalSandbox (bubblewrap) so the stand-in is isolated.

Inside bubblewrap the LocalSandbox binds the sandbox's directory at /work, so the stand-in
rewrites the E2B path /home/user to /work in a command's argv, cwd and environment values
(see README.md). Only /home/user persists between commands: /tmp is private to each one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shutil
import string
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from floom.sandbox.base import SandboxSpec
from floom.sandbox.env_names import RUN_VARIABLES, refusal
from floom.sandbox.local.backend import LocalSandbox

HOME = "/home/user"
BWRAP_HOME = "/work"  # where LocalSandbox binds its workdir
_HOME_PREFIX = re.compile(r"/home/user(?![\w.-])")
_ID_ALPHABET = string.ascii_lowercase + string.digits


def new_sandbox_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))


def to_bwrap(text: str) -> str:
    """An E2B path (or a command line holding some) as the LocalSandbox process sees it."""
    return _HOME_PREFIX.sub(BWRAP_HOME, text)


class PathOutsideHome(ValueError):
    """The stand-in only serves paths under /home/user."""


@dataclass
class Event:
    """One thing a process stream reports: data, end, failed (stand-in error) or abort
    (the connection drops: envd died or the sandbox was killed)."""

    kind: str
    stream: str = ""
    data: bytes = b""
    exit_code: int = 0
    exited: bool = True
    status: str = ""
    error: str | None = None


ABORT = Event("abort")


class RunningProcess:
    """One command of a sandbox, run in a thread through LocalSandbox; its events go to every
    subscribed asyncio queue (a Start stream, and any Connect streams)."""

    def __init__(self, *, pid: int, config: Any, tag: str | None, sandbox: StandinSandbox) -> None:
        self.pid = pid
        self.config = config
        self.tag = tag
        self.sandbox = sandbox
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.end: Event | None = None
        self._subscribers: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]]] = []
        self._lock = threading.Lock()
        self._scratch: Path | None = None

    def subscribe(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        with self._lock:
            if self.end is not None:
                queue.put_nowait(self.end)
            else:
                self._subscribers.append((asyncio.get_running_loop(), queue))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        with self._lock:
            self._subscribers = [s for s in self._subscribers if s[1] is not queue]

    def publish(self, event: Event) -> None:
        with self._lock:
            if event.kind in ("end", "failed", "abort"):
                if self.end is not None:
                    return
                self.end = event
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            with contextlib.suppress(RuntimeError):  # that stream's loop is gone (server stopped)
                loop.call_soon_threadsafe(queue.put_nowait, event)

    def start(self, *, local: LocalSandbox, scratch: Path, timeout_seconds: float) -> None:
        self._scratch = scratch
        spec = self._spec(scratch, timeout_seconds)
        thread = threading.Thread(target=self._run, args=(local, spec), daemon=True)
        thread.start()

    def drop_streams(self) -> None:
        """The connections of its streams drop; the process runs on."""
        with self._lock:
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, ABORT)

    def abort(self) -> None:
        """The stream's connection drops, and the process is killed."""
        self.publish(ABORT)
        self.cancel.set()

    def _spec(self, scratch: Path, timeout_seconds: float) -> SandboxSpec:
        box = self.sandbox
        argv = [to_bwrap(self.config.cmd), *(to_bwrap(a) for a in self.config.args)]
        cwd = to_bwrap(self.config.cwd) if self.config.has_field("cwd") else BWRAP_HOME
        if cwd != BWRAP_HOME:
            # LocalSandbox always starts in /work; a shell moves to the asked directory.
            argv = ["/bin/sh", "-c", 'cd "$1" || exit 1; shift; exec "$@"', "cd", cwd, *argv]
        env = {
            "HOME": HOME,
            "USER": "user",
            "E2B_SANDBOX": "true",
            "E2B_SANDBOX_ID": box.sandbox_id,
            **box.env_vars,
            **dict(self.config.envs),
        }
        env = {key: to_bwrap(value) for key, value in env.items()}
        # A VM's own variables (HOME, PYTHONUNBUFFERED) are names the host's sandbox refuses
        # in its environment (floom/sandbox/env_names.py): the command sets them itself.
        own = {k: v for k, v in env.items() if refusal(k) and k not in RUN_VARIABLES}
        if own:
            env = {k: v for k, v in env.items() if k not in own}
            argv = ["/usr/bin/env", *(f"{k}={v}" for k, v in own.items()), *argv]
        # LocalSandbox sets FLOOM_OUTPUT_DIR=/output itself; binding the directory the
        # command asked for at /output keeps what it writes there under /home/user.
        output_dir = scratch
        asked = dict(self.config.envs).get("FLOOM_OUTPUT_DIR") or box.env_vars.get(
            "FLOOM_OUTPUT_DIR"
        )
        if asked:
            try:
                output_dir = box.host_path(asked)
            except PathOutsideHome:
                output_dir = scratch
        output_dir.mkdir(parents=True, exist_ok=True)
        scratch.mkdir(parents=True, exist_ok=True)
        return SandboxSpec(
            run_id=f"e2b-{box.sandbox_id}-{self.pid}",
            command=argv,
            workdir=box.home,
            output_dir=output_dir,
            env=env,
            network=box.allow_internet,
            timeout_seconds=max(timeout_seconds, 0.1),
        )

    def _run(self, local: LocalSandbox, spec: SandboxSpec) -> None:
        end = Event("failed", error="the stand-in could not run the command")
        try:
            result = local.run(spec, on_line=self._on_line, should_cancel=self.cancel.is_set)
        except Exception as exc:  # any stand-in failure reaches the client as an RPC error
            end = Event("failed", error=f"the stand-in could not run the command: {exc}")
        else:
            if result.exit_code is None:
                end = Event("end", exit_code=-1, exited=False, status="signal: killed")
            else:
                end = Event(
                    "end",
                    exit_code=result.exit_code,
                    exited=True,
                    status=f"exit status {result.exit_code}",
                )
            if result.limit_exceeded:
                end.error = result.error
        finally:
            # Off the process list before its end is told, as envd: a client that saw the
            # end and then lists the processes must not find it there.
            self.sandbox.processes.pop(self.pid, None)
            self.done.set()
            self.publish(end)
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)

    def _on_line(self, stream: str, line: str) -> None:
        self.publish(Event("data", stream=stream, data=(line + "\n").encode()))


@dataclass
class StandinSandbox:
    sandbox_id: str
    template: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    allow_internet: bool
    root: Path  # the sandbox's own host directory; root/home serves /home/user
    timeout_seconds: int
    access_token: str = field(default_factory=lambda: secrets.token_hex(16))
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    end_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    envd_alive: bool = True
    processes: dict[int, RunningProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.end_at = self.started_at + timedelta(seconds=self.timeout_seconds)
        self.home.mkdir(parents=True, exist_ok=True)

    @property
    def home(self) -> Path:
        return self.root / "home"

    def e2b_path(self, path: str) -> str:
        """`path` made absolute (relative paths are relative to /home/user) and normalised."""
        joined = PurePosixPath(HOME) / path
        parts: list[str] = []
        for part in joined.parts[1:]:
            if part == "..":
                if parts:
                    parts.pop()
            elif part not in (".", ""):
                parts.append(part)
        return "/" + "/".join(parts)

    def host_path(self, path: str) -> Path:
        """The host path serving the E2B `path`; PathOutsideHome for anything not under
        /home/user, or that a symlink would lead out of the sandbox's directory."""
        absolute = self.e2b_path(path)
        if absolute != HOME and not absolute.startswith(HOME + "/"):
            raise PathOutsideHome(
                f"the E2B stand-in only serves paths under {HOME}, not {absolute}"
            )
        host = self.home / absolute[len(HOME) :].lstrip("/")
        resolved = host.resolve()
        home = self.home.resolve()
        if resolved != home and home not in resolved.parents:
            raise PathOutsideHome(f"{absolute} leads out of the sandbox's {HOME}")
        return host

    def remaining_seconds(self) -> float:
        return (self.end_at - datetime.now(UTC)).total_seconds()

    def kill_processes(self) -> None:
        for process in list(self.processes.values()):
            process.abort()
