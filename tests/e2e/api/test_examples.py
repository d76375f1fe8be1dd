"""The example workers in workers/ run as shipped."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import httpx
import pytest

from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.triggers import registry as triggers
from floom.services.workers.examples import deploy_examples
from tests.support.harness import EXAMPLES, LiveServer, deploy_folder, wait_for_run
from tests.support.processes.netns import namespace_host, needs_netns


# A sandbox with network reaches public addresses only, and none of its own host's, so the
# stand-in runs on a test host: a public-range address in a network namespace of its own.
@needs_netns
def test_github_digest_summarises_a_repository_with_its_token(api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "github-digest")
    token = "ghp_standin_token_123"
    api.put("/api/v1/secrets/GITHUB_TOKEN", json={"value": token})
    with namespace_host(public=True) as public:
        argv = [sys.executable, "-m", "tests.standins.github", token, public.address]
        server = public.popen(argv, stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None
            url = server.stdout.readline().decode().strip()
            inputs = {"repo": "acme/api", "days": 3, "api_url": url}
            run_id = api.post("/api/v1/workers/github-digest/runs", json={"inputs": inputs}).json()[
                "id"
            ]
            run = wait_for_run(api, run_id, timeout=60)
            state = api.get("/api/v1/workers/github-digest/state").json()["state"]
            again = api.post("/api/v1/workers/github-digest/runs", json={"inputs": inputs})
            second = wait_for_run(api, again.json()["id"], timeout=60)
        finally:
            server.kill()
            out, _ = server.communicate(timeout=10)
    seen = [json.loads(line) for line in out.decode().splitlines() if line.startswith("[")]
    assert run["status"] == "succeeded", run
    assert run["outputs"]["commits"] == 2
    assert run["outputs"]["issues_opened"] == 1
    assert run["outputs"]["pulls_opened"] == 1
    assert run["outputs"]["summary"].startswith("acme/api: 2 commits")
    assert [a["name"] for a in run["artifacts"]] == ["digest.md"]
    digest = api.get(run["artifacts"][0]["url"]).text
    assert "a1b2c3d Fix the parser" in digest
    assert {auth for _, auth in seen} == {f"Bearer {token}"}
    logs = api.get(f"/api/v1/runs/{run_id}/logs").text
    assert token not in logs
    # The second digest starts where the first looked (the worker's state), not 3 days back.
    since = state["since"]["acme/api"]
    assert second["status"] == "succeeded", second
    assert second["outputs"]["summary"].endswith(f"since {since}")
    assert [p for p, _ in seen[2:]] == [
        f"/repos/acme/api/commits?since={since}&per_page=100",
        f"/repos/acme/api/issues?since={since}&state=all&per_page=100",
    ]


def test_github_digest_fails_clearly_without_its_secret(api: httpx.Client) -> None:
    deploy_folder(api, EXAMPLES / "github-digest")
    run_id = api.post(
        "/api/v1/workers/github-digest/runs", json={"inputs": {"repo": "acme/api"}}
    ).json()["id"]
    run = wait_for_run(api, run_id)
    assert run["status"] == "failed"
    assert run["error"]["code"] == "secret_missing"
    # A plain REST client is told the request that sets it.
    assert "`PUT /api/v1/secrets/GITHUB_TOKEN" in run["error"]["message"]


def test_a_fresh_install_deploys_the_examples_with_unready_schedules_paused(
    ctx: Context,
) -> None:
    names = deploy_examples(ctx)
    assert "github-digest" in names
    _, found = triggers.list_triggers(ctx, caller=SYSTEM, worker_name="github-digest")
    schedules = [t for t in found if t.kind == "schedule"]
    # GITHUB_TOKEN is not set: the daily digest must not act (or fail) on its own.
    assert schedules
    assert all(t.paused for t in schedules)


def test_an_example_whose_secrets_are_set_keeps_its_schedule_running(ctx: Context) -> None:
    secrets.set_secret(ctx, caller=SYSTEM, name="GITHUB_TOKEN", value="ghp_already_there")
    deploy_examples(ctx)
    _, found = triggers.list_triggers(ctx, caller=SYSTEM, worker_name="github-digest")
    assert [t.paused for t in found if t.kind == "schedule"] == [False]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_steps_the_readme_and_the_log_give_turn_a_paused_example_schedule_on(
    server: LiveServer, api: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="floom"):
        deploy_examples(server.ctx)
    (trigger,) = api.get("/api/v1/workers/github-digest/triggers").json()["items"]
    assert trigger["kind"] == "schedule"
    assert trigger["paused"] is True
    said = caplog.text
    assert "floom secrets set GITHUB_TOKEN" in said
    assert f"floom resume github-digest --trigger {trigger['id']}" in said

    def floom(*args: str, stdin: str = "") -> str:
        done = subprocess.run(
            [sys.executable, "-m", "floom.cli", *args],
            env=server.cli_env(),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    # README's quick start: set the secret, find the schedule's id, resume that trigger.
    floom("secrets", "set", "GITHUB_TOKEN", stdin="ghp_from_the_readme\n")
    assert trigger["id"] in floom("triggers", "github-digest")
    floom("resume", "github-digest", "--trigger", trigger["id"])
    (resumed,) = api.get("/api/v1/workers/github-digest/triggers").json()["items"]
    assert resumed["paused"] is False
    assert resumed["next_fires"]
