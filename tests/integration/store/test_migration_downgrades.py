"""Downgrading the schema below the revisions that moved ended runs' records out of their rows
(0011: agent transcripts and tool calls; 0010: run logs) puts them back as rows, read from
their blobs (in a real SeaweedFS bucket, or the database), or is refused, changing nothing,
with what to run first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text
from sqlmodel import select

from floom.errors import Conflict
from floom.services.context import Context
from floom.services.ops.objects import archive_logs, migrate_blobs
from floom.services.runs import agent as agent_runs
from floom.services.runs.logs import append_events
from floom.store.agents import Transcript
from floom.store.db import session_scope
from floom.store.migrate import alembic_config
from floom.store.models import Run, new_id
from floom.vocabulary import RunStatus, ToolCallStatus
from tests.support.harness import fast_settings
from tests.support.processes.s3_server import S3Server


@pytest.fixture
def s3_ctx(
    tmp_path: Path, database_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Context]:
    settings = s3_server.settings()
    # The downgrade reads the bucket's settings from the environment, as a node does.
    for name, value in s3_server.env(settings).items():
        monkeypatch.setenv(name, value)
    context = Context.open(fast_settings(tmp_path / "data", database_url, **settings))
    yield context
    context.engine.dispose()


def _ended_agent_run(ctx: Context) -> str:
    run_id = new_id("run")
    with session_scope(ctx.engine, write=True) as s:
        s.add(Run(id=run_id, worker_name="w", version_id="v", status=RunStatus.SUCCEEDED))
        s.add(Transcript(run_id=run_id, worker_name="w", model="m", system="be brief"))
        s.flush()
        append_events(
            s, run_id=run_id, attempt=1, lines=[("stdout", f"line {i}", None) for i in range(3)]
        )
    for tool in ("read_file", "write_file"):
        agent_runs.record_tool_call(
            ctx,
            run_id=run_id,
            attempt=1,
            tool=tool,
            arguments={"path": "a"},
            status=ToolCallStatus.OK,
        )
    with session_scope(ctx.engine, write=True) as s:
        transcript = s.get(Transcript, run_id)
        assert transcript is not None
        transcript.messages_json = '[{"role": "user", "content": "hi"}]'
        s.add(transcript)
    assert archive_logs(ctx, run_ids=[run_id]) == 1
    return run_id


def _downgrade(ctx: Context, revision: str) -> None:
    with ctx.engine.begin() as conn:
        command.downgrade(alembic_config(conn), revision)


def _revision(ctx: Context) -> str:
    with ctx.engine.connect() as conn:
        return str(conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one())


def test_downgrading_0011_gives_archived_transcripts_their_text_and_tool_calls_back(
    s3_ctx: Context,
) -> None:
    run_id = _ended_agent_run(s3_ctx)
    with s3_ctx.engine.connect() as conn:
        before = conn.execute(
            text("SELECT count(*) FROM tool_calls WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
    assert before == 0

    _downgrade(s3_ctx, "0010")

    assert _revision(s3_ctx) == "0010"
    with s3_ctx.engine.connect() as conn:
        system, messages = conn.execute(
            text("SELECT system, messages_json FROM agent_transcripts WHERE run_id = :r"),
            {"r": run_id},
        ).one()
        calls = conn.execute(
            text("SELECT seq, tool, status FROM tool_calls WHERE run_id = :r ORDER BY seq"),
            {"r": run_id},
        ).all()
    assert (system, messages) == ("be brief", '[{"role": "user", "content": "hi"}]')
    assert [tuple(c) for c in calls] == [(1, "read_file", "ok"), (2, "write_file", "ok")]


def test_a_downgrade_of_0011_that_cannot_read_the_records_is_refused_and_changes_nothing(
    s3_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = _ended_agent_run(s3_ctx)
    monkeypatch.delenv("FLOOM_S3_BUCKET")
    head = _revision(s3_ctx)

    with pytest.raises(Conflict) as refused:
        _downgrade(s3_ctx, "0010")

    assert f"run {run_id}" in refused.value.message
    assert "floom blobs migrate --to database" in refused.value.message
    # PostgreSQL rolls the whole downgrade back; SQLite keeps the steps above 0011 it made.
    assert _revision(s3_ctx) in (head, "0011")
    with session_scope(s3_ctx.engine) as s:
        transcript = s.exec(select(Transcript).where(Transcript.run_id == run_id)).one()
        assert transcript.archived


def test_downgrading_0010_is_refused_while_blobs_are_in_the_bucket_then_puts_logs_back(
    s3_ctx: Context,
) -> None:
    run_id = _ended_agent_run(s3_ctx)
    head = _revision(s3_ctx)

    with pytest.raises(Conflict) as refused:
        _downgrade(s3_ctx, "0009")
    assert "object storage" in refused.value.message
    assert "floom blobs migrate --to database" in refused.value.message
    # PostgreSQL rolls the whole downgrade back; SQLite keeps the steps above 0010 it made.
    assert _revision(s3_ctx) in (head, "0010")

    migrate_blobs(s3_ctx, to="database")
    _downgrade(s3_ctx, "0009")

    assert _revision(s3_ctx) == "0009"
    with s3_ctx.engine.connect() as conn:
        assert "run_logs" not in inspect(conn).get_table_names()
        lines = conn.execute(
            text("SELECT seq, line FROM run_events WHERE run_id = :r ORDER BY seq"), {"r": run_id}
        ).all()
        calls = conn.execute(
            text("SELECT count(*) FROM tool_calls WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
    assert [tuple(x) for x in lines] == [(i + 1, f"line {i}") for i in range(3)]
    assert calls == 2
