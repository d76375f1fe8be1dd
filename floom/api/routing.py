"""How a module's router joins the app: its routes are added as they are, not included; and
which paths never reach a route."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, get_args

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel

from floom import jsonvalues
from floom.api.errors import error_response


class CheckedJSONRequest(Request):
    """A request whose JSON body is refused (ValueError, which FastAPI answers 400 and
    floom.api.errors words) when it holds a lone UTF-16 surrogate escape (`"\\ud800"`):
    Python's parser takes it, but it is no character, and the first encoding of it (a size
    check, the database, an answer) failed with a 500."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            value = json.loads(body)
            where = jsonvalues.lone_surrogate(value, where="body", text=body)
            if where is not None:
                raise ValueError(jsonvalues.lone_surrogate_said(where))
            self._json = value
        return self._json


class JSONRoute(APIRoute):
    """The route class of every API router: their JSON bodies are read by CheckedJSONRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            return await handler(CheckedJSONRequest(request.scope, request.receive))

        return checked


def add_routes(app: FastAPI, router: APIRouter) -> None:
    """Serve `router`'s routes from `app`, the same route objects.

    FastAPI's include_router builds every included route's state a second time (dependants,
    the request and response model fields with their pydantic validators and serializers;
    lazily, at the first request, in FastAPI 0.165) while the router keeps its own: about
    5 MiB resident for floom's API, held by every server from its first request on. floom's
    routers carry their full paths, tags and route class, and no dependencies, responses or
    callbacks of their own, so the app can serve their routes directly: same paths, same
    OpenAPI document. What this gives up is include_router's per-inclusion settings and
    `app.dependency_overrides` on these routes, which floom does not use.
    """
    for route in router.routes:
        if (
            isinstance(route, APIRoute)
            and route.path.startswith(_API_PATHS)
            and not isinstance(route, JSONRoute)
        ):
            raise TypeError(f"{route.path}: an API route's class is JSONRoute")
        if isinstance(route, APIRoute) and (loose := _loose_body(route)) is not None:
            raise TypeError(f"{route.path}: its body model {loose} must refuse unknown fields")
    app.router.routes.extend(router.routes)


def _loose_body(route: APIRoute) -> str | None:
    """The name of a body model of `route` that takes fields it does not have, or None: a
    misspelt field must be refused (422 naming it), not dropped while the request goes on
    with the default (`{"versin_id": ...}` rolling back to the previous version)."""
    field = route.body_field
    if field is None:
        return None
    for model in _models_in(getattr(field.field_info, "annotation", None)):
        if model.model_config.get("extra") != "forbid":
            return model.__name__
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


class EncodedSlashGuard:
    """Answers 404 `not_found` for an API path whose trailing '/' was sent encoded (`%2F`).

    The router matches the decoded path, and would redirect one ending in '/' to the path
    without it: `PUT /api/v1/secrets/X%2F` would be sent on to set the secret X. A name that
    ends in an encoded '/' names nothing; no route is asked."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["path"].endswith("/")
            and scope["path"].startswith(_API_PATHS)
            and not scope.get("raw_path", b"/").split(b"?", 1)[0].endswith(b"/")
        ):
            response = error_response(
                404,
                "not_found",
                "no such path: a name in it ends in an encoded '/'",
                "see /docs for the routes",
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


_API_PATHS = ("/api/", "/hooks/")
