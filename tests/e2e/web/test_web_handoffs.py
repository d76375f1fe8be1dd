"""The handoff board in the web UI over plain HTTP: jobs by status and role, a job's lineage and
history, and moves made from forms that the services check like any other caller's."""

from __future__ import annotations

import re
from typing import Any

from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.handoffs import agents as handoff_agents
from floom.services.handoffs import flow as handoff_flow
from floom.services.handoffs import jobs as handoffs
from floom.services.handoffs import review as handoff_review
from floom.services.handoffs import rules
from tests.support.harness import LiveServer
from tests.support.rigs.handoffs import roles
from tests.support.web import csrf_of, signed_in_client


def _agent(
    server: LiveServer, label: str, *role_names: str, scopes: list[str] | None = None
) -> str:
    body = handoff_agents.create_agent(
        server.ctx, caller=SYSTEM, label=label, roles=list(role_names), scopes=scopes
    )
    token: str = body.token
    return token


def _key(server: LiveServer, token: str) -> Any:
    return keys.authenticate(server.ctx, token)


def _column(html: str, status: str) -> str:
    match = re.search(
        rf'<section class="board-column"[^>]*data-status="{status}">(.*?)</section>', html, re.S
    )
    assert match, f"no {status} column"
    return match.group(1)


def _moves(html: str) -> set[str]:
    return set(re.findall(r'<input type="hidden" name="status" value="([a-z_]+)">', html))


def _status(server: LiveServer, job_id: str) -> str:
    status: str = handoffs.get_job(
        server.ctx, actor=handoff_agents.system_actor(), job_id=job_id
    ).row.status
    return status


def test_the_board_groups_visible_jobs_by_status_and_filters_them_by_role(
    server: LiveServer,
) -> None:
    roles(server.ctx, "coder", "reviewer", "tester")
    alice = _agent(server, "alice", "coder")
    bob = _agent(server, "bob", "reviewer")
    review = handoffs.create_job(
        server.ctx,
        actor=_key(server, alice),
        summary="review the parser",
        role="reviewer",
        priority="urgent",
    )
    fuzz = handoffs.create_job(
        server.ctx, actor=_key(server, alice), summary="fuzz the lexer", role="tester"
    )
    handoff_flow.claim(server.ctx, actor=_key(server, bob), job_id=review.row.id)

    as_bob = signed_in_client(server, bob).get("/handoffs")
    assert as_bob.status_code == 200
    assert '<a href="/handoffs" aria-current="page">Handoffs</a>' in as_bob.text
    working = _column(as_bob.text, "in_progress")
    assert "review the parser" in working
    assert "▸ bob" in working
    assert "urgent" in working
    assert "reviewer" in working
    # Bob holds no tester role and did not publish the fuzz job: it is not on his board.
    assert fuzz.row.id not in as_bob.text
    assert "fuzz the lexer" not in as_bob.text
    assert "review the parser" not in _column(as_bob.text, "published")

    as_alice = signed_in_client(server, alice).get("/handoffs").text
    assert "fuzz the lexer" in _column(as_alice, "published")
    assert "review the parser" in _column(as_alice, "in_progress")

    admin = signed_in_client(server, server.admin_key)
    testers = admin.get("/handoffs", params={"role": "tester"}).text
    assert "fuzz the lexer" in testers
    assert "review the parser" not in testers
    assert '<option value="tester" selected>' in testers
    nobody = admin.get("/handoffs", params={"role": "coder"}).text
    assert "No jobs for the role <b>coder</b>" in nobody


def test_a_job_page_shows_its_context_result_lineage_and_every_move_in_its_history(
    server: LiveServer,
) -> None:
    roles(server.ctx, "coder", "reviewer", "tester")
    alice = _agent(server, "alice", "coder")
    bob = _agent(server, "bob", "reviewer")
    job = handoffs.create_job(
        server.ctx,
        actor=_key(server, alice),
        summary="review the parser",
        role="reviewer",
        context={"file": "parser.py"},
        constraints=["stdlib only"],
        artifacts=[{"type": "diff", "uri": "https://git.example/pr/7.diff", "checksum": "ab12"}],
        routing=[{"role": "tester", "summary": "fuzz the reviewed parser"}],
    )
    handoff_flow.claim(server.ctx, actor=_key(server, bob), job_id=job.row.id)
    handoff_flow.complete(
        server.ctx,
        actor=_key(server, bob),
        job_id=job.row.id,
        summary="two nits",
        data={"verdict": "approve"},
    )
    retry = handoff_review.reject(
        server.ctx, actor=_key(server, alice), job_id=job.row.id, reason="nits are not enough"
    )

    client = signed_in_client(server, alice)
    page = client.get(f"/handoffs/jobs/{job.row.id}")
    assert page.status_code == 200
    html = page.text
    assert "parser.py" in html
    assert "<li>stdlib only</li>" in html
    assert 'href="https://git.example/pr/7.diff"' in html
    assert "ab12" in html
    assert "two nits" in html
    assert "approve" in html
    follow_on = re.search(r"Follow-on: <a href=\"/handoffs/jobs/(job_[0-9a-z]+)\"", html)
    assert follow_on
    assert "fuzz the reviewed parser" in html
    assert "Rejected by agent alice: <q>nits are not enough</q>; retried as" in html
    assert f'retried as <a href="/handoffs/jobs/{retry.row.id}"' in html
    history = html[html.index('id="job-events"') :]
    rows = re.findall(r'<tr class="event event-([a-z_]+)">(.*?)</tr>', history, re.S)
    assert [t for t, _ in rows] == ["created", "claimed", "completed", "routed", "rejected"]
    claimed = rows[1][1]
    assert "published → in progress" in claimed
    assert "agent bob" in claimed
    assert "nits are not enough" in rows[4][1]
    assert "agent alice" in rows[4][1]

    retry_page = client.get(f"/handoffs/jobs/{retry.row.id}").text
    assert f'Retry of <a href="/handoffs/jobs/{job.row.id}"' in retry_page
    assert "rejected by alice: <q>nits are not enough</q>" in retry_page
    missing = signed_in_client(server, _agent(server, "carol", "coder")).get(
        f"/handoffs/jobs/{follow_on.group(1)}"
    )
    assert missing.status_code == 404
    assert "that you can see" in missing.text


