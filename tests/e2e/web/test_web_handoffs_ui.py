"""The handoff board in a real headless Chromium (SQLite only; the plain-HTTP tests cover both
databases). Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

from typing import Any

import pytest

from floom.services.access import keys
from floom.services.access.principal import SYSTEM, Principal
from floom.services.handoffs import agents as handoff_agents
from floom.services.handoffs import flow as handoff_flow
from floom.services.handoffs import jobs as handoffs
from floom.services.handoffs import review as handoff_review
from tests.support import web as web_support
from tests.support.harness import LiveServer
from tests.support.rigs.handoffs import roles
from tests.support.web import Tab

pytest.importorskip("playwright.sync_api")


# The browser fixtures, shared with the other browser test module.
database_url = web_support.sqlite_database_url
browser = web_support.browser
tab = web_support.tab


def _jobs_in_every_status(server: LiveServer) -> dict[str, str]:
    """A small team's board: one job in each status, a retry and a follow-on."""
    ctx = server.ctx
    roles(ctx, "planner", "coder", "reviewer")
    made = {
        label: Principal.of_key(
            keys.authenticate(
                ctx,
                handoff_agents.create_agent(ctx, caller=SYSTEM, label=label, roles=[role]).token,
            )
        )
        for label, role in (
            ("claude-laptop", "planner"),
            ("codex-ci", "coder"),
            ("rev", "reviewer"),
        )
    }
    planner, coder, reviewer = made["claude-laptop"], made["codex-ci"], made["rev"]

    def publish(summary: str, role: str = "coder", **extra: Any) -> str:
        job_id: str = handoffs.create_job(
            ctx, actor=planner, summary=summary, role=role, **extra
        ).row.id
        return job_id

    ids = {
        "parser": publish(
            "implement the parser",
            priority="high",
            context={"file": "parser.py", "grammar": "json"},
            constraints=["stdlib only", "keep it under 300 lines"],
            artifacts=[{"type": "spec", "uri": "https://docs.example/grammar.md"}],
            routing=[{"role": "reviewer", "summary": "review the parser"}],
        )
    }
    ids["lexer"] = publish("fix the lexer's unicode escapes", priority="urgent")
    publish("write the release notes", blocked_by=[ids["lexer"]])
    publish("tidy the CLI help", priority="low")
    handoff_flow.claim(ctx, actor=coder, job_id=ids["parser"])
    handoff_flow.complete(ctx, actor=coder, job_id=ids["parser"], summary="parser in place")
    handoff_review.reject(
        ctx, actor=planner, job_id=ids["parser"], reason="no tests for nested arrays"
    )
    handoff_flow.claim_next(ctx, actor=coder, role="coder")  # the urgent lexer job
    flaky = publish("make test_sync stable")
    handoff_flow.claim(ctx, actor=coder, job_id=flaky)
    handoff_flow.set_status(
        ctx, actor=coder, job_id=flaky, status="blocked", reason="needs the staging password"
    )
    handoff_flow.claim_next(ctx, actor=reviewer)
    dropped = publish("port the old importer", priority="low")
    handoff_flow.set_status(ctx, actor=planner, job_id=dropped, status="cancelled")
    broken = publish("bump the lockfile")
    handoff_flow.claim(ctx, actor=coder, job_id=broken)
    handoff_flow.set_status(
        ctx, actor=coder, job_id=broken, status="failed", reason="the mirror is down"
    )
    ids["cancel_me"] = publish("benchmark the parser", role="reviewer")
    return ids


def test_the_board_shows_every_status_and_a_job_is_cancelled_from_its_page(
    tab: Tab, server: LiveServer
) -> None:
    ids = _jobs_in_every_status(server)
    tab.sign_in()
    tab.page.get_by_role("link", name="Handoffs").click()
    tab.page.wait_for_url(tab.url("/handoffs"))
    board = tab.page.locator("#handoff-board")
    for status in ("pending", "published", "in_progress", "blocked", "completed", "failed"):
        assert board.locator(f'section[data-status="{status}"] .job-card').count() >= 1, status
    published = board.locator('section[data-status="published"] .job-summary')
    # Open jobs read in claim order: the most urgent first.
    assert published.first.inner_text() == "implement the parser"
    tab.shot("handoffs-board")

    tab.page.get_by_label("Role").select_option("reviewer")
    tab.page.get_by_role("button", name="Filter").click()
    tab.page.wait_for_url(tab.url("/handoffs?role=reviewer"))
    assert "fix the lexer" not in board.inner_text()

    tab.goto(f"/handoffs/jobs/{ids['parser']}")
    assert tab.page.locator("#job-events tbody tr").count() >= 4
    assert "no tests for nested arrays" in tab.page.locator("#job-lineage").inner_text()
    tab.shot("handoff-job")

    tab.goto(f"/handoffs/jobs/{ids['cancel_me']}")
    tab.page.get_by_label("Reason (Cancel)").fill("benchmarks can wait")
    tab.page.get_by_role("button", name="Cancel").click()
    tab.page.wait_for_url(f"**/handoffs/jobs/{ids['cancel_me']}?notice=moved")
    assert "cancelled" in tab.page.locator("#job-status").inner_text()
    assert "benchmarks can wait" in tab.page.locator("#job-events").inner_text()
