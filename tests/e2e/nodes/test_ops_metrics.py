"""/metrics answers in the Prometheus format, with a read-scoped key only: runs by worker and
status, queue depth and age, run durations, sandbox starts and failures, scheduler lag,
webhook deliveries, pending approvals, agent tokens and cost. Workers are named in labels
only while deployed and up to a cap: what others ran is counted under worker="_other"."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import floom.services.ops.metrics as metrics
from floom.errors import RunErrorCode
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.workers.deletion import delete_worker
from floom.store.agents import Approval, Transcript
from floom.store.db import session_scope
from floom.store.models import Run, Worker, new_id, utcnow
from floom.store.triggers import TriggerFire, WebhookDelivery
from floom.vocabulary import ApprovalKind, RunStatus
from tests.support.harness import LiveServer, deploy_in_store, live_server, make_worker


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _seed(server: LiveServer) -> None:
    now = utcnow()
    rows: list[Any] = [Worker(name=name) for name in ("alpha", "beta", "gamma", "delta")]
    rows += [
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


def _ran(server: LiveServer, worker: str) -> None:
    now = utcnow()
    with session_scope(server.ctx.engine, write=True) as s:
        s.add(
            Run(
                id=new_id("run"),
                worker_name=worker,
                version_id="v",
                status=RunStatus.SUCCEEDED,
                started_at=now - timedelta(seconds=1),
                finished_at=now,
            )
        )


def _worker_labels(got: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    return {value for _, labels in got for key, value in labels if key == "worker"}


def test_metrics_name_deployed_workers_only_up_to_a_cap_and_count_the_rest_as_other(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deploy key can make any number of worker names, deleting each after a run: each
    name would be series kept for good (in Prometheus, and in the process's duration tally)."""
    monkeypatch.setattr(metrics, "MAX_WORKER_LABELS", 3)
    names = [f"minted-{i:02d}" for i in range(10)]
    with live_server(tmp_path / "data", database_url, roles="api") as server:
        for name in names:
            folder = make_worker(tmp_path / name, f"name: {name}\n", {"run.py": "print(1)\n"})
            deploy_in_store(server.ctx, folder)
            _ran(server, name)
        _, reader = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="prom")
        with server.client(reader) as api:
            first = _samples(api.get("/metrics").text)
        # The three deployed first are named; the seven others are counted together.
        assert _worker_labels(first) == {*names[:3], "_other"}
        assert first[("floom_runs", (("status", "succeeded"), ("worker", "_other")))] == 7
        assert first[("floom_run_duration_seconds_count", (("worker", "_other"),))] == 7
        for name in names[:5]:
            delete_worker(server.ctx, name=name, purge_runs=False, caller=SYSTEM)
        for name in [f"more-{i}" for i in range(5)]:  # more names, run and deleted
            folder = make_worker(tmp_path / name, f"name: {name}\n", {"run.py": "print(1)\n"})
            deploy_in_store(server.ctx, folder)
            _ran(server, name)
            delete_worker(server.ctx, name=name, purge_runs=False, caller=SYSTEM)
        with server.client(reader) as api:
            second = _samples(api.get("/metrics").text)
    # Deleted workers' series are gone (their runs counted under _other, none lost); the
    # three earliest of those still deployed take the labels.
    assert _worker_labels(second) == {*names[5:8], "_other"}
    runs = [v for (n, labels), v in second.items() if n == "floom_runs"]
    assert sum(runs) == 15
    assert second[("floom_runs", (("status", "succeeded"), ("worker", "_other")))] == 12
    # The duration tally counts each run once, when it first sees it: runs of a worker
    # counted under _other before it got a label stay there.
    counted = [v for (n, _), v in second.items() if n == "floom_run_duration_seconds_count"]
    assert sum(counted) == 15
    assert len({labels for n, labels in second if n == "floom_runs"}) == 4
