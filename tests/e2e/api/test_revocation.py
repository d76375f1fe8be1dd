"""A privileged write reads its caller's key again inside its own transaction: a key revoked
after the request authenticated (from a node's cache, or while the request was under way)
is refused and the write changes nothing. Every deploy- and admin-scoped write is walked,
as a service call and as a REST route."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import select, update
from sqlmodel import SQLModel, col

from floom.bundle import read_folder
from floom.errors import Forbidden, Unauthorized
from floom.services.access import keys, secrets
from floom.services.access.auth_cache import HEARD_WITHIN_SECONDS, AuthCache
from floom.services.access.principal import SYSTEM, Principal
from floom.services.alerts import channels as alert_channels
from floom.services.alerts import deliveries as alert_deliveries
from floom.services.alerts import rules as alert_rules
from floom.services.alerts.senders import AlertUndeliverable
from floom.services.context import Context
from floom.services.handoffs import agents
from floom.services.handoffs.retire import retire_agent
from floom.services.triggers import registry as triggers
from floom.services.workers import state as worker_state
from floom.services.workers import versions as workers
from floom.services.workers.deletion import delete_worker
from floom.store.db import session_scope
from floom.store.models import ApiKey, Delivery, new_id, utcnow
from floom.vocabulary import DeliveryPurpose, DeliveryStatus
from tests.support.harness import (
    PG_ADMIN_URL,
    LiveServer,
    make_worker,
    wait_until,
)
from tests.support.ports import free_port
from tests.support.rigs.alerts import mail_host_context

SECRET_VALUE = "a-value-long-enough-to-redact"
# An email channel, whose writes are walked too: its host is checked by the egress guard when
# saved, so it names loopback, which these tests' settings allow (`ctx` below), on a port
# nothing listens on: a test send fails to connect.
MAIL = {
    "host": "smtp.walked.test",
    "port": free_port(),
    "sender": "floom@example.com",
    "to": ["ops@example.com"],
}
# Tables that background loops write on their own (node heartbeats); the rest must not change.
VOLATILE = {"nodes"}


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    """The conftest's `ctx`, with MAIL's host resolved to loopback and loopback allowed."""
    with mail_host_context(tmp_path, database_url, "smtp.walked.test") as context:
        yield context


def archive_of(folder: Path) -> bytes:
    return read_folder(folder, max_bytes=10 * 1024 * 1024).to_archive()


def stage(ctx: Context, tmp_path: Path) -> dict[str, str]:
    """What the privileged writes act on: a worker with two versions, a secret, a role, an
    agent, another key, an alert channel, a rule and a failed delivery."""
    first = workers.deploy(
        ctx,
        archive=archive_of(make_worker(tmp_path / "w1", "name: walked\n", {"run.py": "1\n"})),
        caller=SYSTEM,
    )
    workers.deploy(
        ctx,
        archive=archive_of(make_worker(tmp_path / "w2", "name: walked\n", {"run.py": "2\n"})),
        caller=SYSTEM,
    )
    secrets.set_secret(ctx, name="WALKED_SECRET", value=SECRET_VALUE, caller=SYSTEM)
    agents.create_role(ctx, name="walker", caller=SYSTEM)
    agent = agents.create_agent(ctx, label="walker-agent", roles=["walker"], caller=SYSTEM)
    other, _ = keys.create_key(ctx, scopes=["read"], name="other", caller=SYSTEM)
    alert_channels.create_channel(ctx, name="walked-mail", kind="email", config=MAIL, caller=SYSTEM)
    alert_rules.create_rule(
        ctx, name="walked-rule", events=["run.failed"], channels=["walked-mail"], caller=SYSTEM
    )
    failed = Delivery(
        id=new_id("dlv"),
        purpose=DeliveryPurpose.ALERT,
        status=DeliveryStatus.FAILED,
        channel_name="x",
    )
    with session_scope(ctx.engine, write=True) as s:
        s.add(failed)
    return {
        "delivery": failed.id,
        "first_version": first.version.id,
        "agent": agent.agent.id,
        "other_key": other.id,
        "archive3": archive_of(
            make_worker(tmp_path / "w3", "name: walked\n", {"run.py": "3\n"})
        ).hex(),
    }


def privileged_writes(
    ctx: Context, staged: dict[str, str]
) -> dict[str, Callable[[Principal], Any]]:
    """Every deploy- or admin-scoped service that writes, called as a caller would (in an
    order in which each succeeds with a valid key)."""
    return {
        "keys.create_key": lambda c: keys.create_key(ctx, scopes=["admin"], name="heir", caller=c),
        "keys.revoke_key": lambda c: keys.revoke_key(ctx, key_id=staged["other_key"], caller=c),
        "agents.create_role": lambda c: agents.create_role(ctx, name="usurper", caller=c),
        "agents.update_role": lambda c: agents.update_role(
            ctx, role="walker", description="changed", caller=c
        ),
        "agents.create_agent": lambda c: agents.create_agent(
            ctx, label="usurper", roles=["walker"], scopes=["admin"], caller=c
        ),
        "agents.create_agent_key": lambda c: agents.create_agent_key(
            ctx, agent=staged["agent"], scopes=["admin"], caller=c
        ),
        "agents.update_agent": lambda c: agents.update_agent(
            ctx, agent=staged["agent"], label="renamed", caller=c
        ),
        "retire.retire_agent": lambda c: retire_agent(ctx, agent=staged["agent"], caller=c),
        "agents.retire_role": lambda c: agents.retire_role(ctx, role="walker", caller=c),
        "secrets.set_secret": lambda c: secrets.set_secret(
            ctx, name="WALKED_SECRET", value="x" * 40, caller=c
        ),
        "secrets.delete_secret": lambda c: secrets.delete_secret(
            ctx, name="WALKED_SECRET", caller=c
        ),
        "workers.deploy": lambda c: workers.deploy(
            ctx, archive=bytes.fromhex(staged["archive3"]), caller=c
        ),
        "workers.rollback": lambda c: workers.rollback(
            ctx, name="walked", version_id=staged["first_version"], caller=c
        ),
        "worker_state.set_state": lambda c: worker_state.set_state(
            ctx, worker_name="walked", state={"walked": True}, caller=c
        ),
        "alert_channels.create_channel": lambda c: alert_channels.create_channel(
            ctx, name="walked-new", kind="email", config=MAIL, caller=c
        ),
        "alert_channels.update_channel": lambda c: alert_channels.update_channel(
            ctx, name="walked-mail", config={**MAIL, "starttls": False}, caller=c
        ),
        "alert_channels.change_channel": lambda c: alert_channels.change_channel(
            ctx, name="walked-mail", changes={"port": 2526}, caller=c
        ),
        "alert_deliveries.send_test": lambda c: _sent_or_undeliverable(
            lambda: alert_deliveries.send_test(ctx, channel_name="walked-mail", caller=c)
        ),
        "alert_rules.create_rule": lambda c: alert_rules.create_rule(
            ctx, name="walked-new", events=["*"], channels=["walked-mail"], caller=c
        ),
        "alert_rules.set_enabled": lambda c: alert_rules.set_enabled(
            ctx, name="walked-rule", enabled=False, caller=c
        ),
        "alert_rules.delete_rule": lambda c: alert_rules.delete_rule(
            ctx, name="walked-rule", caller=c
        ),
        "alert_deliveries.resend": lambda c: alert_deliveries.resend(
            ctx, delivery_id=staged["delivery"], caller=c
        ),
        "alert_channels.delete_channel": lambda c: alert_channels.delete_channel(
            ctx, name="walked-mail", caller=c
        ),
        "triggers.set_paused": lambda c: triggers.set_paused(
            ctx, worker_name="walked", paused=True, caller=c
        ),
        "worker_deletion.delete_worker": lambda c: delete_worker(
            ctx, name="walked", purge_runs=True, caller=c
        ),
    }


def _sent_or_undeliverable(send: Callable[[], Any]) -> Any:
    """A test send that got past its caller's check: recorded, then not delivered (no server
    answers for the channel's host)."""
    try:
        return send()
    except AlertUndeliverable as exc:
        return exc


