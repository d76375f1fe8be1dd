"""The web UI's sign-in sessions: one row per browser sign-in, found by a hash of its token."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from floom.store.models import UTCDateTime, utcnow


class WebSession(SQLModel, table=True):
    """A browser signed in with an API key. The key's plaintext is never stored; the row
    points at the key, so revoking the key ends every session made with it."""

    __tablename__ = "web_sessions"
    id: str = Field(primary_key=True, max_length=40)
    # sha256 of the random token the browser holds (signed) in its cookie.
    token_hash: str = Field(unique=True, max_length=64)
    key_id: str = Field(index=True, max_length=40)
    csrf_token: str = Field(max_length=64)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expires_at: datetime = Field(sa_type=UTCDateTime)
