"""The web UI's sign-in and sign-out, and its secrets and API keys pages."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from floom.api.auth import CtxDep
from floom.errors import FloomError, Forbidden, Unauthorized
from floom.schemas import admin as admin_models
from floom.services.access import keys, secrets
from floom.services.access import sessions as web_sessions
from floom.services.access.principal import SCOPES
from floom.services.access.sessions import SignedIn
from floom.services.context import Context
from floom.ui.support import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SESSION_MAX_AGE,
    Me,
    UiRoute,
    checked_form,
    current_session,
    error_markup,
    new_login_token,
    render,
    safe_next,
    set_cookie,
    sign_cookie,
    unsign_cookie,
)
from floom.views import admin as admin_views

router = APIRouter(route_class=UiRoute, include_in_schema=False)

# How long a sign-in form left open still works (the token is renewed by every render).
LOGIN_MAX_AGE = 24 * 3600
NOTICES = {
    "secret-set": "Secret saved. Workers that declare it get it on their next run.",
    "secret-deleted": "Secret deleted.",
    "key-revoked": "API key revoked; it no longer signs in or calls the API.",
}


def _login_page(
    request: Request, ctx: Context, next_path: str, error: Any = None, status: int = 200
) -> Response:
    """The sign-in form, with a token in a cookie and in the form: a page on another site
    cannot read the cookie, so it cannot post a matching form (login CSRF). The browser's
    token is kept while it is valid, so every sign-in page it still shows (another tab, a
    page opened before) posts a token that matches."""
    current = unsign_cookie(ctx, "login", request.cookies.get(LOGIN_COOKIE), LOGIN_MAX_AGE)
    token = current or new_login_token()
    response = render(
        request,
        "login.html",
        {"login_token": token, "next": next_path, "login_error": error},
        status=status,
    )
    set_cookie(request, response, LOGIN_COOKIE, sign_cookie(ctx, "login", token), LOGIN_MAX_AGE)
    return response


@router.get("/login")
async def login_form(request: Request, ctx: CtxDep, next: str = "/") -> Response:
    try:
        await current_session(request)
        return RedirectResponse(safe_next(next), status_code=303)
    except Unauthorized:
        request.state.signed_in = None
    return _login_page(request, ctx, safe_next(next))


@router.post("/login")
async def login(request: Request, ctx: CtxDep) -> Response:
    form = await request.form()
    next_path = safe_next(str(form.get("next") or "/"))
    expected = unsign_cookie(ctx, "login", request.cookies.get(LOGIN_COOKIE), LOGIN_MAX_AGE)
    posted = str(form.get("csrf") or "")
    if not expected or not hmac.compare_digest(expected, posted):
        stale = Forbidden(
            "the sign-in form expired or was not sent from this floom page",
            hint="enter the API key again in this form",
        )
        return _login_page(request, ctx, next_path, error_markup(stale), status=403)
    try:
        _, token = await run_in_threadpool(
            web_sessions.sign_in, ctx, api_key=str(form.get("api_key") or "")
        )
    except FloomError as exc:
        return _login_page(request, ctx, next_path, error_markup(exc), status=exc.status)
    response = RedirectResponse(next_path, status_code=303)
    set_cookie(
        request, response, SESSION_COOKIE, sign_cookie(ctx, "session", token), SESSION_MAX_AGE
    )
    # The login cookie stays: another tab's sign-in form may still be posted.
    return response


@router.post("/logout")
async def logout(request: Request, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)
    await run_in_threadpool(web_sessions.sign_out, ctx, session_id=me.session.id)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# -- secrets ---------------------------------------------------------------------------------


def _secrets_page(
    request: Request, ctx: Context, me: SignedIn, extra: dict[str, Any], status: int = 200
) -> Response:
    items = admin_views.secret_page(ctx, caller=me.caller).items
    return render(request, "secrets.html", {"items": items, **extra}, status)


@router.get("/secrets")
def secrets_page(request: Request, ctx: CtxDep, me: Me, notice: str | None = None) -> Response:
    return _secrets_page(request, ctx, me, {"notice": NOTICES.get(notice or "")})


@router.post("/secrets")
async def set_secret(request: Request, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    name = str(form.get("name") or "").strip()
    try:
        value = str(form.get("value") or "")
        await run_in_threadpool(secrets.set_secret, ctx, name=name, value=value, caller=me.caller)
    except FloomError as exc:
        # The value is not echoed back into the page; the name is, to fix a typo.
        extra = {"form_error": error_markup(exc), "name": name}
        return await run_in_threadpool(_secrets_page, request, ctx, me, extra, exc.status)
    return RedirectResponse("/secrets?notice=secret-set", status_code=303)


@router.post("/secrets/{name}/delete")
async def delete_secret(request: Request, name: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)
    try:
        await run_in_threadpool(secrets.delete_secret, ctx, name=name, caller=me.caller)
    except FloomError as exc:
        extra = {"list_error": error_markup(exc)}
        return await run_in_threadpool(_secrets_page, request, ctx, me, extra, exc.status)
    return RedirectResponse("/secrets?notice=secret-deleted", status_code=303)


# -- API keys --------------------------------------------------------------------------------


def _keys_page(
    request: Request, ctx: Context, me: SignedIn, extra: dict[str, Any], status: int = 200
) -> Response:
    items = admin_views.key_page(ctx, caller=me.caller).items
    values = {"items": items, "scopes": SCOPES, **extra}
    return render(request, "keys.html", values, status)


@router.get("/keys")
def keys_page(request: Request, ctx: CtxDep, me: Me, notice: str | None = None) -> Response:
    return _keys_page(request, ctx, me, {"notice": NOTICES.get(notice or "")})


@router.post("/keys")
async def create_key(request: Request, ctx: CtxDep, me: Me) -> Response:
    form = await checked_form(request, me)
    name = str(form.get("name") or "").strip()
    scope = str(form.get("scope") or "")
    try:
        key, token = await run_in_threadpool(
            keys.create_key, ctx, scopes=[scope], name=name, caller=me.caller
        )
    except FloomError as exc:
        failed: dict[str, Any] = {"form_error": error_markup(exc), "name": name}
        return await run_in_threadpool(_keys_page, request, ctx, me, failed, exc.status)
    # Rendered, not redirected: the plaintext exists only in this one response.
    created: dict[str, Any] = {"created": admin_models.KeyPublic.of(key), "created_token": token}
    return await run_in_threadpool(_keys_page, request, ctx, me, created)


@router.post("/keys/{key_id}/revoke")
async def revoke_key(request: Request, key_id: str, ctx: CtxDep, me: Me) -> Response:
    await checked_form(request, me)
    try:
        await run_in_threadpool(keys.revoke_key, ctx, key_id=key_id, caller=me.caller)
    except FloomError as exc:
        extra = {"list_error": error_markup(exc)}
        return await run_in_threadpool(_keys_page, request, ctx, me, extra, exc.status)
    return RedirectResponse("/keys?notice=key-revoked", status_code=303)