def snapshot(ctx: Context) -> dict[str, list[str]]:
    with session_scope(ctx.engine) as s:
        return {
            table.name: sorted(repr(tuple(row)) for row in s.execute(select(table)).all())
            for table in SQLModel.metadata.sorted_tables
            if table.name not in VOLATILE
        }


def revoke_behind_its_back(ctx: Context, key_id: str) -> None:
    """Revoke a key as another node would, without telling this node's cache."""
    with session_scope(ctx.engine, write=True) as s:
        s.execute(update(ApiKey).where(ApiKey.id == key_id).values(revoked_at=utcnow()))  # type: ignore[arg-type]


def test_a_privileged_write_whose_key_was_revoked_after_authentication_changes_nothing(
    ctx: Context, tmp_path: Path
) -> None:
    staged = stage(ctx, tmp_path)
    wrong = []
    for name, write in privileged_writes(ctx, staged).items():
        key, _ = keys.create_key(ctx, scopes=["admin"], name="doomed", caller=SYSTEM)
        caller = Principal.of_key(key)  # authenticated...
        revoke_behind_its_back(ctx, key.id)  # ...then revoked, before the write's transaction
        before = snapshot(ctx)
        try:
            write(caller)
            wrong.append(f"{name} wrote with a revoked key")
        except Unauthorized:
            pass
        if snapshot(ctx) != before:
            wrong.append(f"{name} changed the store with a revoked key")
    assert wrong == []
    # The same writes with a valid key succeed: the check refuses the revoked key, not all.
    valid, _ = keys.create_key(ctx, scopes=["admin"], name="valid", caller=SYSTEM)
    for write in privileged_writes(ctx, staged).values():
        write(Principal.of_key(valid))


