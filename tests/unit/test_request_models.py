"""One request model per operation with several parameters: the REST route takes it (as its
body, or builds it from its query), the client sends it, both MCP backends take it, and the
tools and the CLI build it; no surface restates the parameters as its own dict or keywords."""

from __future__ import annotations

import inspect
import json
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from floom.api.routes import alerts as alert_routes
from floom.api.routes import handoffs as handoff_routes
from floom.api.routes import replays as replay_routes
from floom.api.routes import runs as run_routes
from floom.client.handoffs import HandoffClient
from floom.client.rest import FloomClient
from floom.client.wire import start_body
from floom.mcp.backends.base import Backend
from floom.mcp.backends.local import LocalBackend
from floom.mcp.backends.rest import RestBackend
from floom.mcp.errors import describe
from floom.mcp.tools import alerts as alert_tools
from floom.mcp.tools import core as core_tools
from floom.mcp.tools import handoffs as handoff_tools
from floom.mcp.tools import replays as replay_tools
from floom.schemas.alerts import DeliveryQuery
from floom.schemas.handoffs import JobRequest
from floom.schemas.replays import EvalStart
from floom.schemas.runs import RunRequest

# (model, the route's module, its path)
BODIES = [
    (RunRequest, run_routes, "/api/v1/workers/{name}/runs"),
    (EvalStart, replay_routes, "/api/v1/workers/{name}/evals"),
    (JobRequest, handoff_routes, "/api/v1/handoffs/jobs"),
]


def _route(module: Any, path: str, method: str) -> APIRoute:
    found = [
        r
        for r in module.router.routes
        if isinstance(r, APIRoute) and r.path == path and method in (r.methods or ())
    ]
    assert len(found) == 1, f"{method} {path}"
    return found[0]


@pytest.mark.parametrize(("model", "module", "path"), BODIES)
def test_the_rest_route_takes_the_request_model_as_its_body(
    model: type[BaseModel], module: Any, path: str
) -> None:
    route = _route(module, path, "POST")
    assert route.body_field is not None
    assert route.body_field.field_info.annotation is model


@pytest.mark.parametrize(
    "method", ["start_run", "start_eval", "handoff_create_job", "alert_deliveries"]
)
def test_both_mcp_backends_take_the_request_model(method: str) -> None:
    models = {
        "start_run": "RunRequest",
        "start_eval": "EvalStart",
        "handoff_create_job": "JobRequest",
        "alert_deliveries": "DeliveryQuery",
    }
    for backend in (Backend, LocalBackend, RestBackend):
        params = inspect.signature(getattr(backend, method)).parameters.values()
        annotations = [str(p.annotation) for p in params]
        assert models[method] in annotations, f"{backend.__name__}.{method}: {annotations}"
        # No catch-all keywords that would let a surface pass its own set of parameters.
        assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params)


def test_the_delivery_filters_of_the_route_are_the_query_model() -> None:
    route = _route(alert_routes, "/api/v1/alerts/deliveries", "GET")
    names = {p.name for p in route.dependant.query_params}
    assert names == set(DeliveryQuery.model_fields)


@pytest.mark.parametrize(
    ("tool", "model"),
    [
        (core_tools.run_worker, RunRequest),
        (replay_tools.eval_worker, EvalStart),
        (handoff_tools.handoff_create_job, JobRequest),
        (alert_tools.list_alert_deliveries, DeliveryQuery),
    ],
)
def test_an_mcp_tool_names_its_parameters_as_the_model_does(
    tool: Any, model: type[BaseModel]
) -> None:
    # What the tool adds of its own is how it waits, and where it runs (worker).
    own = {"ctx", "worker", "wait_seconds"}
    params = set(inspect.signature(tool).parameters) - own
    assert params <= set(model.model_fields), params - set(model.model_fields)


class Recorder:
    """A transport that answers every request with `answer` and keeps what was sent."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sent: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return httpx.Response(200, json=self.answer)

    def client(self) -> FloomClient:
        return FloomClient(
            "http://floom.test", "key", transport=httpx.MockTransport(self), surface="cli"
        )


def test_the_client_sends_an_eval_start_as_its_body() -> None:
    rec = Recorder({})
    with rec.client() as client, pytest.raises(ValidationError):
        # The empty answer is refused; what was sent is what counts here.
        client.start_eval("w", EvalStart(runs="last:3", model="m"))
    assert json.loads(rec.sent[0].content) == {"runs": "last:3", "model": "m"}
    assert rec.sent[0].url.path == "/api/v1/workers/w/evals"


def test_the_client_sends_a_job_request_as_its_body() -> None:
    rec = Recorder({})
    with rec.client() as client, pytest.raises(ValidationError):
        HandoffClient(client).create_job(JobRequest(summary="s", role="r", priority="high"))
    body = json.loads(rec.sent[0].content)
    assert body == JobRequest(summary="s", role="r", priority="high").model_dump(exclude_none=True)
    assert "idempotency_key" not in body


def test_the_client_sends_a_run_request_and_waits_by_query() -> None:
    rec = Recorder({})
    start = RunRequest(inputs={"a": 1}, force=True, callback_url="https://example.com/cb")
    with rec.client() as client, pytest.raises(ValidationError):
        client.start_run("w", start, wait=5, until="settled")
    sent = rec.sent[0]
    assert json.loads(sent.content) == start.model_dump(exclude_none=True)
    assert dict(sent.url.params) == {"wait": "5", "until": "settled"}


def test_the_client_sends_delivery_filters_as_query_parameters() -> None:
    rec = Recorder({"items": [], "next_cursor": None})
    with rec.client() as client:
        page = client.list_alert_deliveries(DeliveryQuery(status="failed", limit=5))
    assert page.items == []
    assert dict(rec.sent[0].url.params) == {"status": "failed", "limit": "5"}


def test_the_quick_paths_start_body_is_a_run_request() -> None:
    body = start_body({"x": "1"}, coerce_strings=True, force=True)
    assert RunRequest.model_validate(body) == RunRequest(
        inputs={"x": "1"}, coerce_strings=True, force=True
    )


def test_a_request_model_refusing_a_tools_arguments_is_invalid_request() -> None:
    with pytest.raises(ValidationError) as refused:
        EvalStart(model="m" * 200)
    error = describe(refused.value)
    assert error.code == "invalid_request"
    assert "model" in error.message
