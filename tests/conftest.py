"""Shared fixtures: databases (SQLite and PostgreSQL), a live floom server on loopback."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from floom.api.app import create_app
from floom.config import Settings
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs.rules import FINISHED
from tests.pg_databases import DatabasePool
from tests.ports import free_port

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "workers"
PG_ADMIN_URL = os.environ.get("FLOOM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_REQUIRED = bool(os.environ.get("CI") or os.environ.get("FLOOM_REQUIRE_POSTGRES"))


# FastAPI remembers how to call each endpoint and dependency in caches of 4,096 entries
# keyed by the function. A server's endpoints are closures over its app and context, so
# without this a test process would keep the last few dozen servers of earlier tests alive
# (the workers grew past 1 GiB, and the collector's full passes over that heap paused every
# thread, heartbeats included, for seconds). One app per process, as floom serve has, never
# fills them.
_FASTAPI_CALL_CACHES = (
    "_is_gen_callable_cached",
    "_is_async_gen_callable_cached",
    "_is_coroutine_callable_cached",
)


@pytest.fixture(autouse=True)
def _forget_finished_servers() -> Iterator[None]:
    yield
    import fastapi.dependencies.models as fastapi_models

    for name in _FASTAPI_CALL_CACHES:
        cache = getattr(fastapi_models, name, None)
        if cache is not None:
            cache.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def _unmount_run_disks_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run disks that a node killed on purpose (kill -9, never restarted) left mounted
    under this process's temporary dirs are unmounted at the end, as a restarted node
    would: pytest could not remove them, and the machine would keep their loop devices."""
    yield
    from floom.sandbox.local.disks import unmount_under

    unmount_under(tmp_path_factory.getbasetemp())


def _pg_reachable() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except Exception:  # any failure means "not reachable" for the skip decision
        return False


@pytest.fixture(scope="session")
def pg_available() -> bool:
    ok = _pg_reachable()
    if not ok and PG_REQUIRED:
        pytest.fail(f"PostgreSQL is required in CI but unreachable at {PG_ADMIN_URL}")
    return ok


@pytest.fixture(scope="session")
def pg_template(pg_available: bool) -> Iterator[str | None]:
    """A migrated PostgreSQL database that each test's database is cloned from: cloning is
    faster than creating the schema every time."""
    if not pg_available:
        yield None
        return
    import psycopg

    from floom.store.db import make_engine
    from floom.store.migrate import migrate

    name = f"floom_template_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
    migrate(engine)
    engine.dispose()
    try:
        yield name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_databases(pg_template: str | None) -> Iterator[DatabasePool | None]:
    """This test process's migrated PostgreSQL databases, emptied and reused between tests."""
    if pg_template is None:
        yield None
        return
    pool = DatabasePool(admin_url=PG_ADMIN_URL, template=pg_template)
    try:
        yield pool
    finally:
        pool.close()


def _database(request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'floom.db'}"
        return
    if not request.getfixturevalue("pg_available"):
        pytest.skip("PostgreSQL not reachable on 127.0.0.1:5432")
    import psycopg

    if migrated:
        pool: DatabasePool = request.getfixturevalue("pg_databases")
        name = pool.take()
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        finally:
            pool.give_back(name)
        return
    name = f"floom_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each behaviour test runs once on SQLite and once on an empty migrated PostgreSQL
    database of its own (cloned from a template, emptied again after each test)."""
    yield from _database(request, tmp_path, migrated=True)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Like database_url, but a PostgreSQL database without any table."""
    yield from _database(request, tmp_path, migrated=False)


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


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    context = Context.open(fast_settings(tmp_path / "data", database_url))
    yield context
    context.engine.dispose()


def plain_client(base_url: str, **options: Any) -> httpx.Client:
    """An httpx client for a server of the tests: plain HTTP on loopback, so no TLS context
    (as floom's own client does): loading the CA bundle costs each client 0.1-0.5 s here."""
    return httpx.Client(base_url=base_url, verify=False, **options)


@dataclass
class LiveServer:
    ctx: Context
    base_url: str
    admin_key: str

    def client(self, key: str | None = None) -> httpx.Client:
        token = self.admin_key if key is None else key
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return plain_client(self.base_url, headers=headers, timeout=30)

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
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", proxy_headers=False
    )
    server = uvicorn.Server(config)
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
    try:
        yield LiveServer(ctx=ctx, base_url=url, admin_key=admin)
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
        ctx.engine.dispose()


@pytest.fixture
def server(ctx: Context) -> Iterator[LiveServer]:
    """A live floom server (API + executor) on loopback, with an admin key."""
    _, admin = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="test admin")
    srv, thread, url = start_server(ctx)
    try:
        yield LiveServer(ctx=ctx, base_url=url, admin_key=admin)
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def api(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


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


def deploy_folder(api: httpx.Client, folder: Path) -> dict[str, Any]:
    from floom.bundle import read_folder

    archive = read_folder(folder, max_bytes=50 * 1024 * 1024).to_archive()
    resp = api.post(
        "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
    )
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body
