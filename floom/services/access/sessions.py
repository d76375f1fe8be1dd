"""Browser sessions for the web UI: sign in with an API key, look a session up, sign out.

The browser holds only a random session token; the database holds its hash, the id of the
API key it was made with and the session's CSRF token. A revoked key or an expired session
signs the browser out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlmodel import col, delete, select

from floom.errors import Forbidden, Unauthorized
from floom.services.access import keys
from floom.services.access.principal import Principal
from floom.store.db import database_clock, session_scope
from floom.store.models import ApiKey, new_id
from floom.store.web_sessions import WebSession

if TYPE_CHECKING:
    from floom.services.context import Context

SESSION_LIFETIME = timedelta(hours=12)


@dataclass(frozen=True)
class SignedIn:
    """A live session and the API key whose scopes bound what it may do."""

    session: WebSession
    key: ApiKey

    @property
    def caller(self) -> Principal:
        """The session's API key as the caller of the services its pages use."""
        return Principal.of_key(self.key, surface="ui")

    def can(self, scope: str) -> bool:
        return self.caller.can(scope)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def sign_in(ctx: Context, *, api_key: str) -> tuple[SignedIn, str]:
    """Check the API key and open a session; returns it with the token for the cookie."""
    key = keys.authenticate(ctx, api_key.strip() or None)
    token = secrets.token_urlsafe(32)
    # On the database's clock: any node may be asked for the session, each judges it there.
    now = database_clock(ctx.engine).now()
    row = WebSession(
        id=new_id("ses"),
        token_hash=_hash(token),
        key_id=key.id,
        csrf_token=secrets.token_urlsafe(32),
        created_at=now,
        expires_at=now + SESSION_LIFETIME,
    )
    with session_scope(ctx.engine, write=True) as s:
        # Expired rows are dead weight; sign-ins are rare enough to sweep them here.
        s.exec(delete(WebSession).where(col(WebSession.expires_at) < now))
        s.add(row)
    return SignedIn(session=row, key=key), token


def session_for(ctx: Context, *, token: str | None) -> SignedIn:
    """The live session of a cookie token; Unauthorized when there is none."""
    if not token:
        raise Unauthorized("you are not signed in", hint="sign in with an API key")
    with session_scope(ctx.engine) as s:
        row = s.exec(select(WebSession).where(WebSession.token_hash == _hash(token))).first()
        key = s.get(ApiKey, row.key_id) if row is not None else None
    if row is None or key is None or row.expires_at <= database_clock(ctx.engine).now():
        raise Unauthorized("your session ended", hint="sign in again with an API key")
    if key.revoked_at is not None:
        raise Unauthorized(
            "the API key of this session was revoked", hint="sign in with a valid API key"
        )
    return SignedIn(session=row, key=key)


def sign_out(ctx: Context, *, session_id: str) -> None:
    with session_scope(ctx.engine, write=True) as s:
        row = s.get(WebSession, session_id)
        if row is not None:
            s.delete(row)


def check_csrf(signed_in: SignedIn, *, token: str | None) -> None:
    """Refuse a form that does not carry this session's CSRF token."""
    if not token or not hmac.compare_digest(token, signed_in.session.csrf_token):
        raise Forbidden(
            "the form was not sent from this floom page (CSRF token missing or stale)",
            hint="reload the page and submit the form again",
        )
