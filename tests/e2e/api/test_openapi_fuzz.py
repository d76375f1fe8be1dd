"""A short fuzzing pass over every REST operation, as a caller the document does not expect:
no key, a key that is not floom's, a key of each scope; odd path segments, query values of
any type, bodies as documented, of any shape and over the size limit, in any media type.
Every answer's status must be one the document lists for the operation, and its body must
match the schema documented for that status (errors: the one error shape). Hypothesis draws
the requests (derandomized: the same ones each time); the whole pass takes about 10 s."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from tests.support.harness import LiveServer, live_server
from tests.support.openapi import seed_contract

EXAMPLES_PER_OPERATION = 15
EVENT_STREAM = "/api/v1/runs/{run_id}/logs/stream"
# Path parameters whose seeded value depends on the path, not only on the name.
ON_PATH = {
    ("/api/v1/runs/{run_id}/artifacts/{name}", "name"): "greeting.txt",
    ("/hooks/{worker}", "worker"): "gated",
    ("/api/v1/secrets/{name}", "name"): "CONTRACT_HOOK",
}
# Not "." or "..": clients resolve those before sending (RFC 3986), so they name another path.
ODD_SEGMENTS = ["%2F", "%2e%2e", "a" * 300, "ü", " ", "x;y", "0", "-1", "run_", "null"]
ODD_VALUES = ["", "0", "-1", "true", "null", "1e309", "NaN", "ü" * 3, "a" * 300, "[]", "{}"]
OVERSIZED = b"[" + b"0," * (2 * 1024 * 1024) + b"0]"
"""Over FLOOM_MAX_REQUEST_BYTES (4 MiB by default)."""
MEDIA = [
    "application/json; charset=utf-16",
    "application/json",
    "application/gzip",
    "text/plain",
    "multipart/form-data",
    None,
]


@dataclass
class Target:
    server: LiveServer
    client: httpx.Client
    document: dict[str, Any]
    seeds: dict[str, str]
    keys: dict[str, str | None]
    registry: Registry


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("fuzz")
    database = f"sqlite:///{tmp / 'floom.db'}"
    with live_server(
        tmp / "data", database, rate_limit_per_minute=0, anonymous_rate_limit_per_minute=0
    ) as server:
        with server.client() as api:
            seeds = seed_contract(server, api, tmp)
            made = {
                scope: api.post("/api/v1/keys", json={"scopes": [scope], "name": f"fuzz-{scope}"})
                for scope in ("read", "run", "deploy")
            }
            document = api.get("/openapi.json").json()
        _DOCUMENT.update(document)
        keys = {
            "admin": server.admin_key,
            **{scope: answer.json()["key"] for scope, answer in made.items()},
            "none": None,
            "foreign": "flk_not_a_key_of_this_server",
            "empty": "",
        }
        registry: Registry = Registry().with_resource(
            "floom:openapi", DRAFT202012.create_resource(document)
        )
        with httpx.Client(base_url=server.base_url, timeout=30, trust_env=False) as client:
            yield Target(server, client, document, seeds, keys, registry)


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for path, operations in sorted(document["paths"].items()):
        for method, operation in sorted(operations.items()):
            if path != EVENT_STREAM:
                found.append((path, method, operation))
    return found


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False),
        st.text(max_size=20),
        st.sampled_from(ODD_VALUES),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)
        ),
        max_leaves=12,
    )


def _body_for(operation: dict[str, Any]) -> st.SearchStrategy[tuple[bytes | None, str | None]]:
    if "requestBody" not in operation:
        return st.just((None, None))
    # A body as documented, one with the documented names holding values of any type, and
    # any JSON at all.
    schema = operation["requestBody"].get("content", {}).get("application/json", {})
    names = sorted(_property_names(schema.get("schema", {})))
    shaped = (
        st.dictionaries(st.sampled_from(names), _json_values(), max_size=len(names))
        if names
        else _json_values()
    )
    documented = _following(schema.get("schema", {}), 0)
    encoded = st.one_of(documented, shaped, _json_values()).map(lambda v: json.dumps(v).encode())
    raw = st.one_of(
        encoded, st.binary(max_size=40), st.just(b"{"), st.just(b""), st.just(OVERSIZED)
    )
    return st.tuples(raw, st.sampled_from(MEDIA))


_DOCUMENT: dict[str, Any] = {}
"""The module's OpenAPI document, for the strategies (set by the `target` fixture)."""


