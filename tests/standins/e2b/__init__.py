"""A wire-level stand-in for E2B: its control plane (REST) and envd (Connect RPC and /files)
on loopback, so the real `e2b` SDK runs unmodified in the tests. See README.md here."""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.standins.e2b.control import control_app
from tests.standins.e2b.core import QUOTA_MESSAGE, Fault, StandinCore
from tests.standins.e2b.envd import envd_app
from tests.standins.e2b.sandboxes import StandinSandbox
from tests.support.ports import free_port
from tests.support.uvicorn_thread import QuickStopServer

__all__ = ["E2BStandin", "e2b_standin", "running_e2b_standin"]

API_KEY = "e2b_standin_0123456789abcdef"
FAULTS = {
    "unavailable": (503, "Service temporarily unavailable"),
    "rate_limited": (429, "Rate limit exceeded, please try again later"),
    "unauthorized": (401, "Invalid API key"),
    "server_error": (500, "Internal server error"),
}


class _Server:
    """One uvicorn server in a thread, on a fixed loopback port so it can stop and start."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: QuickStopServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="critical",
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = QuickStopServer(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the E2B stand-in's {self.name} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    @property
    def running(self) -> bool:
        return self._server is not None


class E2BStandin:
    """The stand-in and its test controls.

    `env` points the SDK at it (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY): pass it to a
    floom server subprocess, or set it in os.environ. `requests` counts requests per route
    (control plane: "POST /v2/sandboxes", "DELETE /sandboxes/{sandboxID}", ...; envd:
    "POST /files", "GET /files", "/process.Process/Start", ...), `requests_for(id)` per
    sandbox. `sandboxes` are the live ones, `created` all of them; `killed` the ids killed so
    far, in order.
    """

    def __init__(
        self, root: Path, *, templates: set[str] | None = None, creation_delay: float = 0.0
    ) -> None:
        self.core = StandinCore(
            root=root, api_key=API_KEY, templates=set(templates or ()) | {"base"}
        )
        self.core.creation_delay = creation_delay
        self._control = _Server(control_app(self.core), "control plane")
        self._envd = _Server(envd_app(self.core), "envd")
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, daemon=True)

    # Lifecycle

    def start(self) -> E2BStandin:
        self._envd.start()
        self._control.start()
        self._reaper.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.core.kill_all()
        self._control.stop()
        self._envd.stop()
        # Its LocalSandbox keeps launchers started ahead of the next command: ended here.
        self.core.local.close()

    def _reap(self) -> None:
        # E2B ends a sandbox when its timeout passes.
        while not self._stop.wait(0.2):
            self.core.kill_expired()

    # Pointing the SDK at it

    @property
    def api_url(self) -> str:
        return self._control.url

    @property
    def sandbox_url(self) -> str:
        return self._envd.url

    @property
    def api_key(self) -> str:
        return self.core.api_key

    @property
    def env(self) -> dict[str, str]:
        return {
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.sandbox_url,
            "E2B_API_KEY": self.api_key,
        }

    # What happened

    @property
    def templates(self) -> set[str]:
        """Templates that exist; creating from any other gets E2B's 404. Mutable."""
        return self.core.templates

    @property
    def sandboxes(self) -> dict[str, StandinSandbox]:
        """The live sandboxes by id (each has .metadata, .template, .env_vars,
        .allow_internet, .home: the host directory serving its /home/user)."""
        return dict(self.core.sandboxes)

    @property
    def created(self) -> list[StandinSandbox]:
        """Every sandbox created so far, live or not, in order (their metadata, template,
        env_vars and allow_internet stay readable after they end)."""
        return list(self.core.created)

    @property
    def killed(self) -> list[str]:
        return list(self.core.killed)

    @property
    def requests(self) -> Counter[str]:
        with self.core.lock:
            return Counter(self.core.requests)

    @property
    def command_starts(self) -> list[tuple[float, str, str]]:
        """(time.monotonic() when envd got it, sandbox id, command line) of every command
        started, in order."""
        with self.core.lock:
            return list(self.core.command_starts)

    @property
    def creation_delay(self) -> float:
        """Seconds each create waits before it answers (a microVM booting); 0 by default."""
        return self.core.creation_delay

    @creation_delay.setter
    def creation_delay(self, seconds: float) -> None:
        self.core.creation_delay = seconds

    def requests_for(self, sandbox_id: str) -> Counter[str]:
        with self.core.lock:
            return Counter(self.core.sandbox_requests.get(sandbox_id, {}))

    def reset_counts(self) -> None:
        with self.core.lock:
            self.core.requests.clear()
            self.core.sandbox_requests.clear()
            self.core.command_starts.clear()

    def host_path(self, sandbox_id: str, path: str) -> Path:
        """The host file serving `path` (under /home/user) of a live sandbox."""
        return self.core.sandboxes[sandbox_id].host_path(path)

    # Acting from outside

    def kill_sandbox(self, sandbox_id: str) -> bool:
        """Kill a sandbox as E2B would (timeout, dashboard, another client): its commands die,
        their streams drop, its files go."""
        return self.core.kill_sandbox(sandbox_id)

    def kill_envd(self, sandbox_id: str) -> None:
        """envd dies inside a live sandbox: running commands' streams drop, and every envd
        request for it gets the edge proxy's 502 "port is not open"; the control plane still
        lists it as running."""
        sandbox = self.core.sandboxes[sandbox_id]
        sandbox.envd_alive = False
        sandbox.kill_processes()

    def fail_control_plane(
        self,
        kind: str = "unavailable",
        *,
        times: int | None = None,
        retry_after: int | None = None,
        status: int | None = None,
        message: str | None = None,
        route: str | None = None,
    ) -> None:
        """The next `times` control-plane requests (all, when None) get an error: `kind` is
        unavailable (503), rate_limited (429), unauthorized (401), server_error (500), quota
        (429, E2B's concurrent-sandbox limit), or give `status` and `message` yourself. The
        SDK retries 429/502/503/504 three times by itself, so times=N < 4 still succeeds.
        `route`: only the requests of that route, as counted in `requests` (e.g.
        "POST /v2/sandboxes", the creates)."""
        default_status, default_message = FAULTS.get(
            kind, (429, QUOTA_MESSAGE.format(limit=len(self.core.sandboxes)))
        )
        if kind not in FAULTS and kind != "quota" and status is None:
            raise ValueError(f"unknown fault {kind!r}")
        with self.core.lock:
            self.core.control_fault = Fault(
                status=status or default_status,
                message=message or default_message,
                times=times,
                retry_after=retry_after,
                route=route,
            )

    def fail_envd(
        self,
        status: int = 502,
        message: str = "The sandbox is running but port is not open",
        *,
        route: str | None = None,
        times: int | None = None,
    ) -> None:
        """The next `times` envd requests (all when None), or only those of `route` (as
        counted in `requests`, e.g. "POST /files", "/process.Process/Start"), get a plain
        JSON error `status`, as E2B's edge proxy answers for envd (502: the SDK raises
        SandboxUnreachableException; 507: NotEnoughSpaceException; 429: RateLimitException)."""
        with self.core.lock:
            self.core.envd_fault = Fault(status=status, message=message, times=times, route=route)

    def set_quota(self, max_sandboxes: int | None) -> None:
        """At most this many live sandboxes; one more create gets E2B's 429."""
        self.core.max_sandboxes = max_sandboxes

    def control_plane_down(self) -> None:
        """Stop the control plane: its port refuses connections until control_plane_up()."""
        self._control.stop()

    def control_plane_up(self) -> None:
        if not self._control.running:
            self._control.start()

    def down(self) -> None:
        """All of E2B becomes unreachable (control plane and every sandbox's envd refuse
        connections; open streams drop) until up(). The sandboxes and their commands live on,
        as they would in E2B during a network partition."""
        self._control.stop()
        self.core.envd_unreachable = True
        for sandbox in list(self.core.sandboxes.values()):
            for process in list(sandbox.processes.values()):
                process.drop_streams()
        self._envd.stop()

    def up(self) -> None:
        self.core.envd_unreachable = False
        if not self._envd.running:
            self._envd.start()
        self.control_plane_up()

    def serve_downloads(
        self, body: Callable[[str], AsyncIterator[bytes]] | None, *, encoding: str = ""
    ) -> None:
        """envd taken over: every download (`files.read`) answers with what `body(path)`
        yields, at its pace, whatever the file holds (None: the files again), naming
        `encoding` as its Content-Encoding when given."""
        self.core.download_body = body
        self.core.download_encoding = encoding

    def clear_faults(self) -> None:
        with self.core.lock:
            self.core.control_fault = None
            self.core.envd_fault = None
            self.core.download_body = None
            self.core.download_encoding = ""
        self.core.max_sandboxes = None
        self.core.creation_delay = 0.0
        self.up()


@contextmanager
def running_e2b_standin(
    root: Path | None = None, *, templates: set[str] | None = None, creation_delay: float = 0.0
) -> Iterator[E2BStandin]:
    """Start the stand-in (outside pytest too, e.g. for bench/); everything ends on exit.
    `creation_delay`: seconds each create takes (also settable as `.creation_delay`)."""
    with tempfile.TemporaryDirectory(prefix="e2b-standin-") as scratch:
        standin = E2BStandin(
            root or Path(scratch), templates=templates, creation_delay=creation_delay
        ).start()
        try:
            yield standin
        finally:
            standin.stop()


@pytest.fixture
def e2b_standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[E2BStandin]:
    """A running E2B stand-in with the SDK's settings (`.env`) also set in os.environ for
    the test; templates "base" and "python-data" exist."""
    with running_e2b_standin(tmp_path / "e2b", templates={"python-data"}) as standin:
        for key, value in standin.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("E2B_DOMAIN", raising=False)
        monkeypatch.delenv("E2B_DEBUG", raising=False)
        yield standin