def test_a_write_whose_key_lost_the_scope_is_refused_in_its_transaction(ctx: Context) -> None:
    key, _ = keys.create_key(ctx, scopes=["admin"], name="demoted", caller=SYSTEM)
    caller = Principal.of_key(key)
    with session_scope(ctx.engine, write=True) as s:
        s.execute(update(ApiKey).where(ApiKey.id == key.id).values(scopes="read"))  # type: ignore[arg-type]
    with pytest.raises(Forbidden):
        keys.create_key(ctx, scopes=["admin"], name="heir", caller=caller)
    gone = Principal(key_id="key_gone", name="gone", scopes=("admin",))
    with pytest.raises(Unauthorized), session_scope(ctx.engine, write=True) as s:
        gone.require_in(s, "admin")


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_write_waits_for_a_revocation_being_committed_and_then_refuses(
    ctx: Context, database_url: str
) -> None:
    key, _ = keys.create_key(ctx, scopes=["admin"], name="doomed", caller=SYSTEM)
    caller = Principal.of_key(key)
    database = database_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{database}") as revoker:
        # Another node's revocation, under way: the row is locked, not yet committed.
        revoker.execute("UPDATE api_keys SET revoked_at = now() WHERE id = %s", (key.id,))
        outcome: list[object] = []

        def write() -> None:
            try:
                outcome.append(keys.create_key(ctx, scopes=["admin"], name="heir", caller=caller))
            except Exception as exc:  # the outcome is what is asserted
                outcome.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        # The write waits on the key row's lock (it does not read around the revocation).
        wait_until(lambda: _waiting_locks(revoker) > 0 or outcome, timeout=10)
        revoker.commit()
        writer.join(timeout=30)
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], Unauthorized), outcome
    with session_scope(ctx.engine) as s:
        heirs = s.execute(select(col(ApiKey.id)).where(col(ApiKey.name) == "heir")).all()
    assert heirs == []


