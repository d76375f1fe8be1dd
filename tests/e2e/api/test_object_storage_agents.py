"""An ended agent run's record in object storage: with FLOOM_BLOB_STORE=s3 (a real SeaweedFS)
its transcript's text and its tool calls move into its log's object when the run ends; the
API, replays and redaction read them from there, checked against the object's sha256."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from sqlmodel import func, select

from floom.services.access.principal import SYSTEM
from floom.services.runs import agent as agent_runs
from floom.store.agents import ToolCall, Transcript
from floom.store.blobs.tables import PendingBlob, RunLog
from floom.store.db import session_scope
from floom.store.models import Artifact, Blob, RunEvent
from floom.vocabulary import ToolCallStatus
from tests.standins.anthropic_api import reply, tool_use
from tests.support.harness import wait_until
from tests.support.processes.s3_server import ACCESS_KEY, SECRET_KEY, S3Server
from tests.support.rigs.agents import (
    AgentRig,
    agent_rig,
    agent_worker,
    start_run,
    wait_status,
)

TOKEN = "note-token-8f3a1c77e2"
WRITER = """\
name: writer
secrets: [NOTE_TOKEN]
outputs:
  done: boolean
tools:
  - builtin: write_file
  - builtin: read_file
"""


@pytest.fixture
def rig(tmp_path: Path, database_url: str, s3_server: S3Server) -> Iterator[AgentRig]:
    settings = s3_server.settings(blob_sweep_seconds=0.3)
    with agent_rig(tmp_path / "data", database_url, executor_slots=1, **settings) as r:
        yield r


def _bucket(s3: S3Server) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


def _ended_run(rig: AgentRig, tmp_path: Path) -> str:
    rig.deploy(agent_worker(tmp_path / "writer", WRITER))
    assert rig.api.put("/api/v1/secrets/NOTE_TOKEN", json={"value": TOKEN}).status_code == 200
    rig.model.script(
        reply(tool_use("write_file", {"path": "output/notes.md", "content": f"token {TOKEN}\n"})),
        reply(tool_use("read_file", {"path": "output/notes.md"})),
        reply(tool_use("finish", {"outputs": {"done": True}})),
    )
    run_id = start_run(rig.api, "writer")
    assert wait_status(rig.api, run_id, timeout=60)["status"] == "succeeded"
    return run_id


def _moved(rig: AgentRig, run_id: str) -> str:
    """Waits until the run's record left the database; the digest of its log's object."""

    def moved() -> str | None:
        with session_scope(rig.server.ctx.engine) as s:
            transcript = s.get(Transcript, run_id)
            archived = s.get(RunLog, run_id)
            if transcript is None or not transcript.archived or archived is None:
                return None
            assert (transcript.system, transcript.messages_json, transcript.state_json) == (
                "",
                "",
                "",
            )
            for table in (ToolCall, RunEvent):
                left = s.exec(
                    select(func.count()).select_from(table).where(table.run_id == run_id)
                ).one()
                assert left == 0, table
            return archived.digest

    digest: str = wait_until(moved, timeout=30)
    return digest


def test_an_ended_agent_runs_record_is_read_and_replayed_from_its_object_still_redacted(
    rig: AgentRig, tmp_path: Path, s3_server: S3Server
) -> None:
    run_id = _ended_run(rig, tmp_path)
    digest = _moved(rig, run_id)

    run = rig.api.get(f"/api/v1/runs/{run_id}").json()
    calls = [(c["seq"], c["tool"], c["status"]) for c in run["tool_calls"]]
    assert calls[:2] == [(1, "write_file", "ok"), (2, "read_file", "ok")]
    assert run["model_usage"]["total_tokens"] > 0  # the transcript row kept its usage
    assert run["tool_calls"][0]["arguments"]["content"] == "token ***\n"
    assert "***" in run["tool_calls"][1]["result"]
    transcript = rig.api.get(f"/api/v1/runs/{run_id}/transcript")
    assert transcript.status_code == 200, transcript.text
    messages = transcript.json()["messages"]
    assert [m["role"] for m in messages][:2] == ["user", "assistant"]
    assert len(messages) >= 6
    assert TOKEN not in json.dumps(run) + transcript.text
    # The object holds the record as the database held it: redacted.
    key = f"{rig.server.ctx.settings.s3_prefix}blobs/{digest}"
    body = _bucket(s3_server).get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
    text = gzip.decompress(body).decode()
    assert "write_file" in text
    assert "token ***" in text
    assert TOKEN not in text

    replayed = rig.api.post(f"/api/v1/runs/{run_id}/replays", json={"mode": "exact"})
    assert replayed.status_code == 202, replayed.text
    report = wait_until(
        lambda: (
            (r := rig.api.get(f"/api/v1/replays/{replayed.json()['id']}").json())["finished"] and r
        ),
        timeout=60,
    )
    assert report["reproduced"] is True, report["divergence"]


def test_a_missing_or_damaged_record_object_answers_502_naming_the_run_and_the_object(
    rig: AgentRig, tmp_path: Path, s3_server: S3Server
) -> None:
    run_id = _ended_run(rig, tmp_path)
    digest = _moved(rig, run_id)
    key = f"{rig.server.ctx.settings.s3_prefix}blobs/{digest}"
    bucket = _bucket(s3_server)

    bucket.put_object(Bucket=s3_server.bucket, Key=key, Body=b"tampered")
    answer = rig.api.get(f"/api/v1/runs/{run_id}/transcript")
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert error["code"] == "blob_unreadable"
    assert f"the transcript of run {run_id} is damaged" in error["message"]
    assert key in error["message"]

    bucket.delete_object(Bucket=s3_server.bucket, Key=key)
    for path in (f"/api/v1/runs/{run_id}/transcript", f"/api/v1/runs/{run_id}"):
        answer = rig.api.get(path)
        assert answer.status_code == 502, answer.text
        error = answer.json()["error"]
        assert error["code"] == "blob_unreadable"
        assert f"the transcript of run {run_id} is missing" in error["message"]
        assert key in error["message"]
    replayed = rig.api.post(f"/api/v1/runs/{run_id}/replays", json={"mode": "exact"})
    assert replayed.status_code == 502, replayed.text
    assert key in replayed.json()["error"]["message"]


def test_a_late_transcript_write_of_an_ended_run_leaves_its_record_in_the_object(
    rig: AgentRig, tmp_path: Path
) -> None:
    run_id = _ended_run(rig, tmp_path)
    _moved(rig, run_id)
    ctx = rig.server.ctx
    before = rig.api.get(f"/api/v1/runs/{run_id}/transcript").json()["messages"]
    # As a stopped attempt's loop would, saving the transcript it held in memory.
    stale = agent_runs.load_transcript(ctx, run_id=run_id, caller=SYSTEM)
    assert stale is not None
    stale.messages_json = "[]"
    agent_runs.save_transcript(ctx, stale)

    with session_scope(ctx.engine) as s:
        row = s.get(Transcript, run_id)
        assert row is not None
        assert row.archived
        assert row.messages_json == ""
    assert rig.api.get(f"/api/v1/runs/{run_id}/transcript").json()["messages"] == before


def test_a_late_tool_call_of_an_ended_run_is_dropped_and_its_archived_calls_still_listed(
    rig: AgentRig, tmp_path: Path
) -> None:
    run_id = _ended_run(rig, tmp_path)
    _moved(rig, run_id)
    ctx = rig.server.ctx
    before = rig.api.get(f"/api/v1/runs/{run_id}").json()["tool_calls"]
    assert [c["tool"] for c in before][:2] == ["write_file", "read_file"]
    # As a stopped attempt's loop would, recording a call it made after the run ended.
    agent_runs.record_tool_call(
        ctx,
        run_id=run_id,
        attempt=1,
        tool="read_file",
        arguments={"path": "late.md"},
        status=ToolCallStatus.OK,
        result="late",
    )

    with session_scope(ctx.engine) as s:
        left = s.exec(select(func.count()).select_from(ToolCall).where(ToolCall.run_id == run_id))
        assert left.one() == 0
    assert rig.api.get(f"/api/v1/runs/{run_id}").json()["tool_calls"] == before


def test_a_run_whose_store_goes_away_mid_run_keeps_everything_and_moves_it_once_back(
    tmp_path: Path, database_url: str, own_s3_server: S3Server
) -> None:
    """The bucket stops while an agent run runs (its version already unpacked, its first
    tool call made) and starts again after the run ended: the run succeeds with its artifact
    as a pending upload and its log and record as rows, each readable meanwhile; once the
    bucket is back they move into it and read back the same."""
    settings = own_s3_server.settings(blob_sweep_seconds=0.3, s3_timeout_seconds=1.0)
    reached, release = threading.Event(), threading.Event()

    def held_finish(body: dict[str, Any]) -> dict[str, Any]:
        reached.set()
        release.wait(60)
        return reply(tool_use("finish", {"outputs": {"done": True}}))

    with agent_rig(tmp_path / "data", database_url, executor_slots=1, **settings) as rig:
        rig.deploy(agent_worker(tmp_path / "writer", WRITER))
        assert rig.api.put("/api/v1/secrets/NOTE_TOKEN", json={"value": TOKEN}).status_code == 200
        rig.model.script(
            reply(tool_use("write_file", {"path": "output/notes.md", "content": "kept\n"})),
            held_finish,
        )
        run_id = start_run(rig.api, "writer")
        wait_until(reached.is_set, timeout=60)
        own_s3_server.stop()
        release.set()
        assert wait_status(rig.api, run_id, timeout=60)["status"] == "succeeded"

        ctx = rig.server.ctx
        with session_scope(ctx.engine) as s:
            assert s.get(RunLog, run_id) is None
            assert s.exec(select(func.count()).select_from(PendingBlob)).one() >= 1
            transcript = s.get(Transcript, run_id)
            assert transcript is not None
            assert not transcript.archived
        while_away = _readable(rig, run_id)
        assert while_away["artifact"] == b"kept\n"

        own_s3_server.start()
        digest = _moved(rig, run_id)
        wait_until(lambda: _pending(rig) == 0, timeout=30)
        with session_scope(ctx.engine) as s:
            (artifact,) = s.exec(select(Artifact).where(Artifact.run_id == run_id)).all()
            blob = s.get(Blob, artifact.digest)
            assert blob is not None
            assert blob.location == "s3"
        assert digest
        assert _readable(rig, run_id) == while_away


def _pending(rig: AgentRig) -> int:
    with session_scope(rig.server.ctx.engine) as s:
        return int(s.exec(select(func.count()).select_from(PendingBlob)).one())


def _readable(rig: AgentRig, run_id: str) -> dict[str, Any]:
    """What the API answers of an ended agent run: its log's lines, its tool calls, its
    transcript's messages and its artifact's bytes."""
    answers = {
        "logs": rig.api.get(f"/api/v1/runs/{run_id}/logs"),
        "run": rig.api.get(f"/api/v1/runs/{run_id}"),
        "transcript": rig.api.get(f"/api/v1/runs/{run_id}/transcript"),
        "artifact": rig.api.get(f"/api/v1/runs/{run_id}/artifacts/notes.md"),
    }
    for name, answer in answers.items():
        assert answer.status_code == 200, (name, answer.text)
    return {
        "logs": [e["line"] for e in answers["logs"].json()["items"]],
        "calls": [(c["seq"], c["tool"], c["status"]) for c in answers["run"].json()["tool_calls"]],
        "messages": answers["transcript"].json()["messages"],
        "artifact": answers["artifact"].content,
    }
