"""What tests share beside the fixtures: a live floom server on loopback and the
settings that make it quick, waits with deadlines, worker folders and their deploy."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from floom.api.app import create_app
from floom.api.edge.connections import guarded_protocol
from floom.bundle import read_folder
from floom.config import Settings
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs.rules import FINISHED
from floom.services.workers import versions as workers
from floom.services.workers.versions import DeployResult

# The harness is where tests take their helpers from, free_port included.
from tests.support.ports import free_port as free_port
from tests.support.uvicorn_thread import QuickStopServer

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "workers"
PG_ADMIN_URL = os.environ.get("FLOOM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def fast_settings(data_dir: Path, database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "deploy_examples": False,
        "heartbeat_seconds": 0.2,
        "reap_interval_seconds": 0.3,
        "poll_interval_seconds": 0.05,
        "lease_seconds": 3.0,
        "lease_grace_seconds": 0.2,
        "drain_seconds": 10.0,
        "secret_key": "test-secret-key",
    }
    values.update(overrides)
    return Settings(**values)


def plain_client(base_url: str, **options: Any) -> httpx.Client:
    """An httpx client for a server of the tests: plain HTTP on loopback, so no TLS context
    (as floom's own client does): loading the CA bundle costs each client 0.1-0.5 s here."""
    return httpx.Client(base_url=base_url, verify=False, **options)


@dataclass
class LiveServer:
    ctx: Context
    base_url: str
    admin_key: str
    # The clients handed out, closed with the server (a test need not close its own).
    clients: list[httpx.Client] = field(default_factory=list, repr=False)

    def client(self, key: str | None = None, **options: Any) -> httpx.Client:
        """A client with `key` (the admin key by default; "" for none) and httpx `options`."""
        token = self.admin_key if key is None else key
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = plain_client(self.base_url, headers=headers, **{"timeout": 30, **options})
        self.clients.append(client)
        return client

    def cli_env(self, key: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        env["FLOOM_BASE_URL"] = self.base_url
        env["FLOOM_API_KEY"] = self.admin_key if key is None else key
        env["FLOOM_DATA_DIR"] = str(self.ctx.settings.data_dir / "cli-home")
        return env


def start_server(ctx: Context) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = free_port()
    app = create_app(ctx=ctx)
    # As `floom serve` runs it: floom reads forwarding headers itself (api/forwarded.py).
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        proxy_headers=False,
        http=guarded_protocol(ctx.settings),
    )
    server = QuickStopServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the floom server did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


@contextmanager
def live_server(data_dir: Path, database_url: str, **overrides: Any) -> Iterator[LiveServer]:
    """A floom server of its own (API + executor) with settings overrides; several of them
    on one database stand for a restart or for another node."""
    ctx = Context.open(fast_settings(data_dir, database_url, **overrides))
    _, admin = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="test admin")
    srv, thread, url = start_server(ctx)
    server = LiveServer(ctx=ctx, base_url=url, admin_key=admin)
    try:
        yield server
    finally:
        for client in server.clients:
            client.close()
        srv.should_exit = True
        thread.join(timeout=30)
        ctx.engine.dispose()


def wait_until(predicate: Callable[[], Any], *, timeout: float = 20, interval: float = 0.05) -> Any:
    """Poll until predicate returns something truthy; fail with a clear message at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def wait_for_run(api: httpx.Client, run_id: str, *, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = api.get(f"/api/v1/runs/{run_id}").json()
        return body if body["status"] in FINISHED else None

    result: dict[str, Any] = wait_until(done, timeout=timeout)
    return result


def make_worker(folder: Path, manifest: str, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "worker.yml").write_text(manifest)
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return folder


def deploy_in_store(ctx: Context, folder: Path) -> DeployResult:
    """Deploy a worker folder through the services, as the deploy route does, without a server."""
    archive = read_folder(folder, max_bytes=10**7).to_archive()
    return workers.deploy(ctx, caller=SYSTEM, archive=archive)


def deploy_folder(api: httpx.Client, folder: Path) -> dict[str, Any]:
    archive = read_folder(folder, max_bytes=50 * 1024 * 1024).to_archive()
    resp = api.post(
        "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
    )
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def dribbled_answer(base_url: str, path: str) -> tuple[bytes, bytes]:
    """POST to `path` a JSON body that declares 100 bytes and sends 5 (a slow-loris), then
    read the server's answer: its head and its body."""
    url = httpx.URL(base_url)
    with socket.create_connection((url.host, url.port)) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
            "Content-Type: application/json\r\n"
            'Content-Length: 100\r\n\r\n{"a":'.encode()
        )
        # Only so that a server still holding it fails the test instead of hanging it.
        conn.settimeout(60)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            got = conn.recv(4096)
            if not got:
                break
            answer += got
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body
