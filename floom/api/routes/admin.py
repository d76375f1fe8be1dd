"""REST routes for secrets (names only ever returned) and API keys."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from floom.api.auth import AdminCaller, CtxDep, DeployCaller, ReadCaller
from floom.api.openapi import SecretName, authed
from floom.api.routing import JSONRoute
from floom.schemas import admin as admin_models
from floom.schemas.common import Page
from floom.services.access import keys, secrets
from floom.views import admin as views

router = APIRouter(prefix="/api/v1", tags=["admin"], route_class=JSONRoute)


class SecretValue(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    value: str = Field(
        description="the secret's value; stored encrypted, never returned",
        json_schema_extra={"minLength": secrets.MIN_VALUE_LENGTH},
    )


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    scopes: list[str] = Field(
        default_factory=lambda: ["read"],
        json_schema_extra=admin_models.SCOPE_LIST,
        description="each scope includes the ones before it: read, run, deploy, admin",
    )
    name: str = Field("", max_length=128)


@router.get("/secrets", response_model=Page[admin_models.SecretPublic], responses=authed())
def list_secrets(ctx: CtxDep, caller: DeployCaller) -> Page[admin_models.SecretPublic]:
    return views.secret_page(ctx, caller=caller)


@router.put("/secrets/{name}", response_model=admin_models.SecretSet, responses=authed(400, 422))
def set_secret(
    name: SecretName, body: SecretValue, ctx: CtxDep, caller: DeployCaller
) -> admin_models.SecretSet:
    secrets.set_secret(ctx, name=name, value=body.value, caller=caller)
    return admin_models.SecretSet(name=name, set=True)


@router.delete("/secrets/{name}", response_model=admin_models.SecretDeleted, responses=authed(404))
def delete_secret(
    name: SecretName, ctx: CtxDep, caller: DeployCaller
) -> admin_models.SecretDeleted:
    secrets.delete_secret(ctx, name=name, caller=caller)
    return admin_models.SecretDeleted(name=name, deleted=True)


@router.get(
    "/keys/me",
    summary="The key this request carries (never its value): name, scopes, agent",
    response_model=admin_models.KeyPublic,
    responses=authed(),
)
def my_key(ctx: CtxDep, caller: ReadCaller) -> admin_models.KeyPublic:
    return admin_models.KeyPublic.of(keys.get_key(ctx, key_id=caller.key_id or "", caller=caller))


@router.get("/keys", response_model=Page[admin_models.KeyPublic], responses=authed())
def list_keys(ctx: CtxDep, caller: AdminCaller) -> Page[admin_models.KeyPublic]:
    return views.key_page(ctx, caller=caller)


@router.post(
    "/keys", status_code=201, response_model=admin_models.KeyCreated, responses=authed(400, 422)
)
def create_key(body: KeyRequest, ctx: CtxDep, caller: AdminCaller) -> admin_models.KeyCreated:
    key, token = keys.create_key(ctx, scopes=body.scopes, name=body.name, caller=caller)
    return admin_models.KeyCreated.of(key, key=token)


@router.delete("/keys/{key_id}", response_model=admin_models.KeyPublic, responses=authed(404, 409))
def revoke_key(key_id: str, ctx: CtxDep, caller: AdminCaller) -> admin_models.KeyPublic:
    return admin_models.KeyPublic.of(keys.revoke_key(ctx, key_id=key_id, caller=caller))
