"""REST routes for secrets (names only ever returned) and API keys."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from floom.api.auth import AdminKey, CtxDep, DeployKey
from floom.services import keys, secrets

router = APIRouter(prefix="/api/v1", tags=["admin"])


class SecretValue(BaseModel):
    value: str = Field(description="the secret's value; stored encrypted, never returned")


class KeyRequest(BaseModel):
    scopes: list[str] = Field(default_factory=lambda: ["read"])
    name: str = ""


@router.get("/secrets")
def list_secrets(ctx: CtxDep, _: DeployKey) -> dict[str, Any]:
    return {"items": secrets.list_secrets(ctx), "next_cursor": None}


@router.put("/secrets/{name}")
def set_secret(name: str, body: SecretValue, ctx: CtxDep, _: DeployKey) -> dict[str, Any]:
    secrets.set_secret(ctx, name=name, value=body.value)
    return {"name": name, "set": True}


@router.delete("/secrets/{name}")
def delete_secret(name: str, ctx: CtxDep, _: DeployKey) -> dict[str, Any]:
    secrets.delete_secret(ctx, name=name)
    return {"name": name, "deleted": True}


@router.get("/keys")
def list_keys(ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return {"items": [keys.key_to_dict(k) for k in keys.list_keys(ctx)], "next_cursor": None}


@router.post("/keys", status_code=201)
def create_key(body: KeyRequest, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    key, token = keys.create_key(ctx, scopes=body.scopes, name=body.name)
    return {**keys.key_to_dict(key), "key": token}


@router.delete("/keys/{key_id}")
def revoke_key(key_id: str, ctx: CtxDep, _: AdminKey) -> dict[str, Any]:
    return keys.key_to_dict(keys.revoke_key(ctx, key_id=key_id))
