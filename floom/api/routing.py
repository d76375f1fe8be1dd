"""How a module's router joins the app: its routes are added as they are, not included."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI


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
