"""/metrics answers in the Prometheus format, with a read-scoped key only: runs by worker and
status, queue depth and age, run durations, sandbox starts and failures, scheduler lag,
webhook deliveries, pending approvals, agent tokens and cost."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from floom.errors import RunErrorCode
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.store.agents import Approval, Transcript
from floom.store.db import session_scope
from floom.store.models import Run, new_id, utcnow
from floom.store.triggers import TriggerFire, WebhookDelivery
from floom.vocabulary import ApprovalKind, RunStatus
from tests.support.harness import LiveServer, live_server


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _seed(server: LiveServer) -> None:
    now = utcnow()
    rows: list[Any] = [
        Run(
            id=new_id("run"),
            worker_name="alpha",
            version_id="v",
            status=RunStatus.SUCCEEDED,
            started_at=now - timedelta(seconds=3),
            finished_at=now,
        ),
        Run(
            id=new_id("run"),
            worker_name="alpha",
            version_id="v",
            status=RunStatus.FAILED,
            error_code=RunErrorCode.SANDBOX_UNAVAILABLE,
            attempt=2,
            started_at=now - timedelta(seconds=40),
            finished_at=now,
        ),
        Run(
            id=new_id("run"),
            worker_name="beta",
            version_id="v",
            status=RunStatus.QUEUED,
            created_at=now - timedelta(seconds=90),
        ),
        Run(
            id=new_id("run"),
            worker_name="beta",
            version_id="v",
            status=RunStatus.QUEUED,
            not_before=now + timedelta(hours=1),
        ),
        Approval(id=new_id("apr"), run_id="r", worker_name="beta", kind=ApprovalKind.RUN),
        Transcript(
            run_id=new_id("run"),
            worker_name="gamma",
            model="m",
            input_tokens=120,
            output_tokens=30,
            cost_usd=0.25,
        ),
        TriggerFire(
            trigger_id="t",
            scheduled_for=now - timedelta(seconds=10),
            created_at=now - timedelta(seconds=8),
            outcome="run",
        ),
        WebhookDelivery(
            id=new_id("dlv"),
            source="webhook",
            worker_name="alpha",
            delivery_key="k1",
            outcome="run",
        ),
        WebhookDelivery(
            id=new_id("dlv"),
            source="webhook",
            worker_name="alpha",
            delivery_key="k2",
            outcome="input_invalid",
        ),
    ]
    # Agent runs: one ran a command (its sandbox started), one ran none, as an exact replay
    # never does; both started.
    for ran_a_command in (True, False):
        agent_run = Run(
            id=new_id("run"),
            worker_name="delta",
            version_id="v",
            status=RunStatus.SUCCEEDED,
            started_at=now - timedelta(seconds=3),
            finished_at=now,
            sandbox_seconds=0.5 if ran_a_command else 0.0,
        )
        rows += [agent_run, Transcript(run_id=agent_run.id, worker_name="delta", model="m")]
    with session_scope(server.ctx.engine, write=True) as s:
        for row in rows:
            s.add(row)


def test_metrics_report_the_store_in_the_prometheus_format(
    tmp_path: Path, database_url: str
) -> None:
    # An api-only node: no executor claims the queued runs seeded here.
    with live_server(tmp_path / "data", database_url, roles="api") as server:
        _check_metrics(server)


def _check_metrics(server: LiveServer) -> None:
    _seed(server)
    _, reader = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="prometheus")
    with server.client(reader) as api:
        resp = api.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    got = _samples(resp.text)
    assert got[("floom_runs", (("status", "succeeded"), ("worker", "alpha")))] == 1
    assert got[("floom_runs", (("status", "queued"), ("worker", "beta")))] == 2
    assert got[("floom_queue_depth", ())] == 1  # the other one waits for its retry delay
    assert 85 <= got[("floom_queue_oldest_age_seconds", ())] < 300
    assert got[("floom_run_duration_seconds_bucket", (("le", "5.0"), ("worker", "alpha")))] == 1
    assert got[("floom_run_duration_seconds_count", (("worker", "alpha"),))] == 2
    assert got[("floom_sandbox_starts_total", (("worker", "alpha"),))] == 3
    assert got[("floom_sandbox_starts_total", (("worker", "delta"),))] == 1
    assert got[("floom_sandbox_failures_total", (("worker", "alpha"),))] == 1
    assert 1.5 <= got[("floom_scheduler_lag_seconds", ())] <= 2.5
    assert got[("floom_webhook_deliveries_total", (("outcome", "run"), ("source", "webhook")))] == 1
    assert got[("floom_approvals_pending", (("worker", "beta"),))] == 1
    assert got[("floom_agent_tokens_total", (("kind", "input"), ("worker", "gamma")))] == 120
    assert got[("floom_agent_cost_usd_total", (("worker", "gamma"),))] == 0.25

    # A second scrape counts each finished run once.
    with server.client(reader) as api:
        again = _samples(api.get("/metrics").text)
    assert again[("floom_run_duration_seconds_count", (("worker", "alpha"),))] == 2


def test_metrics_need_an_api_key(server: LiveServer) -> None:
    with server.client("") as anonymous:
        resp = anonymous.get("/metrics")
    assert resp.status_code == 401
    assert "floom_runs" not in resp.text
