"""Secrets (names only: a value is never answered) and API keys, as answered."""

from __future__ import annotations

from floom.schemas.admin import KeyPublic, SecretPublic
from floom.schemas.common import Page
from floom.services.access import keys, secrets
from floom.services.access.principal import Principal
from floom.services.context import Context


def secret_page(ctx: Context, *, caller: Principal) -> Page[SecretPublic]:
    items = [SecretPublic.model_validate(s) for s in secrets.list_secrets(ctx, caller=caller)]
    return Page[SecretPublic](items=items, next_cursor=None)


def key_page(ctx: Context, *, caller: Principal) -> Page[KeyPublic]:
    items = [KeyPublic.of(k) for k in keys.list_keys(ctx, caller=caller)]
    return Page[KeyPublic](items=items, next_cursor=None)
