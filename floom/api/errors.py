"""The one place where errors become HTTP responses: {"error": {"code", "message", "hint"}}."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import IntegrityError
from starlette.exceptions import HTTPException

from floom import jsonvalues
from floom.api.auth import request_surface
from floom.errors import BlobStoreUnavailable, FloomError, RateLimited, RowLocked, quoted
from floom.hints import rest as hint_rest
from floom.hints.surface import render
from floom.services.access.principal import Principal, Surface
from floom.store.db import UNAVAILABLE, store_unavailable

log = logging.getLogger("floom.api")

# A refusal of a request's shape names its first few problems, not thousands.
SHOWN_PROBLEMS = 5


def error_response(status: int, code: str, message: str, hint: str | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"code": code, "message": message, "hint": hint}}
    )


def floom_error_response(
    exc: FloomError,
    *,
    surface: Surface = "cli",
    lacked: Callable[[hint_rest.Request], str | None] | None = None,
) -> JSONResponse:
    """A FloomError in the one error shape, with the headers its status calls for; its
    message and hint name what `surface` offers (REST requests, MCP tools, CLI commands),
    and with `lacked`, its hint the scope a recommended request needs that the caller lacks."""
    body = exc.to_dict()
    body["message"], body["hint"] = (
        render(exc.said, surface=surface),
        render(exc.advice, surface=surface, lacked_request=lacked),
    )
    if exc.details is not None:
        body["details"] = exc.details_for(lambda told: render(told, surface=surface))
    response = JSONResponse(status_code=exc.status, content={"error": body})
    if isinstance(exc, RateLimited | BlobStoreUnavailable | RowLocked) and isinstance(
        exc.details, dict
    ):
        response.headers["Retry-After"] = str(exc.details.get("retry_after_seconds", 1))
    return response


# The framework's own refusals, under floom's codes: 400 is a body it could not parse.
_HTTP_REFUSALS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request", "send a JSON body (see /docs for its shape), or none"),
    404: ("not_found", "see /docs for the routes"),
    405: ("method_not_allowed", "see /docs for the routes"),
}


def install(app: FastAPI) -> None:
    @app.exception_handler(FloomError)
    async def _floom(request: Request, exc: FloomError) -> JSONResponse:
        surface = request_surface(request)
        lacked = _lacked(request) if surface == "rest" else None
        return floom_error_response(exc, surface=surface, lacked=lacked)

    # Driver errors that escaped the store's own translation (store/db.py): a database that
    # cannot be reached is the operator's to fix, not a bug; a unique row that a concurrent
    # request wrote first is the caller's to retry.
    for unavailable in UNAVAILABLE:

        @app.exception_handler(unavailable)
        async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
            log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
            return floom_error_response(store_unavailable(exc), surface=request_surface(request))

    @app.exception_handler(IntegrityError)
    async def _integrity(request: Request, exc: IntegrityError) -> JSONResponse:
        log.warning("integrity error on %s %s: %s", request.method, request.url.path, exc)
        return error_response(
            409,
            "conflict",
            "the change conflicts with one made at the same moment",
            "read the current state and try again",
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        errors = exc.errors()
        for err in errors[:SHOWN_PROBLEMS]:
            where = quoted(".".join(str(p) for p in err.get("loc", ()) if p != "body"))
            said = (
                "not a field of this request (misspelt?)"
                if err.get("type") == "extra_forbidden"
                else err.get("msg")
            )
            problems.append(f"{where or 'body'}: {said}")
        if len(errors) > SHOWN_PROBLEMS:
            problems.append(f"and {len(errors) - SHOWN_PROBLEMS} more")
        return error_response(
            422,
            "invalid_request",
            "the request is not valid: " + "; ".join(problems),
            "see the API reference at /docs for the expected shape",
        )

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        code, hint = _HTTP_REFUSALS.get(exc.status_code, ("http_error", None))
        if exc.status_code == 405 and exc.headers and "Allow" in exc.headers:
            hint = f"this path answers {exc.headers['Allow']}; see /docs"
        message = str(exc.detail)
        why = _unparsable(exc.__cause__)
        if why:
            message, hint = f"{message}: the JSON body {why}", jsonvalues.bounds_hint()
        response = error_response(exc.status_code, code, message, hint)
        # HTTP requires some of these (Allow with a 405); keep whatever the router set.
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(
            500, "internal", "floom hit an unexpected error", "the server log has the details"
        )


def _unparsable(cause: BaseException | None) -> str | None:
    # FastAPI answers 400 for a body its JSON parser gave up on; say which limit it was.
    if isinstance(cause, RecursionError):
        return f"nests too deep (floom keeps at most {jsonvalues.MAX_DEPTH} levels)"
    if isinstance(cause, ValueError) and jsonvalues.LONE_SURROGATE in str(cause):
        return str(cause)
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return f"holds an integer of more than {jsonvalues.MAX_INT_DIGITS} digits"
    return None


def _lacked(request: Request) -> Callable[[hint_rest.Request], str | None] | None:
    """The scope a request a hint recommends needs, when the key of `request` lacks it; None
    when the request was refused before its key was known."""
    caller: Principal | None = getattr(request.state, "floom_caller", None)
    if caller is None:
        return None
    routes = _route_scopes(request.app)

    def lacked(recommended: hint_rest.Request) -> str | None:
        path = f"{hint_rest.API}/{recommended.path}".split("?", 1)[0]
        for method, pattern, scope in routes:
            if method == recommended.method and pattern.match(path):
                return None if caller.can(scope) else scope
        return None

    return lacked


def _route_scopes(app: FastAPI) -> list[tuple[str, re.Pattern[str], str]]:
    """Each API route's method, path pattern and the scope its key dependency requires."""
    known: list[tuple[str, re.Pattern[str], str]] | None = getattr(app.state, "route_scopes", None)
    if known is None:
        known = [
            (method, route.path_regex, scope)
            for route in app.routes
            if isinstance(route, APIRoute) and (scope := _scope_of(route)) is not None
            for method in route.methods or ()
        ]
        app.state.route_scopes = known
    return known


def _scope_of(route: APIRoute) -> str | None:
    pending = list(route.dependant.dependencies)
    while pending:
        dependency = pending.pop()
        scope = getattr(dependency.call, "scope", None)
        if isinstance(scope, str):
            return scope
        pending.extend(dependency.dependencies)
    return None
