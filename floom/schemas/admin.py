"""Secrets (names only: a value is never answered) and API keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from pydantic import Field
from pydantic.config import JsonDict

from floom.schemas.common import Public, Timestamp
from floom.vocabulary import Scope

if TYPE_CHECKING:
    from floom.store.models import ApiKey

SCOPE_SCHEMA: JsonDict = {"enum": list(Scope)}
# A request's scopes: each known, at least one (the services answer 400 otherwise).
SCOPE_LIST: JsonDict = {"items": SCOPE_SCHEMA, "minItems": 1}


class SecretPublic(Public):
    """A secret's name and times; there is no field for its value."""

    name: str
    created_at: Timestamp
    updated_at: Timestamp


class SecretSet(Public):
    name: str
    set: bool


class SecretDeleted(Public):
    name: str
    deleted: bool


class KeyPublic(Public):
    id: str
    name: str
    prefix: str = Field(description="the first characters of the key, to tell keys apart")
    scopes: list[str] = Field(json_schema_extra={"items": SCOPE_SCHEMA})
    agent_id: str | None
    created_at: Timestamp
    revoked_at: Timestamp | None

    @classmethod
    def of(cls, key: ApiKey, /, **extra: Any) -> Self:
        return cls(
            id=key.id,
            name=key.name,
            prefix=key.prefix,
            scopes=key.scopes.split(","),
            agent_id=key.agent_id,
            created_at=key.created_at,
            revoked_at=key.revoked_at,
            **extra,
        )


class KeyCreated(KeyPublic):
    key: str = Field(description="the key itself: shown only in this answer")
