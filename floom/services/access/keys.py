"""API keys: hashed bearer credentials with scopes."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from floom.errors import InvalidRequest, NotFound, Unauthorized, quoted
from floom.hints import act, told
from floom.services import names
from floom.services.access.principal import SCOPES, SYSTEM, Principal, grants
from floom.store import signals
from floom.store.db import on_postgres, session_scope
from floom.store.models import ApiKey, new_id, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

KEY_PREFIX = "flm_"
# As the api_keys table holds it.
MAX_NAME_CHARS = 128

log = logging.getLogger("floom.keys")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_scopes(scopes: list[str]) -> None:
    """Raise InvalidRequest unless every scope is known and there is at least one."""
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise InvalidRequest(
            f"unknown scope {quoted(', '.join(repr(s) for s in bad))}" if bad else "no scope given",
            hint=f"scopes are {', '.join(SCOPES)}",
        )


def create_key(
    ctx: Context,
    *,
    scopes: list[str],
    name: str = "",
    token: str | None = None,
    agent_id: str | None = None,
    caller: Principal,
) -> tuple[ApiKey, str]:
    """Store a new key and return it with its plaintext, which is never stored or shown again.
    Needs the admin scope (checked again in the inserting transaction)."""
    caller.require("admin")
    check_scopes(scopes)
    names.check_text_name(name, field="name", most=MAX_NAME_CHARS)
    with session_scope(ctx.engine, write=True) as s:
        return add_key(s, scopes=scopes, name=name, token=token, agent_id=agent_id, caller=caller)


def add_key(
    s: Session,
    *,
    scopes: list[str],
    name: str = "",
    token: str | None = None,
    agent_id: str | None = None,
    caller: Principal,
) -> tuple[ApiKey, str]:
    """create_key in the caller's write transaction `s` (an agent and its first key commit
    together); the caller's key is checked in `s` first."""
    caller.require_in(s, "admin")
    check_scopes(scopes)
    token = token or KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key"),
        name=name,
        prefix=token[:10],
        key_hash=_hash(token),
        scopes=",".join(scopes),
        agent_id=agent_id,
    )
    s.add(key)
    return key, token


def announce_revoked(s: Session, key_hash: str) -> None:
    """In the revoking transaction: every node forgets the key from its authentication
    cache when it commits (floom/services/access/auth_cache.py)."""
    signals.publish(s, signals.KEY_REVOKED, key_hash)


def forget_key(ctx: Context, key_hash: str) -> None:
    """Drop a key from this node's authentication cache (after revoking it)."""
    ctx.node.auth_cache.forget(key_hash)


def authenticated_recently(ctx: Context, token: str | None) -> ApiKey | None:
    """The key of `token` if this node authenticated it within AUTH_CACHE_SECONDS and has
    heard of no revocation since, else None (then `authenticate`). Reads nothing: an event
    loop may call it without a worker thread."""
    if not token:
        return None
    return ctx.node.auth_cache.get(_hash(token))


def authenticate(ctx: Context, token: str | None) -> ApiKey:
    if not token:
        raise Unauthorized(
            "no API key given",
            hint="send `Authorization: Bearer <key>`; set FLOOM_API_KEY for the CLI",
        )
    digest = _hash(token)
    cached = ctx.node.auth_cache.get(digest)
    if cached is not None:
        return cached
    epoch = ctx.node.auth_cache.epoch
    with session_scope(ctx.engine) as s:
        key = s.exec(select(ApiKey).where(ApiKey.key_hash == digest)).first()
    if key is None or key.revoked_at is not None:
        raise Unauthorized(
            "the API key is not valid or was revoked",
            hint=told("create a key with ", act("keys create"), " on the server"),
        )
    ctx.node.auth_cache.put(digest, key, epoch=epoch)
    return key


def get_key(ctx: Context, *, key_id: str, caller: Principal) -> ApiKey:
    """One key by id: a caller's own key needs the read scope, another key the admin scope."""
    caller.require("read" if key_id == caller.key_id else "admin")
    with session_scope(ctx.engine) as s:
        key = s.get(ApiKey, key_id)
    if key is None:
        raise NotFound(
            f"no API key {quoted(key_id)}", hint=told(act("keys list"), " shows the key ids")
        )
    return key


