"""floom's errors: one root, stable codes a client rebuilds, driver errors translated."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import threading
from pathlib import Path

import psycopg
import pytest

import floom
from floom import errors
from floom.bundle import read_folder
from floom.errors import FloomError
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.workers import versions as workers
from tests.support.harness import EXAMPLES, PG_ADMIN_URL, LiveServer, deploy_folder, make_worker


def _floom_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(floom.__path__, "floom."):
        if ".migrations" in info.name or info.name.endswith(".__main__"):
            continue  # migrations are scripts of Alembic's; __main__ runs the CLI on import
        names.append(info.name)
    return names


def test_every_exception_class_in_floom_is_a_floom_error_with_its_own_code() -> None:
    outside = []
    for name in _floom_modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            if cls.__name__.startswith("_"):
                continue  # private to its module by name: it never reaches a caller
            if not issubclass(cls, FloomError):
                outside.append(f"{name}.{cls.__qualname__}")
    assert outside == []
    codes = [entry["code"] for entry in errors.catalogue()]
    assert len(codes) == len(set(codes))
    assert {"not_found", "forbidden", "store_unavailable", "tool_error"} <= set(codes)


def test_the_docs_list_every_error_code() -> None:
    page = Path(__file__).resolve().parents[3] / "docs" / "reference" / "error-codes.md"
    readme = page.read_text()
    for name in _floom_modules():
        importlib.import_module(name)  # registers every subclass
    missing = [e["code"] for e in errors.catalogue() if f"`{e['code']}`" not in readme]
    assert missing == []


def test_a_client_rebuilds_the_servers_error_class_from_its_code() -> None:
    rebuilt = errors.rebuild(status=404, code="not_found", message="no worker x", hint="deploy")
    assert type(rebuilt) is errors.NotFound
    assert (rebuilt.message, rebuilt.hint) == ("no worker x", "deploy")
    unknown = errors.rebuild(status=499, code="later_code", message="m")
    assert isinstance(unknown, errors.ClientError)
    assert (unknown.status, unknown.code) == (499, "later_code")


def test_concurrent_first_deploys_of_one_worker_make_one_version_and_no_error(
    ctx: Context, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "w",
        "name: racer\nentry: run.py\n",
        {"run.py": "print('hi')\n"},
    )
    archive = read_folder(folder, max_bytes=1 << 20).to_archive()
    barrier = threading.Barrier(4)
    outcomes: list[object] = []

    def deploy() -> None:
        barrier.wait()
        try:
            outcomes.append(workers.deploy(ctx, caller=SYSTEM, archive=archive))
        except Exception as exc:  # the assertion below names whatever went wrong
            outcomes.append(exc)

    threads = [threading.Thread(target=deploy) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(isinstance(o, workers.DeployResult) for o in outcomes), outcomes
    assert len({o.version.id for o in outcomes if isinstance(o, workers.DeployResult)}) == 1
    assert len(workers.list_versions(ctx, caller=SYSTEM, name="racer")) == 1


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_lost_database_answers_503_store_unavailable(server: LiveServer) -> None:
    with server.client() as api:
        assert api.get("/api/v1/workers").status_code == 200
        name = server.ctx.engine.url.database
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        server.ctx.engine.dispose()  # keys are cached; make every request reach the store
        resp = api.get("/api/v1/runs")
    assert resp.status_code == 503, resp.text
    error = resp.json()["error"]
    assert error["code"] == "store_unavailable"
    assert "FLOOM_DATABASE_URL" in error["hint"]


def test_a_megabyte_id_a_caller_sends_is_quoted_back_cut(
    server: LiveServer, tmp_path: Path
) -> None:
    # A version or role no one has, sent as 200,000 characters, was answered back whole in
    # the 404 (and so in every surface's error line).
    from tests.support.harness import deploy_folder

    api = server.client()
    deploy_folder(api, make_worker(tmp_path / "w", "name: w\n", {"run.py": "pass\n"}))
    big = "v" * 200_000
    for path, body in (
        ("/api/v1/workers/w/runs", {"version_id": big}),
        ("/api/v1/workers/w/rollback", {"version_id": big}),
        ("/api/v1/handoffs/jobs", {"summary": "x", "role": big}),
    ):
        resp = api.post(path, json=body)
        assert resp.status_code == 404, resp.text[:300]
        message = resp.json()["error"]["message"]
        assert "v" * errors.QUOTED_MOST + "..." in message
        assert len(resp.text) < 2000
    # And ids in a path: a run, key, eval, alert rule, channel or secret no one has.
    for method, path in (
        ("GET", "/api/v1/handoffs/jobs/{}"),
        ("GET", "/api/v1/runs/{}"),
        ("GET", "/api/v1/runs/{}/logs"),
        ("DELETE", "/api/v1/keys/{}"),
        ("GET", "/api/v1/evals/{}"),
        ("DELETE", "/api/v1/alerts/rules/{}"),
        ("DELETE", "/api/v1/alerts/channels/{}"),
        ("DELETE", "/api/v1/secrets/{}"),
        ("GET", "/api/v1/approvals/{}"),
        ("GET", "/api/v1/alerts/deliveries/{}"),
        ("GET", "/api/v1/deliveries/{}"),
    ):
        resp = api.request(method, path.format("j" * 20_000))
        assert resp.status_code in (400, 404), (path, resp.text[:300])
        assert len(resp.text) < 2000, (path, resp.text[:300])
    # Refused names too: a role name of 200,000 characters was answered back whole in its
    # 400, a secret name of 20,000 in the path likewise.
    for method, path, body in (
        ("POST", "/api/v1/roles", {"name": big}),
        ("PUT", f"/api/v1/secrets/{'S' * 20_000}", {"value": "a-long-enough-value"}),
    ):
        resp = api.request(method, path, json=body)
        assert resp.status_code == 400, resp.text[:300]
        assert len(resp.text) < 2000, resp.text[:300]


def test_every_json_body_of_the_api_refuses_a_field_it_does_not_have(
    server: LiveServer,
) -> None:
    """Each route's body, from the OpenAPI document: a misspelt field is a 422 naming it, not
    dropped while the request goes on with its default (`{"versin_id": ...}` rolled back to
    the previous version; `{"scope": ...}` made a key of the default scope)."""
    with server.client() as api:
        document = api.get("/openapi.json").json()
        walked = []
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                content = operation.get("requestBody", {}).get("content", {})
                if "application/json" not in content or path.startswith("/hooks/"):
                    continue
                url = re.sub(r"\{[^}]+\}", "x", path)
                resp = api.request(method.upper(), url, json={"surely_not_a_field": 1})
                walked.append(f"{method} {path}")
                assert resp.status_code == 422, (method, path, resp.status_code, resp.text[:200])
                message = resp.json()["error"]["message"]
                assert "surely_not_a_field: not a field of this request" in message, message
        assert len(walked) > 20, walked


def test_a_misspelt_field_of_a_request_body_is_refused_naming_it_and_nothing_runs(
    server: LiveServer,
) -> None:
    with server.client() as api:
        deploy_folder(api, EXAMPLES / "hello")
        # `input` for `inputs`: once, it ran with the defaults and answered 201.
        typo = api.post("/api/v1/workers/hello/runs", json={"input": {"name": "Ada"}})
        assert typo.status_code == 422, typo.text
        error = typo.json()["error"]
        assert error["code"] == "invalid_request"
        assert "input: not a field of this request (misspelt?)" in error["message"]
        assert api.get("/api/v1/runs").json()["items"] == []
        rule = {"name": "r", "events": ["run.failed"], "channels": ["x"], "chanels": ["y"]}
        assert api.post("/api/v1/alerts/rules", json=rule).status_code == 422
        # Thousands of them, with long names: a few are named, each name cut.
        many = {f"{'k' * 500}{i}": i for i in range(3000)}
        refused = api.post("/api/v1/workers/hello/runs", json={"inputs": {}, **many})
        assert refused.status_code == 422
        assert "and 2995 more" in refused.json()["error"]["message"]
        assert len(refused.text) < 2000
