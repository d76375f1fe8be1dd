"""What the OpenAPI document says beyond the route signatures: the error answers each
operation can give, the constraints the services enforce on parameters, the bearer scheme,
and the error code catalogue. The document at /openapi.json is floom's REST contract."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Path, Query
from fastapi.openapi.utils import get_openapi

from floom import errors as floom_errors
from floom.manifest.schema import NAME_PATTERN
from floom.schemas.common import ErrorBody
from floom.schemas.handoffs import CONDITION
from floom.services.access import secrets

_MEANING = {
    400: "The request is not valid (the error's code says which rule it broke).",
    401: "No valid API key was sent.",
    403: "The API key lacks the scope (or, for handoffs, the role) this needs.",
    404: "The thing asked for does not exist, or this key may not see it.",
    409: "The request conflicts with the current state.",
    408: "The body did not arrive in time.",
    413: "The body is larger than the server accepts.",
    422: "The request does not match the documented shape or a declared limit.",
    429: "A limit was reached: this key's request rate, concurrent waits or open streams, "
    "this address's rate of requests without a valid key, or a worker's.",
    502: "Something floom sent to on the caller's behalf (an alert channel) did not take it.",
    503: "floom's database (or a service it needs) cannot be reached right now, or another "
    "node holds a row this needs (`row_locked`, with Retry-After).",
}

_WITH_BODY = frozenset({"post", "put", "patch", "delete"})
#: Every route behind an API key can answer these.
AUTHENTICATED = (401, 403, 429, 503)


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route: each status with the one error body."""
    wanted = sorted(set(statuses))
    documented: dict[int | str, dict[str, Any]] = {
        s: {"model": ErrorBody, "description": _MEANING[s]} for s in wanted
    }
    if 429 in documented:
        documented[429]["headers"] = {
            "Retry-After": {
                "description": "seconds until this key (or address) may send again",
                "schema": {"type": "integer"},
            }
        }
    return documented


def authed(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Error answers of a route behind an API key: the common ones plus `statuses`."""
    return errors(*AUTHENTICATED, *statuses)


# Parameters: the schema states the rules the services check (and answer 400 for), so a
# request that follows the document is not refused for a reason the document hides.
WorkerName = Annotated[
    str,
    Path(description="the worker's name", json_schema_extra={"pattern": NAME_PATTERN}),
]
SecretName = Annotated[
    str,
    Path(
        description="upper case letters, digits and '_'; names that change how programs "
        "load or run are refused (400 secret_name_refused): LD_*, PYTHON*, PATH, FLOOM_*, ...",
        json_schema_extra={"pattern": secrets.NAME_RE.pattern},
    ),
]
Cursor = Annotated[
    str | None, Query(description="the `next_cursor` of the previous page", max_length=200)
]
Limit = Annotated[int, Query(ge=1, le=500)]


def decimal(text: str | None, *, most: int) -> int | None:
    """`text` (a header, a form field) as a whole number from 0 to `most`, or None: ASCII
    digits only (`str.isdigit` also takes "²", which `int` refuses) and never more of them
    than `most` has (`int` refuses over 4,300): never an exception."""
    if not text or not (text.isascii() and text.isdigit()) or len(text) > len(str(most)):
        return None
    value = int(text)
    return value if value <= most else None


def enum_query(values: tuple[str, ...] | list[str], description: str) -> Any:
    """A query parameter the service checks against `values`."""
    return Query(None, description=description, json_schema_extra={"enum": list(values)})


def _document(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
        # One schema per model, as validated: the public models' wrap serializer (it leaves
        # out fields a body never had) returns `Any`, so their serialization schemas are
        # empty and the document would promise nothing about any answer.
        separate_input_output_schemas=False,
    )
    doc.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a floom API key (`floom keys create`); its scope decides what it may do",
    }
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            if path.startswith("/api/v1/"):
                operation["security"] = [{"apiKey": []}]
            # FastAPI documents its own validation body; floom's handler answers every
            # validation failure in the one error shape instead (api/errors.py).
            invalid = operation.get("responses", {}).get("422")
            if invalid and "HTTPValidationError" in str(invalid):
                invalid["description"] = _MEANING[422]
                invalid["content"] = {"application/json": {"schema": error_body}}
        for method, operation in operations.items():
            answers = operation.setdefault("responses", {})
            # The body limit (api/edge/bodies.py) answers any method that may carry a body,
            # before routing, whether or not the route reads one.
            if method in _WITH_BODY:
                answers.setdefault("413", _error_answer(413))
            # A path whose segment names nothing (one holding an encoded '/', say) is
            # matched by no route.
            if "{" in path:
                answers.setdefault("404", _error_answer(404))
    schemas = doc["components"].setdefault("schemas", {})
    schemas["HandoffCondition"] = CONDITION
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    doc["x-error-codes"] = floom_errors.catalogue()
    doc["x-run-error-codes"] = floom_errors.run_error_catalogue()
    app.openapi_schema = doc
    return doc


def _error_answer(status: int) -> dict[str, Any]:
    return {
        "description": _MEANING[status],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }


def install(app: FastAPI) -> None:
    """Serve the customised document at /openapi.json (and so at /docs)."""
    app.openapi = lambda: _document(app)  # type: ignore[method-assign]
