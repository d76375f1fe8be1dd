"""Run-level approvals of script workers: propose, wait for a person, then apply or stop."""

from __future__ import annotations

from pathlib import Path

import httpx

from floom.mcp.backends.local import LocalBackend
from floom.schemas.runs import ApprovalQuery
from floom.services.access.principal import SYSTEM
from floom.services.runs import approvals
from floom.store.agents import Approval
from floom.store.db import session_scope
from floom.vocabulary import ApprovalKind
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_until
from tests.support.rigs.agents import log_lines, start_run, wait_status

MAILER_YML = """\
name: mailer
outputs:
  subject: {type: string, required: true}
  body: string
secrets: [DRAFT_TOKEN]
apply_secrets: [SMTP_PASSWORD]
approvals: {required: true}
"""
MAILER_PY = """\
import json, os
phase = os.environ["FLOOM_PHASE"]
smtp = "with-smtp" if "SMTP_PASSWORD" in os.environ else "without-smtp"
print("phase", phase, smtp, "draft" if "DRAFT_TOKEN" in os.environ else "", flush=True)
out = os.environ["FLOOM_OUTPUT_DIR"]
if phase == "propose":
    open(out + "/draft.txt", "w").write("Dear Ada")
    json.dump({"outputs": {"subject": "Hi Ada", "body": "Dear Ada"}}, open("result.json", "w"))
else:
    d = json.load(open("decision.json"))
    print("applying", d["decision"], d["outputs"]["subject"], "comment:", d["comment"], flush=True)
    print("draft kept:", open(out + "/draft.txt").read(), flush=True)
    open(out + "/sent.txt", "w").write("sent " + d["outputs"]["subject"])
    json.dump({"outputs": {"subject": "ignored"}}, open("result.json", "w"))
"""


def _mailer(api: httpx.Client, tmp_path: Path) -> None:
    deploy_folder(api, make_worker(tmp_path / "mailer", MAILER_YML, {"run.py": MAILER_PY}))
    api.put("/api/v1/secrets/DRAFT_TOKEN", json={"value": "draft-token-1"})
    api.put("/api/v1/secrets/SMTP_PASSWORD", json={"value": "smtp-pass-1"})


def test_a_gated_script_proposes_waits_without_a_slot_then_applies_the_edited_outputs(
    api: httpx.Client, tmp_path: Path
) -> None:
    _mailer(api, tmp_path)
    run_id = start_run(api, "mailer")

    waiting = wait_status(api, run_id, {"awaiting_approval"})
    assert waiting["outputs"] == {"subject": "Hi Ada", "body": "Dear Ada"}
    assert [a["name"] for a in waiting["artifacts"]] == ["draft.txt"]
    (approval,) = waiting["approvals"]
    assert approval["kind"] == "run"
    assert approval["status"] == "pending"
    assert approval["proposed"] == {"subject": "Hi Ada", "body": "Dear Ada"}
    # The slot is let go: at once after the status a waiter sees (the thread that recorded
    # it answers its waiters first), so within a bound, not at the same instant.
    wait_until(lambda: api.get("/healthz").json()["executor"]["active"] == 0)
    pending = api.get("/api/v1/approvals").json()["items"]
    assert [a["id"] for a in pending] == [approval["id"]]

    decided = api.post(
        f"/api/v1/approvals/{approval['id']}/approve",
        json={"edited": {"subject": "Hello Ada"}, "comment": "friendlier"},
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["status"] == "approved"
    run = wait_status(api, run_id)

    assert run["status"] == "succeeded", run
    assert run["outputs"] == {"subject": "Hello Ada", "body": "Dear Ada"}
    assert sorted(a["name"] for a in run["artifacts"]) == ["draft.txt", "sent.txt"]
    assert api.get(f"/api/v1/runs/{run_id}/artifacts/sent.txt").text == "sent Hello Ada"
    lines = log_lines(api, run_id)
    assert "phase propose without-smtp draft" in lines
    assert "phase apply with-smtp draft" in lines
    assert "applying approved Hello Ada comment: friendlier" in lines
    assert "draft kept: Dear Ada" in lines
    (final,) = run["approvals"]
    assert final["edited"] == {"subject": "Hello Ada"}
    assert final["decided_by"]
    again = api.post(f"/api/v1/approvals/{approval['id']}/approve", json={})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "conflict"
    assert api.get("/api/v1/approvals").json()["items"] == []


def test_a_comment_over_its_bound_is_refused_and_decides_nothing(
    api: httpx.Client, tmp_path: Path
) -> None:
    # Kept whole, a 3 MB comment went into the approval, the run's log and error (in every
    # list of runs), decision.json, and an agent's every later turn.
    _mailer(api, tmp_path)
    run_id = start_run(api, "mailer")
    approval_id = wait_status(api, run_id, {"awaiting_approval"})["approvals"][0]["id"]
    long = "x" * (approvals.MAX_COMMENT_CHARS + 1)

    for decision in ("approve", "reject"):
        refused = api.post(f"/api/v1/approvals/{approval_id}/{decision}", json={"comment": long})
        assert refused.status_code == 400, refused.text[:300]
        assert f"at most {approvals.MAX_COMMENT_CHARS}" in refused.json()["error"]["message"]
    assert api.get(f"/api/v1/approvals/{approval_id}").json()["status"] == "pending"
    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] == "awaiting_approval"

    said = "y" * approvals.MAX_COMMENT_CHARS
    rejected = api.post(f"/api/v1/approvals/{approval_id}/reject", json={"comment": said})
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["comment"] == said