def _following(schema: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    """Values that follow `schema` roughly (types, enums, properties): they reach the rules
    behind the shape check."""
    ref = schema.get("$ref")
    if ref:
        return _following(_DOCUMENT["components"]["schemas"][ref.rsplit("/", 1)[1]], depth)
    if depth > 3:
        return st.none()
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([_following(option, depth + 1) for option in schema[key]])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {n: _following(properties[n], depth + 1) for n in sorted(required & set(properties))},
            optional={
                n: _following(p, depth + 1)
                for n, p in sorted(properties.items())
                if n not in required
            },
        )
    if kind == "array":
        return st.lists(_following(schema.get("items", {}), depth + 1), max_size=3)
    if kind == "integer":
        return st.integers(schema.get("minimum", -5), schema.get("maximum", 10**6))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False, min_value=-5, max_value=10**6)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.one_of(
            st.text(max_size=12),
            st.sampled_from(["reviewer", "gated", "hello", "CONTRACT_HOOK", "read", "run"]),
        )
    return _json_values()


def _property_names(schema: dict[str, Any]) -> set[str]:
    ref = schema.get("$ref")
    if ref:
        schema = _DOCUMENT["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return set(schema.get("properties", {}))


@st.composite
def _requests(draw: st.DrawFn, operation: dict[str, Any], path: str, target: Target) -> Any:
    caller = draw(st.sampled_from(sorted(target.keys)))
    url = path
    for parameter in operation.get("parameters", []):
        if parameter["in"] != "path":
            continue
        name = parameter["name"]
        seeded = ON_PATH.get((path, name)) or target.seeds.get(name, "x")
        value = draw(
            st.one_of(
                st.just(seeded),
                st.sampled_from(ODD_SEGMENTS),
                st.text(min_size=1, max_size=20).filter(lambda s: s not in (".", "..")),
            )
        )
        url = url.replace("{" + name + "}", quote(value, safe=""))
    query: dict[str, str] = {}
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "query" and draw(st.booleans()):
            value = draw(
                st.one_of(
                    _following(parameter.get("schema", {}), 0).map(
                        lambda v: v if isinstance(v, str) else json.dumps(v)
                    ),
                    st.sampled_from(ODD_VALUES),
                    st.integers(-(10**12), 10**12).map(str),
                    st.text(max_size=10),
                )
            )
            query[parameter["name"]] = value
    if "wait" in query:
        query["wait"] = "0"  # the fuzzer checks what comes back, not the patience
    body, media = draw(_body_for(operation))
    return caller, url, query, body, media


def _check(target: Target, path: str, method: str, operation: dict[str, Any], req: Any) -> str:
    """What is wrong with the answer to one request; "" when it matches the document."""
    caller, url, query, body, media = req
    headers = {}
    key = target.keys[caller]
    if key is not None:
        headers["Authorization"] = f"Bearer {key}".strip()
    if media:
        headers["Content-Type"] = media
    answer = target.client.request(method, url, params=query, content=body, headers=headers)
    shown = f"{method.upper()} {url} {query} as {caller}, {media}: {answer.status_code}"
    responses = operation["responses"]
    documented = responses.get(str(answer.status_code)) or responses.get("default")
    if documented is None:
        return f"{shown}: status not documented ({sorted(responses)}): {answer.text[:300]}"
    content = documented.get("content", {})
    answer_type = answer.headers.get("content-type", "").split(";")[0]
    if not answer.content:
        return ""
    media_type = answer_type if answer_type in content else _range_of(answer_type, content)
    if media_type is None:
        return f"{shown}: answered {answer_type}, documented {sorted(content)}"
    schema = content[media_type].get("schema")
    if answer_type != "application/json" or not schema:
        return ""
    try:
        found = answer.json()
    except ValueError:
        return f"{shown}: not JSON: {answer.text[:200]}"
    validator = jsonschema.Draft202012Validator(_resolvable(schema), registry=target.registry)
    problems = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
        for e in validator.iter_errors(found)
    ]
    if problems:
        return f"{shown}: body does not match its schema: {problems[:3]}"
    return ""