def test_moves_from_the_job_page_go_through_the_transition_table_and_refusals_change_nothing(
    server: LiveServer,
) -> None:
    roles(server.ctx, "coder", "reviewer")
    alice = _agent(server, "alice", "coder")
    bob = _agent(server, "bob", "reviewer")
    reader = _agent(server, "rita", "reviewer", scopes=["read"])
    job = handoffs.create_job(
        server.ctx, actor=_key(server, alice), summary="review the parser", role="reviewer"
    )
    path = f"/handoffs/jobs/{job.row.id}"

    # Each key is offered only its own moves: the publisher cancels, the role holder claims.
    as_alice, as_bob = signed_in_client(server, alice), signed_in_client(server, bob)
    assert _moves(as_alice.get(path).text) == {"cancelled"}
    bob_page = as_bob.get(path).text
    assert _moves(bob_page) == {"in_progress"}

    # A forged cancel from bob is refused by the service, naming his allowed moves.
    forged = as_bob.post(f"{path}/status", data={"csrf": csrf_of(bob_page), "status": "cancelled"})
    assert forged.status_code == 403
    assert "Not done" in forged.text
    assert "Allowed moves for you from published: in_progress." in forged.text
    no_csrf = as_alice.post(f"{path}/status", data={"status": "cancelled"})
    assert no_csrf.status_code == 403
    assert "CSRF token missing or stale" in no_csrf.text
    as_reader = signed_in_client(server, reader)
    reader_page = as_reader.get(path).text
    assert "can read only" in reader_page
    assert _moves(reader_page) == set()
    refused = as_reader.post(
        f"{path}/status", data={"csrf": csrf_of(reader_page), "status": "in_progress"}
    )
    assert refused.status_code == 403
    assert "lacks the &#39;run&#39; scope" in refused.text
    assert _status(server, job.row.id) == rules.PUBLISHED

    # The publisher cancels with a reason; the history records who and why.
    page = as_alice.get(path).text
    done = as_alice.post(
        f"{path}/status",
        data={"csrf": csrf_of(page), "status": "cancelled", "reason": "not needed any more"},
    )
    assert done.status_code == 303
    assert done.headers["location"] == f"{path}?notice=moved"
    assert _status(server, job.row.id) == rules.CANCELLED
    after = as_alice.get(done.headers["location"]).text
    assert "the job moved" in after
    assert "not needed any more" in after
    assert "published → cancelled" in after
    assert _moves(after) == set()
    again = as_alice.post(f"{path}/status", data={"csrf": csrf_of(after), "status": "published"})
    assert again.status_code == 409
    assert "cancelled is final" in again.text
    assert _status(server, job.row.id) == rules.CANCELLED


def test_an_admin_is_offered_the_moves_the_table_allows_and_makes_them(
    server: LiveServer,
) -> None:
    roles(server.ctx, "reviewer")
    bob = _agent(server, "bob", "reviewer")
    job = handoffs.create_job(
        server.ctx, actor=_key(server, bob), summary="review the parser", role="reviewer"
    )
    handoff_flow.claim(server.ctx, actor=_key(server, bob), job_id=job.row.id)
    path = f"/handoffs/jobs/{job.row.id}"
    admin = signed_in_client(server, server.admin_key)

    def offered() -> tuple[str, set[str]]:
        html = admin.get(path).text
        return html, _moves(html)

    html, moves = offered()
    table = set(rules.allowed_targets(rules.IN_PROGRESS, parties=set(), admin=True))
    assert moves == table == {"blocked", "completed", "failed", "cancelled", "published"}
    blocked = admin.post(
        f"{path}/status",
        data={"csrf": csrf_of(html), "status": "blocked", "reason": "needs the staging password"},
    )
    assert blocked.status_code == 303
    assert _status(server, job.row.id) == rules.BLOCKED
    html, moves = offered()
    assert moves == {"in_progress", "published", "failed", "cancelled"}
    assert ">Unblock</button>" in html
    admin.post(f"{path}/status", data={"csrf": csrf_of(html), "status": "in_progress"})
    html, _ = offered()
    admin.post(
        f"{path}/status",
        data={"csrf": csrf_of(html), "status": "completed", "reason": "done by hand"},
    )
    html, moves = offered()
    assert _status(server, job.row.id) == rules.COMPLETED
    assert moves == set()
    assert "blocked → in progress" in html
    assert "done by hand" in html

    # An admin may reject completed work into a retry, from the same page.
    rejected = admin.post(
        f"{path}/reject", data={"csrf": csrf_of(html), "reason": "missing the error path"}
    )
    assert rejected.status_code == 303
    retry_page = admin.get(rejected.headers["location"]).text
    assert "this is the retry" in retry_page
    assert "missing the error path" in retry_page


def test_a_key_that_speaks_for_no_agent_is_told_how_to_take_part(server: LiveServer) -> None:
    _, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["run"], name="laptop")
    page = signed_in_client(server, token).get("/handoffs")
    assert page.status_code == 200
    assert "This key takes no part in handoffs" in page.text
    assert "floom agents create" in page.text
