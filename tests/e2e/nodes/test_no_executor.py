"""A cluster without an executor (what `docker compose up` without a profile starts) does not
queue runs silently: a run queued then says in its log that no node can run it and how to
start one, `floom doctor` on such a node says so too, and the run starts once an executor
joins."""

from __future__ import annotations

import html
from pathlib import Path

import httpx

from floom.hints.cli import written
from floom.services.ops import doctor
from floom.services.ops.nodes import NO_EXECUTOR
from tests.support.harness import (
    deploy_folder,
    fast_settings,
    live_server,
    make_worker,
    wait_for_run,
)
from tests.support.web import signed_in_client

API_ONLY = "api,scheduler"


def system_lines(api: httpx.Client, run_id: str) -> list[str]:
    events = api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]
    return [e["line"] for e in events if e["stream"] == "system"]


def test_a_run_queued_without_an_executor_says_so_and_starts_when_one_joins(
    tmp_path: Path,
) -> None:
    database = f"sqlite:///{tmp_path / 'floom.db'}"
    folder = make_worker(
        tmp_path / "w",
        "name: hi\nentry: run.py\n",
        {"run.py": "import json; json.dump({'outputs': {'ok': 1}}, open('result.json', 'w'))\n"},
    )
    api_node_settings = fast_settings(tmp_path / "api", database, roles=API_ONLY)
    with (
        live_server(tmp_path / "api", database, roles=API_ONLY) as api_node,
        api_node.client() as api,
    ):
        deploy_folder(api, folder)
        waiting = api.post("/api/v1/workers/hi/runs", json={}).json()
        assert waiting["status"] == "queued"
        said = [
            line
            for line in system_lines(api, waiting["id"])
            if line.startswith(f"{NO_EXECUTOR}, so no node can run this run now")
        ]
        assert len(said) == 1, said
        assert "`floom serve --roles executor`" in said[0]
        assert "COMPOSE_PROFILES=bwrap or e2b" in said[0]
        browser = signed_in_client(api_node, api_node.admin_key)
        try:
            page = browser.get(f"/runs/{waiting['id']}").text
        finally:
            browser.close()
        assert f"{NO_EXECUTOR}, so no node can run this run now" in html.unescape(page)
        check = doctor.check_executors(api_node_settings)
        assert (check.status, check.name) == (doctor.FAIL, "executors")
        assert NO_EXECUTOR in check.detail
        assert "COMPOSE_PROFILES" in written(check.fix)

        with live_server(tmp_path / "executor", database, roles="executor"):
            assert wait_for_run(api, waiting["id"])["status"] == "succeeded"
            check = doctor.check_executors(api_node_settings)
            assert check.status == doctor.OK, check
            assert "1 live executor" in check.detail
            second = api.post("/api/v1/workers/hi/runs", json={}).json()
            assert wait_for_run(api, second["id"])["status"] == "succeeded"
            assert not [
                line for line in system_lines(api, second["id"]) if line.startswith(NO_EXECUTOR)
            ]


def test_a_node_with_the_executor_role_passes_the_doctor_check(tmp_path: Path) -> None:
    settings = fast_settings(tmp_path, f"sqlite:///{tmp_path / 'none.db'}")
    assert doctor.check_executors(settings).status == doctor.OK
