"""How a module's router joins the app: its routes are added as they are, not included; and
which paths never reach a route."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI

from floom.api.errors import error_response


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
    app.router.routes.extend(router.routes)


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
