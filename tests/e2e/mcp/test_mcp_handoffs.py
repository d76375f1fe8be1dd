"""Two agents hand work to each other through MCP alone: one over stdio (`floom mcp`, a REST
client), the other over the server's `/mcp` endpoint, each with its own agent key."""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from tests.support.harness import LiveServer
from tests.support.mcp_clients import call, call_error, http_client, stdio_client

HANDOFF_TOOLS = frozenset(
    {
        "handoff_create_job",
        "handoff_list_jobs",
        "handoff_get_job",
        "handoff_claim_job",
        "handoff_claim_next_job",
        "handoff_set_status",
        "handoff_update_job",
        "handoff_complete_job",
        "handoff_reject_job",
        "handoff_reopen_context",
        "handoff_my_roles",
    }
)


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _agent(api: httpx.Client, label: str, roles: list[str], scopes: list[str]) -> str:
    body = {"label": label, "roles": roles, "scopes": scopes}
    key: str = _ok(api.post("/api/v1/agents", json=body), 201)["key"]
    return key


def test_two_agents_publish_claim_reject_and_retry_a_job_through_mcp(
    server: LiveServer, api: httpx.Client
) -> None:
    for role in ("planner", "reviewer", "tester"):
        _ok(api.post("/api/v1/roles", json={"name": role}), 201)
    planner_key = _agent(api, "planner-a", ["planner"], ["run"])
    reviewer_key = _agent(api, "reviewer-b", ["reviewer"], ["run"])
    reader_key = _agent(api, "reader-c", ["reviewer"], ["read"])

    async def session() -> None:
        async with (
            stdio_client(server, planner_key) as a,
            http_client(server, reviewer_key) as b,
        ):
            names = {t.name for t in (await a.list_tools()).tools}
            assert names >= HANDOFF_TOOLS
            assert {t.name for t in (await b.list_tools()).tools} >= HANDOFF_TOOLS
            me = await call(a, "handoff_my_roles")
            assert me["agent"]["label"] == "planner-a"
            assert me["roles"] == ["planner"]

            # A publishes a review for role "reviewer"; B takes it and finishes it.
            spec = {
                "summary": "review the parser",
                "role": "reviewer",
                "context": {"file": "parser.py", "diff": "x" * 2000},
                "constraints": ["stdlib only"],
                "artifacts": [{"type": "diff", "uri": "file:///tmp/parser.diff"}],
                "priority": "high",
                "idempotency_key": "PARSER-1",
            }
            job = await call(a, "handoff_create_job", **spec)
            assert job["status"] == "published"
            assert job["source_agent"]["label"] == "planner-a"
            again = await call(a, "handoff_create_job", **spec)
            assert again["id"] == job["id"]
            assert again["replayed"] is True

            claimed = (await call(b, "handoff_claim_next_job"))["job"]
            assert claimed["id"] == job["id"]
            assert claimed["status"] == "in_progress"
            assert claimed["assignee"]["label"] == "reviewer-b"
            assert (await call(b, "handoff_claim_next_job"))["job"] is None
            done = await call(
                b,
                "handoff_complete_job",
                job_id=job["id"],
                summary="looks fine",
                data={"verdict": "approve"},
            )
            assert done["status"] == "completed"
            assert done["result"]["data"]["verdict"] == "approve"

            # The transition table holds over MCP too: completed work cannot be restarted.
            refused = await call_error(b, "handoff_set_status", job_id=job["id"], status="blocked")
            assert refused["code"] == "illegal_transition"
            assert refused["details"]["allowed"] == []
            assert refused["hint"]

            # A rejects it; B gets the retry and reads why, without the full payload.
            reason = "the error path for unterminated strings is not reviewed"
            retry = await call(a, "handoff_reject_job", job_id=job["id"], reason=reason)
            assert retry["retry_of"] == job["id"]
            assert retry["attempt"] == 2
            second = (await call(b, "handoff_claim_next_job", role="reviewer"))["job"]
            assert second["id"] == retry["id"]
            reopened = await call(b, "handoff_reopen_context", job_id=retry["id"])
            assert reopened["attempt"] == 2
            assert reopened["original_job_id"] == job["id"]
            assert reopened["summary"] == "review the parser"
            assert reopened["constraints"] == ["stdlib only"]
            assert [r["reason"] for r in reopened["rejections"]] == [reason]
            assert reopened["rejections"][0]["reviewer"] == "planner-a"
            assert "context" not in reopened
            await call(
                b,
                "handoff_complete_job",
                job_id=retry["id"],
                summary="error path reviewed",
                artifacts=[{"type": "note", "uri": "file:///tmp/review.md"}],
            )

            # A sees the lineage in its listing and the audit trail of the original.
            mine = await call(a, "handoff_list_jobs", source="me", status=["completed"])
            by_id = {j["id"]: j for j in mine["items"]}
            assert set(by_id) == {job["id"], retry["id"]}
            assert by_id[job["id"]]["superseded_by"] == retry["id"]
            assert by_id[retry["id"]]["retry_of"] == job["id"]
            assert by_id[retry["id"]]["rejection"]["reason"] == reason
            trail = (await call(a, "handoff_get_job", job_id=job["id"]))["events"]
            assert [e["type"] for e in trail] == ["created", "claimed", "completed", "rejected"]
            claim_event = trail[1]
            assert (claim_event["from_status"], claim_event["to_status"]) == (
                "published",
                "in_progress",
            )
            assert claim_event["actor"] == "agent reviewer-b"

            # B cannot see a job for a role it does not hold, until an admin grants the role;
            # the role counts on the next call of the same session.
            hidden = await call(a, "handoff_create_job", summary="run the fuzzer", role="tester")
            missing = await call_error(b, "handoff_get_job", job_id=hidden["id"])
            assert missing["code"] == "not_found"
            not_held = await call_error(b, "handoff_claim_next_job", role="tester")
            assert not_held["code"] == "forbidden"
            assert "reviewer" in not_held["hint"]
            patch = {"roles": ["reviewer", "tester"]}
            _ok(api.patch("/api/v1/agents/reviewer-b", json=patch))
            assert (await call(b, "handoff_my_roles"))["roles"] == ["reviewer", "tester"]
            assert (await call(b, "handoff_get_job", job_id=hidden["id"]))["status"] == "published"
            # Only the publisher (or an admin) edits a job.
            not_source = await call_error(
                b, "handoff_update_job", job_id=hidden["id"], constraints=["x"]
            )
            assert not_source["code"] == "forbidden"
            edited = await call(
                a, "handoff_update_job", job_id=hidden["id"], constraints=["under 5 minutes"]
            )
            assert edited["constraints"] == ["under 5 minutes"]

        # A read-scoped agent key looks but changes nothing, over either transport.
        for connect in (http_client, stdio_client):
            async with connect(server, reader_key) as c:
                seen = await call(c, "handoff_list_jobs", role="reviewer")
                assert {j["id"] for j in seen["items"]} == {job["id"], retry["id"]}
                for tool, args in (
                    ("handoff_create_job", {"summary": "sneaky", "role": "reviewer"}),
                    ("handoff_claim_job", {"job_id": hidden["id"]}),
                    ("handoff_set_status", {"job_id": hidden["id"], "status": "cancelled"}),
                ):
                    error = await call_error(c, tool, **args)
                    assert error["code"] == "forbidden"
                    assert "'run' scope" in error["message"]
        listing = _ok(api.get("/api/v1/handoffs/jobs", params={"status": "published"}))
        assert [j["id"] for j in listing["items"]] == [hidden["id"]]

    anyio.run(session)
