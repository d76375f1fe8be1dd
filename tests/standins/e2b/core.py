"""What the stand-in's control plane and envd share: the live sandboxes, request counts and
injected faults."""

from __future__ import annotations

import itertools
import shutil
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from floom.sandbox.local.backend import LocalSandbox
from tests.standins.e2b.sandboxes import StandinSandbox, new_sandbox_id

ENVD_VERSION = "0.6.1"
QUOTA_MESSAGE = (
    "you have reached the maximum number of concurrent E2B sandboxes ({limit}). "
    "If you need more, please visit 'https://e2b.dev/docs/billing'"
)


@dataclass
class Fault:
    """An answer the control plane gives instead of serving: `times` requests (None: every
    request until cleared) get `status` with `message`."""

    status: int
    message: str
    times: int | None = None
    retry_after: int | None = None
    route: str | None = None  # just this route (e.g. "POST /files", "POST /v2/sandboxes")


class StandinCore:
    def __init__(self, *, root: Path, api_key: str, templates: set[str]) -> None:
        self.root = root
        self.api_key = api_key
        self.templates = templates
        self.max_sandboxes: int | None = None
        self.sandboxes: dict[str, StandinSandbox] = {}
        self.created: list[StandinSandbox] = []
        self.killed: list[str] = []
        self.requests: Counter[str] = Counter()
        self.sandbox_requests: dict[str, Counter[str]] = {}
        self.control_fault: Fault | None = None
        self.envd_fault: Fault | None = None
        self.envd_unreachable = False
        # Seconds each create waits before answering, as a real microVM takes to boot.
        self.creation_delay = 0.0
        # A compromised envd's downloads: given the path asked for, an async iterator of
        # the bytes it answers with (set by `E2BStandin.serve_downloads`).
        self.download_body: Callable[[str], AsyncIterator[bytes]] | None = None
        # The Content-Encoding it names for those bytes ("": none).
        self.download_encoding = ""
        # (time.monotonic(), sandbox id, the command line) of each command started, in order.
        self.command_starts: list[tuple[float, str, str]] = []
        self.local = LocalSandbox()
        self.lock = threading.RLock()
        self._pids = itertools.count(1000)

    def count(self, label: str, sandbox_id: str | None = None) -> None:
        with self.lock:
            self.requests[label] += 1
            if sandbox_id:
                self.sandbox_requests.setdefault(sandbox_id, Counter())[label] += 1

    def take_fault(
        self, *, envd_route: str | None = None, control_route: str | None = None
    ) -> Fault | None:
        """The fault this request meets (control plane, or envd for `envd_route`), if any."""
        attribute = "control_fault" if envd_route is None else "envd_fault"
        route = envd_route if envd_route is not None else control_route
        with self.lock:
            fault: Fault | None = getattr(self, attribute)
            if fault is None or (route is not None and fault.route not in (None, route)):
                return None
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    setattr(self, attribute, None)
            return fault

    def next_pid(self) -> int:
        return next(self._pids)

    def create_sandbox(
        self,
        *,
        template: str,
        timeout: int,
        metadata: dict[str, str],
        env_vars: dict[str, str],
        allow_internet: bool,
    ) -> StandinSandbox:
        sandbox_id = new_sandbox_id()
        sandbox = StandinSandbox(
            sandbox_id=sandbox_id,
            template=template,
            metadata=metadata,
            env_vars=env_vars,
            allow_internet=allow_internet,
            root=self.root / "sandboxes" / sandbox_id,
            timeout_seconds=timeout,
        )
        with self.lock:
            self.sandboxes[sandbox_id] = sandbox
            self.created.append(sandbox)
        return sandbox

    def kill_sandbox(self, sandbox_id: str) -> bool:
        """End the sandbox: its processes die and its streams drop, its files go."""
        with self.lock:
            sandbox = self.sandboxes.pop(sandbox_id, None)
            if sandbox is None:
                return False
            self.killed.append(sandbox_id)
        sandbox.kill_processes()
        for process in list(sandbox.processes.values()):
            process.done.wait(timeout=10)
        shutil.rmtree(sandbox.root, ignore_errors=True)
        return True

    def kill_expired(self) -> None:
        for sandbox in list(self.sandboxes.values()):
            if sandbox.remaining_seconds() <= 0:
                self.kill_sandbox(sandbox.sandbox_id)

    def kill_all(self) -> None:
        for sandbox_id in list(self.sandboxes):
            self.kill_sandbox(sandbox_id)
