"""An agent run's checkpoint (services/runs/agent.save_transcript, at every step of its loop):
one guarded statement, which makes the row, replaces it, or leaves an archived one alone
(its record moved into object storage), without reading the row first. Both databases."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import event, update

from floom.services.context import Context
from floom.services.runs import agent as agent_runs
from floom.store.agents import Transcript
from floom.store.db import session_scope


def _verbs(ctx: Context, step: Callable[[], object]) -> tuple[object, list[str]]:
    """What `step` returned, and the verbs of the statements on agent_transcripts it sent."""
    sent: list[str] = []

    def note(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "agent_transcripts" in statement:
            sent.append(statement.split()[0].upper())

    event.listen(ctx.engine, "before_cursor_execute", note)
    try:
        returned = step()
    finally:
        event.remove(ctx.engine, "before_cursor_execute", note)
    return returned, sent


def _row(ctx: Context, run_id: str) -> Transcript:
    with session_scope(ctx.engine) as s:
        row = s.get(Transcript, run_id)
    assert row is not None
    return row


def test_a_checkpoint_is_one_statement_that_makes_replaces_or_leaves_the_row(
    ctx: Context,
) -> None:
    t = Transcript(run_id="run_1", worker_name="w", model="m", system="be brief")
    saved, sent = _verbs(ctx, lambda: agent_runs.save_transcript(ctx, t))
    assert (saved, sent) == (True, ["INSERT"])
    assert _row(ctx, "run_1").system == "be brief"

    t.messages_json = '[{"role": "user", "content": "hello"}]'
    t.iterations, t.cost_usd, t.active_seconds = 2, 0.5, 1.25
    saved, sent = _verbs(ctx, lambda: agent_runs.save_transcript(ctx, t))
    assert (saved, sent) == (True, ["INSERT"])
    row = _row(ctx, "run_1")
    assert (row.messages_json, row.iterations, row.cost_usd, row.active_seconds) == (
        t.messages_json,
        2,
        0.5,
        1.25,
    )
    assert row.updated_at == t.updated_at  # what the end's archiving compares
    assert not row.archived

    # The run ended and its record moved to object storage: a late save is dropped.
    with session_scope(ctx.engine, write=True) as s:
        s.execute(
            update(Transcript)
            .where(Transcript.run_id == "run_1")  # type: ignore[arg-type]
            .values(system="", messages_json="", state_json="", archived=True)
        )
    t.messages_json, t.iterations = '[{"role": "user", "content": "late"}]', 9
    saved, sent = _verbs(ctx, lambda: agent_runs.save_transcript(ctx, t))
    assert (saved, sent) == (False, ["INSERT"])
    row = _row(ctx, "run_1")
    assert (row.archived, row.messages_json, row.iterations) == (True, "", 2)