def test_a_rejection_needs_a_reason_and_ends_the_run_as_rejected_with_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    _mailer(api, tmp_path)
    run_id = start_run(api, "mailer")
    approval_id = wait_status(api, run_id, {"awaiting_approval"})["approvals"][0]["id"]

    no_reason = api.post(f"/api/v1/approvals/{approval_id}/reject", json={"comment": " "})
    assert no_reason.status_code == 400
    assert "comment" in no_reason.json()["error"]["message"]
    rejected = api.post(f"/api/v1/approvals/{approval_id}/reject", json={"comment": "not today"})
    assert rejected.status_code == 200
    assert rejected.json()["run_status"] == "rejected"

    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "rejected"
    assert run["error"]["code"] == "rejected"
    assert "not today" in run["error"]["message"]
    assert run["outputs"] is None
    assert not any("phase apply" in line for line in log_lines(api, run_id))
    assert (
        api.get("/api/v1/approvals", params={"status": "rejected"}).json()["items"][0]["comment"]
        == "not today"
    )


def test_edited_outputs_that_break_the_manifest_are_refused_and_decide_nothing(
    api: httpx.Client, tmp_path: Path
) -> None:
    _mailer(api, tmp_path)
    run_id = start_run(api, "mailer")
    approval_id = wait_status(api, run_id, {"awaiting_approval"})["approvals"][0]["id"]

    bad = api.post(f"/api/v1/approvals/{approval_id}/approve", json={"edited": {"subject": 3}})

    assert bad.status_code == 400
    assert "outputs.subject" in bad.json()["error"]["message"]
    assert api.get(f"/api/v1/approvals/{approval_id}").json()["status"] == "pending"
    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] == "awaiting_approval"


def test_cancelling_a_run_awaiting_approval_ends_it_and_withdraws_the_approval(
    api: httpx.Client, tmp_path: Path
) -> None:
    _mailer(api, tmp_path)
    run_id = start_run(api, "mailer")
    approval_id = wait_status(api, run_id, {"awaiting_approval"})["approvals"][0]["id"]

    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200

    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] == "cancelled"
    assert api.get(f"/api/v1/approvals/{approval_id}").json()["status"] == "cancelled"
    late = api.post(f"/api/v1/approvals/{approval_id}/approve", json={})
    assert late.status_code == 409


def test_approvals_list_oldest_first_in_pages_and_filter_by_run(
    api: httpx.Client, tmp_path: Path
) -> None:
    _mailer(api, tmp_path)
    run_ids = [start_run(api, "mailer") for _ in range(3)]
    ids = [wait_status(api, r, {"awaiting_approval"})["approvals"][0]["id"] for r in run_ids]

    first = api.get("/api/v1/approvals", params={"limit": 2}).json()
    rest = api.get("/api/v1/approvals", params={"limit": 2, "cursor": first["next_cursor"]}).json()

    assert [a["id"] for a in first["items"] + rest["items"]] == sorted(ids)
    assert rest["next_cursor"] is None
    by_run = api.get("/api/v1/approvals", params={"run_id": run_ids[1]}).json()["items"]
    assert [a["id"] for a in by_run] == [ids[1]]
    assert api.get("/api/v1/approvals", params={"status": "maybe"}).status_code == 400
    assert api.get("/api/v1/approvals/apr_nope").status_code == 404


def test_approvals_filter_by_worker_before_paging_over_rest_and_mcp(
    server: LiveServer, api: httpx.Client
) -> None:
    with session_scope(server.ctx.engine, write=True) as s:
        for i, worker in enumerate(["a", "b", "a", "b", "b"]):
            s.add(
                Approval(
                    id=f"apr_{i}", run_id=f"run_{i}", worker_name=worker, kind=ApprovalKind.RUN
                )
            )

    first = api.get("/api/v1/approvals", params={"worker": "b", "limit": 2}).json()
    cursor = first["next_cursor"]
    rest = api.get("/api/v1/approvals", params={"worker": "b", "limit": 2, "cursor": cursor})

    assert [a["id"] for a in first["items"]] == ["apr_1", "apr_3"]
    assert [a["id"] for a in rest.json()["items"]] == ["apr_4"]
    assert rest.json()["next_cursor"] is None
    # The /mcp tool asks the same service, so a worker's approvals are never cut off by others'.
    page = LocalBackend(server.ctx, SYSTEM).list_approvals(ApprovalQuery(worker="a"))
    assert [a.id for a in page.items] == ["apr_0", "apr_2"]


def test_deciding_needs_the_run_scope(server: object, api: httpx.Client, tmp_path: Path) -> None:
    from tests.support.harness import LiveServer

    assert isinstance(server, LiveServer)
    _mailer(api, tmp_path)
    run_id = start_run(api, "mailer")
    approval_id = wait_status(api, run_id, {"awaiting_approval"})["approvals"][0]["id"]
    reader = api.post("/api/v1/keys", json={"scopes": ["read"]}).json()["key"]

    with server.client(reader) as client:
        assert client.get("/api/v1/approvals").status_code == 200
        denied = client.post(f"/api/v1/approvals/{approval_id}/approve", json={})

    assert denied.status_code == 403
