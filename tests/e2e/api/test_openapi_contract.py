"""The OpenAPI document is floom's REST contract: schemathesis sends every operation generated
requests (a fixed seed, a bounded number of examples) to the live server and fails on any
5xx, any status code the document does not list, and any body that does not match its
schema; a tour over seeded data checks the real bodies of every read the same way."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.transport.requests import ManagedCookiesSession

from tests.support.harness import LiveServer, live_server
from tests.support.openapi import seed_contract

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Examples per operation: about 60 operations in well under two minutes on two cores.
MAX_EXAMPLES = 50
# An event stream holds its connection until the run ends and has no JSON body to check;
# tests/e2e/api/test_api.py covers it end to end. Every other operation is fuzzed.
EVENT_STREAM = "/api/v1/runs/{run_id}/logs/stream"
# Path parameters whose seeded value depends on the path, not only on the name.
ON_PATH = {
    ("/api/v1/runs/{run_id}/artifacts/{name}", "name"): "greeting.txt",
    ("/hooks/{worker}", "worker"): "gated",
    ("/api/v1/secrets/{name}", "name"): "CONTRACT_HOOK",
}
FUZZ_WAIT = 1.0
# Only an agent run has a transcript, and an agent run needs a model provider stand-in
# (tests/integration/agent/test_agent_loop.py has one); here its documented 404 is checked instead.
# Likewise a replay (of an agent run) and an eval (of agent runs): their 404s are checked.
ANSWERS_404 = {
    "/api/v1/runs/{run_id}/transcript",
    "/api/v1/replays/{run_id}",
    "/api/v1/evals/{eval_id}",
}


@dataclass
class Contract:
    server: LiveServer
    seeds: dict[str, str]
    # One connection for thousands of requests instead of one each; schemathesis still drops
    # the cookies an answer sets before the next request, as with a session of its own.
    session: ManagedCookiesSession

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.server.admin_key}"}


@pytest.fixture(scope="module")
def contract(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    """One live server on SQLite for the module, without request rate limits, keyed or
    anonymous (the fuzzer sends far more than a client would, some of it without a key),
    seeded with one of each entity."""
    tmp = tmp_path_factory.mktemp("contract")
    database = f"sqlite:///{tmp / 'floom.db'}"
    with live_server(
        tmp / "data", database, rate_limit_per_minute=0, anonymous_rate_limit_per_minute=0
    ) as server:
        with server.client() as api:
            seeds = seed_contract(server, api, tmp)
        with ManagedCookiesSession() as session:
            session.trust_env = False  # no netrc or proxy look-ups on every request
            yield Contract(server=server, seeds=seeds, session=session)


@pytest.fixture
def api_schema(contract: Contract) -> Any:
    schema = schemathesis.openapi.from_url(f"{contract.server.base_url}/openapi.json")
    # Every request carries the admin key (Contract.auth), which replaces whatever
    # Authorization header the fuzzer made up: a quarter of its generating time, sent nowhere.
    schema.config.generation.update(with_security_parameters=False)
    return schema


def test_every_operation_answers_only_what_the_document_promises(
    api_schema: Any, contract: Contract
) -> None:
    # One hypothesis run per operation (schemathesis' lazy pytest loader does not work with
    # this pytest), so every finding is listed at once instead of the first one only.
    findings: dict[str, str] = {}
    fuzzed = 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if operation.path == EVENT_STREAM:
            continue
        fuzzed += 1
        try:
            _fuzz(operation, contract)
        except (AssertionError, FailureGroup) as exc:
            findings[operation.label] = str(exc)[:2000]
    assert not findings, "\n\n".join(f"{op}: {text}" for op, text in findings.items())
    assert fuzzed >= 50


def _fuzz(operation: Any, contract: Contract) -> None:
    strategies = [
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    ]
    # Requests about the seeded entities reach past "not found" into the real rules; a
    # deletion would take them away from the operations fuzzed after it.
    names = {p.name for p in operation.path_parameters}
    if names and operation.method.upper() != "DELETE":
        seeded = {n: ON_PATH.get((operation.path, n)) or contract.seeds[n] for n in sorted(names)}
        strategies.append(operation.as_strategy(path_parameters=seeded))

    @given(case=st.one_of(strategies))
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def exchange(case: Any) -> None:
        # A start may wait up to 60 s for its run (a gated one waits for a person): the
        # fuzzer checks what comes back, not the patience, so its waits are short.
        wait = (case.query or {}).get("wait")
        if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > FUZZ_WAIT:
            case.query["wait"] = FUZZ_WAIT
        response = case.call(session=contract.session, headers=contract.auth(), timeout=30)
        case.validate_response(response, checks=CHECKS)

    exchange()


def test_every_read_of_seeded_data_matches_its_schema(api_schema: Any, contract: Contract) -> None:
    checked = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() != "GET" or operation.path == EVENT_STREAM:
            continue
        params = {
            p.name: ON_PATH.get((operation.path, p.name)) or contract.seeds[p.name]
            for p in operation.path_parameters
        }
        case = operation.Case(path_parameters=params)
        response = case.call(session=contract.session, headers=contract.auth(), timeout=30)
        expected = 404 if operation.path in ANSWERS_404 else 200
        assert response.status_code == expected, (operation.path, response.text)
        case.validate_response(response, checks=CHECKS)
        checked.append(operation.path)
    assert "/api/v1/runs/{run_id}/artifacts/{name}" in checked
    assert len(checked) >= 25


def test_an_unsupported_method_answers_405_with_allow(contract: Contract) -> None:
    with contract.server.client() as api:
        for path in ("/api/v1/workers", "/api/v1/runs/run_x", "/api/v1/secrets/X"):
            resp = api.request("TRACE", path)
            assert resp.status_code == 405, (path, resp.text)
            assert resp.headers.get("allow"), path
            assert resp.json()["error"]["code"] == "method_not_allowed"


# JSON answers whose shape is open by nature: worker.yml's JSON Schema is itself the answer.
FREE_FORM_ANSWERS = {"/api/v1/manifest-schema"}


def test_the_document_describes_the_archive_bodies_every_answer_and_every_error(
    contract: Contract,
) -> None:
    doc = httpx.get(f"{contract.server.base_url}/openapi.json").json()
    for path in ("/api/v1/workers", "/api/v1/workers/validate"):
        content = doc["paths"][path]["post"]["requestBody"]["content"]
        assert content["application/gzip"]["schema"]["format"] == "binary"
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            # Every answer that is not a refusal has a declared shape (a route's response
            # model, or the stream or file it sends), never a free-form object.
            for status, answer in operation["responses"].items():
                if status.startswith("2"):
                    assert answer.get("content"), (method, path, status)
                    for media, body in answer["content"].items():
                        schema = body.get("schema", {})
                        if media != "application/json":
                            assert schema.get("type") == "string", (method, path, media)
                        elif path not in FREE_FORM_ANSWERS:
                            declared = {"$ref", "properties", "items", "anyOf", "oneOf"}
                            assert declared & set(schema), (method, path, status, schema)
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            documented = set(operation["responses"])
            assert {"401", "403", "429", "503"} <= documented, (method, path)
            for status, answer in operation["responses"].items():
                schema_ref = answer.get("content", {}).get("application/json", {}).get("schema")
                if status.startswith(("4", "5")):
                    assert schema_ref == {"$ref": "#/components/schemas/ErrorBody"}, (
                        method,
                        path,
                        status,
                    )
    # A shape an answer refers to promises something: a model whose schema came out empty
    # (its serializer returning Any) would leave every answer that uses it unchecked.
    empty = sorted(name for name, schema in doc["components"]["schemas"].items() if not schema)
    assert empty == [], f"component schemas that promise nothing: {empty}"
    assert httpx.get(f"{contract.server.base_url}/docs").status_code == 200


def test_a_routing_rule_whose_priority_is_not_text_is_refused_not_a_server_error(
    contract: Contract,
) -> None:
    # Found by the fuzzer: a list as a rule's priority reached a dict lookup and gave a 500.
    with contract.server.client() as api:
        job = {"summary": "s", "role": "reviewer", "routing": [{"role": "x", "priority": []}]}
        resp = api.post("/api/v1/handoffs/jobs", json=job)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_request"


def test_a_rate_limited_answer_matches_the_documented_429(api_schema: Any, tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'floom.db'}"
    limits = {"rate_limit_per_minute": 1, "rate_limit_burst": 1}
    with live_server(tmp_path / "data", database, **limits) as server:
        case = api_schema["/api/v1/workers"]["GET"].Case()
        auth = {"Authorization": f"Bearer {server.admin_key}"}
        assert case.call(base_url=server.base_url, headers=auth).status_code == 200
        limited = case.call(base_url=server.base_url, headers=auth)
    assert limited.status_code == 429
    assert limited.headers["retry-after"][0].isdigit()
    case.validate_response(limited, checks=CHECKS)


def test_a_body_that_cannot_be_parsed_is_an_invalid_request(contract: Contract) -> None:
    with contract.server.client() as api:
        resp = api.post(
            "/api/v1/workers/gated/pause",
            content=b"\xff",
            headers={"Content-Type": "application/json"},
        )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["hint"]
