"""Secrets (names only: a value is never answered) and API keys."""

from __future__ import annotations

from pydantic import Field
from pydantic.config import JsonDict

from floom.schemas.common import Page, Public, Timestamp
from floom.services.access import keys, secrets
from floom.services.access.principal import SCOPES, Principal
from floom.services.context import Context
from floom.store.models import ApiKey

SCOPE_SCHEMA: JsonDict = {"enum": list(SCOPES)}
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


class KeyCreated(KeyPublic):
    key: str = Field(description="the key itself: shown only in this answer")


def secret_page(ctx: Context, *, caller: Principal) -> Page[SecretPublic]:
    items = [SecretPublic.model_validate(s) for s in secrets.list_secrets(ctx, caller=caller)]
    return Page[SecretPublic](items=items, next_cursor=None)


def key_public(key: ApiKey) -> KeyPublic:
    return KeyPublic.model_validate(keys.key_to_dict(key))


def key_created(key: ApiKey, token: str) -> KeyCreated:
    return KeyCreated.model_validate({**keys.key_to_dict(key), "key": token})


def key_page(ctx: Context, *, caller: Principal) -> Page[KeyPublic]:
    items = [key_public(k) for k in keys.list_keys(ctx, caller=caller)]
    return Page[KeyPublic](items=items, next_cursor=None)