def _fuzz(target: Target, path: str, method: str, operation: dict[str, Any]) -> str:
    """The first mismatch hypothesis's requests to one operation met; "" for none."""
    found: list[str] = []

    @given(req=_requests(operation, path, target))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def exchange(req: Any) -> None:
        if not found:
            problem = _check(target, path, method, operation, req)
            if problem:
                found.append(problem)

    exchange()
    return found[0] if found else ""


def test_every_answer_to_a_fuzzed_request_is_documented_with_its_body_s_shape(
    target: Target,
) -> None:
    started = time.monotonic()
    findings: dict[str, str] = {}
    operations = _operations(target.document)
    for path, method, operation in operations:
        problem = _fuzz(target, path, method, operation)
        if problem:
            findings[f"{method.upper()} {path}"] = problem
    took = time.monotonic() - started
    assert not findings, "\n".join(findings.values())
    assert len(operations) >= 50
    # The pass stays short: about 7 s for 70 operations on a quiet 2-core machine.
    assert took < 60, f"the fuzzing pass took {took:.0f} s"


def test_the_fuzzer_sees_an_undocumented_status_and_a_body_of_another_shape(
    target: Target,
) -> None:
    # The checks themselves: a status the operation does not list, and a body that does not
    # match, are found.
    operation = {
        "responses": {"200": target.document["paths"]["/api/v1/workers"]["get"]["responses"]["200"]}
    }
    missing = _check(
        target, "/api/v1/workers", "get", operation, ("none", "/api/v1/workers", {}, None, None)
    )
    assert "status not documented" in missing
    shaped = {
        "responses": {"200": {"content": {"application/json": {"schema": {"type": "array"}}}}}
    }
    wrong = _check(
        target, "/api/v1/workers", "get", shaped, ("admin", "/api/v1/workers", {}, None, None)
    )
    assert "does not match" in wrong


def _range_of(answer_type: str, content: dict[str, Any]) -> str | None:
    """The media range of `content` (e.g. "text/*", "*/*") that `answer_type` falls in."""
    for declared in (f"{answer_type.split('/')[0]}/*", "*/*"):
        if declared in content:
            return declared
    return None


def _resolvable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its references to the document's components made absolute."""
    text = json.dumps(schema).replace('"#/components/', '"floom:openapi#/components/')
    found: dict[str, Any] = json.loads(text)
    return found


def test_a_name_ending_in_an_encoded_slash_is_not_found_and_never_redirected_to_another(
    target: Target,
) -> None:
    # Found by the pass: the router matched the decoded path and redirected `X%2F` to `X`,
    # so a client following the redirect would have set (or deleted) the secret X.
    auth = {"Authorization": f"Bearer {target.server.admin_key}"}
    kept = target.client.put(
        "/api/v1/secrets/FUZZ_KEEP", json={"value": "kept-value"}, headers=auth
    )
    assert kept.status_code == 200, kept.text
    for method, url, body in [
        ("PUT", "/api/v1/secrets/FUZZ_SLASH%2F", {"value": "slash-value"}),
        ("DELETE", "/api/v1/secrets/FUZZ_KEEP%2F", None),
        ("GET", "/api/v1/workers/gated/versions/x%2F", None),
        ("GET", "/api/v1/runs/x%2f", None),
    ]:
        answer = target.client.request(method, url, json=body, headers=auth)
        assert answer.status_code == 404, (url, answer.status_code, answer.text)
        assert answer.json()["error"]["code"] == "not_found"
    listed = target.client.get("/api/v1/secrets", headers=auth).json()["items"]
    names = [secret["name"] for secret in listed]
    assert "FUZZ_SLASH" not in names
    assert "FUZZ_KEEP" in names
    # A slash sent as itself is still sent on to the path without it.
    plain = target.client.get("/api/v1/workers/", headers=auth)
    assert plain.status_code == 307