def _waiting_locks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
    return int(row[0]) if row else 0


# -- every deploy- and admin-scoped route --------------------------------------------------------


def routes_by_scope(server: LiveServer) -> set[tuple[str, str]]:
    """The /api/v1 routes that write (any method but GET) and need the deploy or admin scope."""
    from floom.api.app import create_app
    from tests.e2e.api.test_authorization import _scope_of

    found: set[tuple[str, str]] = set()
    pending: list[Any] = list(create_app(ctx=server.ctx).routes)
    while pending:
        route = pending.pop()
        inner = getattr(route, "original_router", None)
        if inner is not None:
            pending.extend(inner.routes)
            continue
        if isinstance(route, APIRoute) and _scope_of(route) in ("deploy", "admin"):
            found.update((m, route.path) for m in (route.methods or set()) - {"GET", "HEAD"})
    return found


def route_requests(staged: dict[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    """A request each privileged route would carry out with a valid key."""
    archive = bytes.fromhex(staged["archive3"])
    return {
        ("POST", "/api/v1/keys"): {"json": {"scopes": ["admin"], "name": "heir"}},
        ("DELETE", "/api/v1/keys/{key_id}"): {"path": {"key_id": staged["other_key"]}},
        ("POST", "/api/v1/roles"): {"json": {"name": "usurper"}},
        ("PATCH", "/api/v1/roles/{role}"): {
            "path": {"role": "walker"},
            "json": {"description": "changed"},
        },
        ("POST", "/api/v1/roles/{role}/retire"): {"path": {"role": "walker"}},
        ("POST", "/api/v1/agents"): {"json": {"label": "usurper", "scopes": ["admin"]}},
        ("PATCH", "/api/v1/agents/{agent}"): {
            "path": {"agent": staged["agent"]},
            "json": {"label": "renamed"},
        },
        ("POST", "/api/v1/agents/{agent}/keys"): {
            "path": {"agent": staged["agent"]},
            "json": {"scopes": ["admin"]},
        },
        ("POST", "/api/v1/agents/{agent}/retire"): {"path": {"agent": staged["agent"]}},
        ("PUT", "/api/v1/secrets/{name}"): {
            "path": {"name": "WALKED_SECRET"},
            "json": {"value": "y" * 40},
        },
        ("DELETE", "/api/v1/secrets/{name}"): {"path": {"name": "WALKED_SECRET"}},
        ("POST", "/api/v1/alerts/channels"): {
            "json": {"name": "walked-new", "kind": "email", "config": MAIL}
        },
        ("PUT", "/api/v1/alerts/channels/{name}"): {
            "path": {"name": "walked-mail"},
            "json": {"config": {**MAIL, "starttls": False}},
        },
        ("PATCH", "/api/v1/alerts/channels/{name}"): {
            "path": {"name": "walked-mail"},
            "json": {"config": {"port": 2526}},
        },
        ("DELETE", "/api/v1/alerts/channels/{name}"): {"path": {"name": "walked-mail"}},
        ("POST", "/api/v1/alerts/channels/{name}/test"): {"path": {"name": "walked-mail"}},
        ("POST", "/api/v1/alerts/rules"): {
            "json": {"name": "walked-new", "events": ["*"], "channels": ["walked-mail"]}
        },
        ("PATCH", "/api/v1/alerts/rules/{name}"): {
            "path": {"name": "walked-rule"},
            "json": {"enabled": False},
        },
        ("DELETE", "/api/v1/alerts/rules/{name}"): {"path": {"name": "walked-rule"}},
        ("POST", "/api/v1/alerts/deliveries/{alert_delivery_id}/resend"): {
            "path": {"alert_delivery_id": staged["delivery"]}
        },
        ("POST", "/api/v1/workers"): {
            "content": archive,
            "headers": {"Content-Type": "application/gzip"},
        },
        ("POST", "/api/v1/workers/{name}/rollback"): {
            "path": {"name": "walked"},
            "json": {"version_id": staged["first_version"]},
        },
        ("PUT", "/api/v1/workers/{name}/state"): {
            "path": {"name": "walked"},
            "json": {"state": {"walked": True}},
        },
        ("POST", "/api/v1/workers/{name}/pause"): {"path": {"name": "walked"}},
        ("POST", "/api/v1/workers/{name}/resume"): {"path": {"name": "walked"}},
        ("DELETE", "/api/v1/workers/{name}"): {
            "path": {"name": "walked"},
            "params": {"purge_runs": "true"},
        },
    }


@contextmanager
def _key_cached_then_revoked(server: LiveServer) -> Iterator[str]:
    """A fresh admin key that the server authenticated (and so caches), then revoked as
    another node would: the server's cache does not hear of it."""
    key, token = keys.create_key(server.ctx, scopes=["admin"], name="doomed", caller=SYSTEM)
    with server.client(token) as api:
        # The cache is trusted once the node hears its signals (at once on SQLite).
        wait_until(lambda: server.ctx.node.auth_cache.trusted)
        assert api.get("/api/v1/keys/me").status_code == 200
    assert server.ctx.node.auth_cache.get(keys._hash(token)) is not None  # cached
    revoke_behind_its_back(server.ctx, key.id)
    yield token


def test_every_deploy_and_admin_route_refuses_a_key_revoked_after_it_was_cached(
    server: LiveServer, tmp_path: Path
) -> None:
    staged = stage(server.ctx, tmp_path)
    table = route_requests(staged)
    assert routes_by_scope(server) == set(table), "a privileged route is not here"
    wrong = []
    for (method, path), request in sorted(table.items()):
        with _key_cached_then_revoked(server) as token, server.client(token) as api:
            before = snapshot(server.ctx)
            url = path.format(**request.get("path", {}))
            options = {k: v for k, v in request.items() if k != "path"}
            resp = api.request(method, url, **options)
            if resp.status_code != 401:
                wrong.append(f"{method} {path} answered {resp.status_code}, not 401")
            if snapshot(server.ctx) != before:
                wrong.append(f"{method} {path} changed the store")
    assert wrong == []


# -- the key cache's bound -----------------------------------------------------------------------


def test_the_key_cache_is_not_used_once_its_listener_was_not_heard_within_the_bound() -> None:
    cache = AuthCache(trusted=False)
    key = ApiKey(id="key_x", prefix="flm_x", key_hash="h", scopes="admin")
    cache.put("h", key, epoch=cache.epoch)
    assert cache.get("h") is None  # nothing heard yet: neither filled nor read
    cache.heard(time.monotonic())
    cache.put("h", key, epoch=cache.epoch)
    assert cache.get("h") is key
    cache.heard(time.monotonic() - HEARD_WITHIN_SECONDS - 1)  # an older beat changes nothing
    assert cache.get("h") is key
    stale = AuthCache(trusted=False)
    stale.heard(time.monotonic() - HEARD_WITHIN_SECONDS - 0.01)
    stale.put("h", key, epoch=stale.epoch)
    assert not stale.trusted
    assert stale.get("h") is None
    cache.clear(trusted=False)  # a lost connection
    assert not cache.trusted
    assert cache.get("h") is None


def test_every_deploy_or_admin_service_that_opens_a_write_checks_its_caller_inside_it() -> None:
    """A new privileged write must read its caller's key in its transaction too."""
    import importlib
    import inspect
    import pkgutil

    import floom.services

    unchecked = []
    for info in pkgutil.walk_packages(floom.services.__path__, "floom.services."):
        module = importlib.import_module(info.name)
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__:
                continue
            source = inspect.getsource(fn)
            privileged = '.require("deploy")' in source or '.require("admin")' in source
            checked = ".require_in(" in source or "add_key(" in source  # add_key checks
            if privileged and "write=True" in source and not checked:
                unchecked.append(f"{info.name}.{name}")
    assert unchecked == []
