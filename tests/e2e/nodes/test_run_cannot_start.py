"""A node set without the executor role (docker compose with no profile) runs nothing: the
run's starter, its page and `floom doctor` say that no node can run it, and what starts one."""

from __future__ import annotations

from pathlib import Path

from floom.hints.cli import written
from floom.services.ops.doctor import FAIL, OK, check_executors
from tests.support.cli import cli
from tests.support.harness import EXAMPLES, deploy_folder, live_server
from tests.support.web import signed_in_client


def test_a_run_no_live_node_can_start_says_so_until_an_executor_starts(
    tmp_path: Path, database_url: str
) -> None:
    with (
        live_server(tmp_path / "api", database_url, roles="api,scheduler") as node,
        node.client() as api,
    ):
        deploy_folder(api, EXAMPLES / "hello")
        started = api.post("/api/v1/workers/hello/runs", json={})
        assert started.status_code == 202
        said = started.json()["cannot_start"]
        assert "no live floom node has the executor role" in said
        assert "COMPOSE_PROFILES" in said
        run_id = started.json()["id"]
        assert "no live floom node" in api.get(f"/api/v1/runs/{run_id}").json()["cannot_start"]
        # Told in each reader's terms: to a REST client, whose API cannot start a node, the
        # command is the operator's at the server's host.
        assert "`floom serve --roles executor` (an operator's command, run on the floom " in said

        typed = cli(node, "run", "hello")
        assert typed.returncode == 0, typed.stderr
        assert "no live floom node has the executor role" in typed.stderr
        assert "`floom serve --roles executor`, or" in typed.stderr
        page = signed_in_client(node, node.admin_key).get(f"/runs/{run_id}").text
        assert 'id="cannot-start"' in page
        assert "no live floom node" in page

        doctor = check_executors(node.ctx.settings)
        assert doctor.status == FAIL
        assert node.ctx.node_id in doctor.detail
        assert "executor" in written(doctor.fix)

        with live_server(tmp_path / "exec", database_url, roles="executor") as executor:
            assert check_executors(node.ctx.settings).status == OK
            assert "cannot_start" not in api.get(f"/api/v1/runs/{run_id}").json()
            assert executor.ctx.node_id in check_executors(node.ctx.settings).detail