def list_keys(ctx: Context, *, caller: Principal) -> list[ApiKey]:
    """Every key (hashes never leave the store). Needs the admin scope."""
    caller.require("admin")
    with session_scope(ctx.engine) as s:
        return list(s.exec(select(ApiKey).order_by(ApiKey.created_at)).all())  # type: ignore[arg-type]


def revoke_key(ctx: Context, *, key_id: str, caller: Principal) -> ApiKey:
    """Needs the admin scope (checked again in the revoking transaction); revoking twice
    changes nothing."""
    caller.require("admin")
    with session_scope(ctx.engine, write=True) as s:
        lock_keys(s, [key_id, caller.key_id])
        caller.require_in(s, "admin")
        key = s.get(ApiKey, key_id, populate_existing=True)
        if key is None:
            raise NotFound(
                f"no API key {quoted(key_id)}", hint=told(act("keys list"), " shows the key ids")
            )
        if key.revoked_at is None:
            key.revoked_at = utcnow()
            s.add(key)
            announce_revoked(s, key.key_hash)
    forget_key(ctx, key.key_hash)
    return key


def lock_keys(s: Session, key_ids: Iterable[str | None]) -> None:
    """Lock these key rows for update, in id order, before a transaction that revokes some
    of them checks its caller's key (`require_in`, a share lock): two admins revoking each
    other's keys at once then queue instead of deadlocking. PostgreSQL only; SQLite's write
    transactions are serial."""
    wanted = sorted({k for k in key_ids if k})
    if wanted and on_postgres(s):
        s.exec(
            select(ApiKey.id)
            .where(col(ApiKey.id).in_(wanted))
            .order_by(col(ApiKey.id))
            .with_for_update()
        ).all()


def key_names(ctx: Context, *, key_ids: list[str], caller: Principal) -> dict[str, str]:
    """The name (or, unnamed, the prefix) of each of these keys that exists, revoked or not:
    how pages say who started a run or deployed a version. Needs the read scope."""
    caller.require("read")
    wanted = sorted({k for k in key_ids if k})
    if not wanted:
        return {}
    with session_scope(ctx.engine) as s:
        rows = s.exec(
            select(ApiKey.id, ApiKey.name, ApiKey.prefix).where(col(ApiKey.id).in_(wanted))
        ).all()
    return {key_id: name or f"{prefix}…" for key_id, name, prefix in rows}


def ensure_admin_key(ctx: Context) -> str | None:
    """Make sure an admin key exists. Returns a new key's plaintext when one was generated.

    FLOOM_BOOTSTRAP_API_KEY becomes the admin key if no admin key exists yet; otherwise a
    key is generated and saved to a 0600 file in the data dir, which the local CLI reads.
    A revoked key never comes back: when the bootstrap key is the one that was revoked, it
    stays revoked and a fresh key is generated into the file, with a warning in the log.
    """
    if _has_admin_key(ctx):
        return None
    bootstrap = ctx.settings.bootstrap_api_key
    if bootstrap:
        with session_scope(ctx.engine) as s:
            known = s.exec(select(ApiKey).where(ApiKey.key_hash == _hash(bootstrap))).first()
        if known is None:
            try:
                create_key(ctx, scopes=["admin"], name="bootstrap", token=bootstrap, caller=SYSTEM)
                return None
            except IntegrityError:
                # Another node inserted the same bootstrap key at the same moment.
                if _has_admin_key(ctx):
                    return None
        log.warning(
            "FLOOM_BOOTSTRAP_API_KEY is a revoked API key and stays revoked; a new admin key "
            "is generated into %s (unset FLOOM_BOOTSTRAP_API_KEY or set a new value)",
            ctx.settings.admin_key_file,
        )
    _, token = create_key(ctx, scopes=["admin"], name="admin (generated at start)", caller=SYSTEM)
    path = ctx.settings.admin_key_file
    if path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def _has_admin_key(ctx: Context) -> bool:
    with session_scope(ctx.engine) as s:
        live = s.exec(select(ApiKey).where(col(ApiKey.revoked_at).is_(None))).all()
    return any(grants(k.scopes, "admin") for k in live)
