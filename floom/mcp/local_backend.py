"""The Backend of the `/mcp` endpoint inside the floom server: floom's services, called with
the API key the MCP client sent, whose scope decides what it may do."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic_core import to_jsonable_python

from floom.errors import Conflict
from floom.mcp.backend import JSON, Backend
from floom.services import (
    agent_runs,
    approvals,
    handoff_agents,
    handoff_flow,
    handoff_review,
    handoffs,
    keys,
    logs,
    runs,
    secrets,
    triggers,
    worker_deletion,
    workers,
)
from floom.services.audit import AuditActor
from floom.services.context import Context
from floom.store.models import ApiKey, Worker

RECENT_RUNS = 10


def _jsonable(value: Any) -> Any:
    """JSON values as the REST API renders them (pydantic's encoding of datetimes)."""
    return to_jsonable_python(value)


def worker_body(ctx: Context, name: str) -> JSON:
    worker = workers.get_worker(ctx, name=name)
    version = (
        workers.get_version(ctx, version_id=worker.active_version_id)
        if worker.active_version_id
        else None
    )
    body = workers.worker_to_dict(worker, version)
    body["triggers"] = triggers.summary(ctx, worker_name=name)
    return body


class CatalogSource:
    """Every worker's name and active manifest, for the MCP catalog (server-internal, no key).

    Polled every few seconds, so a manifest is read again only when the worker's active
    version changed: one query per 200 workers in the steady state."""

    def __init__(self, ctx: Callable[[], Context], *, cap: int = 1000) -> None:
        self._ctx = ctx
        self._cap = cap
        self._seen: dict[str, tuple[str | None, JSON]] = {}

    def __call__(self) -> list[JSON]:
        ctx = self._ctx()
        rows: list[Worker] = []
        cursor: str | None = None
        while len(rows) < self._cap:
            page, cursor = workers.list_workers(ctx, cursor=cursor, limit=200)
            rows.extend(page)
            if not cursor:
                break
        seen: dict[str, tuple[str | None, JSON]] = {}
        for w in rows[: self._cap]:
            known = self._seen.get(w.name)
            if known is None or known[0] != w.active_version_id:
                manifest = None
                if w.active_version_id:
                    version = workers.get_version(ctx, version_id=w.active_version_id)
                    manifest = json.loads(version.manifest_json)
                known = (w.active_version_id, {"name": w.name, "manifest": manifest})
            seen[w.name] = known
        self._seen = seen
        return [body for _, body in seen.values()]


class LocalBackend(Backend):
    """`base_url` is where the caller reached this server, for webhook URLs when
    FLOOM_PUBLIC_URL is not set."""

    def __init__(self, ctx: Context, key: ApiKey, *, base_url: str = "") -> None:
        self.ctx = ctx
        self.key = key
        self.hook_urls = triggers.HookUrls(ctx.settings.public_url or base_url)

    def _need(self, scope: str) -> Context:
        keys.require(self.key, scope)
        return self.ctx

    # -- workers and versions ------------------------------------------------------------------

    def list_workers(self, *, cursor: str | None = None, limit: int = 50) -> JSON:
        ctx = self._need("read")
        rows, next_cursor = workers.list_workers(ctx, cursor=cursor, limit=limit)
        items = [worker_body(ctx, w.name) for w in rows]
        return _jsonable({"items": items, "next_cursor": next_cursor})

    def get_worker(self, name: str) -> JSON:
        ctx = self._need("read")
        body = worker_body(ctx, name)
        recent, _ = runs.list_runs(ctx, worker=name, limit=RECENT_RUNS)
        body["recent_runs"] = [runs.run_to_dict(r) for r in recent]
        return _jsonable(body)

    def get_manifest_yaml(self, name: str) -> str:
        ctx = self._need("read")
        worker = workers.get_worker(ctx, name=name)
        if worker.active_version_id is None:
            raise Conflict(f"worker '{name}' has no active version", hint="deploy it")
        return workers.get_version(ctx, version_id=worker.active_version_id).manifest_yaml

    def validate(self, archive: bytes) -> JSON:
        ctx = self._need("read")
        manifest, problems = workers.validate_archive(ctx, archive=archive)
        return {
            "valid": not problems,
            "problems": [p.to_dict() for p in problems],
            "manifest": manifest.model_dump(mode="json") if manifest else None,
        }

    def deploy(self, archive: bytes) -> JSON:
        ctx = self._need("deploy")
        result = workers.deploy(ctx, archive=archive, actor=self.key.id)
        return _jsonable(
            {
                "worker": worker_body(ctx, result.worker.name),
                "version": workers.version_to_dict(result.version, active_id=result.version.id),
                "created": result.created,
                "activated": result.activated,
            }
        )

    def list_versions(self, name: str) -> JSON:
        ctx = self._need("read")
        worker = workers.get_worker(ctx, name=name)
        rows = workers.list_versions(ctx, name=name)
        items = [workers.version_to_dict(v, active_id=worker.active_version_id) for v in rows]
        return _jsonable({"items": items, "next_cursor": None})

    def rollback(self, name: str, *, version_id: str | None, run_id: str | None) -> JSON:
        ctx = self._need("deploy")
        version = workers.rollback(ctx, name=name, version_id=version_id, run_id=run_id)
        return _jsonable(
            {
                "worker": worker_body(ctx, name),
                "version": workers.version_to_dict(version, active_id=version.id),
            }
        )

    def delete_worker(self, name: str, *, purge_runs: bool) -> JSON:
        ctx = self._need("deploy")
        deletion = worker_deletion.delete_worker(
            ctx, name=name, purge_runs=purge_runs, actor=AuditActor.of_key(self.key)
        )
        return _jsonable({"deleted": True, **deletion.to_dict()})

    # -- runs ----------------------------------------------------------------------------------

    def start_run(self, worker: str, inputs: JSON, *, force: bool = False) -> JSON:
        ctx = self._need("run")
        run = runs.create_run(
            ctx, worker_name=worker, inputs=inputs, trigger="mcp", actor=self.key.id, force=force
        )
        return _jsonable(runs.run_to_dict(run, artifacts=[]))

    def list_runs(
        self,
        *,
        worker: str | None = None,
        status: str | None = None,
        trigger: str | None = None,
        cursor: str | None = None,
        limit: int = 20,
    ) -> JSON:
        ctx = self._need("read")
        rows, next_cursor = runs.list_runs(
            ctx, worker=worker, status=status, trigger=trigger, cursor=cursor, limit=limit
        )
        return _jsonable({"items": [runs.run_to_dict(r) for r in rows], "next_cursor": next_cursor})

    def get_run(self, run_id: str) -> JSON:
        ctx = self._need("read")
        run = runs.get_run(ctx, run_id=run_id)
        body = runs.run_to_dict(run, artifacts=runs.list_artifacts(ctx, run_id=run_id))
        body.update(agent_runs.run_extras(ctx, run=run))
        return _jsonable(body)

    def get_logs(
        self, run_id: str, *, after: int = 0, tail: int | None = None, limit: int = 1000
    ) -> JSON:
        ctx = self._need("read")
        run = runs.get_run(ctx, run_id=run_id)
        if tail:
            rows = logs.tail_events(ctx, run_id=run_id, count=tail)
        else:
            rows = logs.list_events(ctx, run_id=run_id, after=after, limit=limit)
        return _jsonable(
            {
                "items": [logs.event_to_dict(e) for e in rows],
                "last_seq": rows[-1].seq if rows else after,
                "run_status": run.status,
                "complete": run.status in runs.TERMINAL and len(rows) < limit,
            }
        )

    def cancel_run(self, run_id: str) -> JSON:
        ctx = self._need("run")
        runs.cancel_run(ctx, run_id=run_id, actor=self.key.id)
        return self.get_run(run_id)

    def replay_run(self, run_id: str, *, latest: bool = False, force: bool = False) -> JSON:
        ctx = self._need("run")
        run = runs.replay_run(ctx, run_id=run_id, latest=latest, actor=self.key.id, force=force)
        return _jsonable(runs.run_to_dict(run, artifacts=[]))

    # -- triggers, approvals -------------------------------------------------------------------

    def list_triggers(self, name: str) -> JSON:
        return self._triggers(self._need("read"), name)

    def set_paused(self, name: str, *, paused: bool, trigger: str | None = None) -> JSON:
        ctx = self._need("deploy")
        triggers.set_paused(ctx, worker_name=name, paused=paused, trigger_id=trigger)
        return self._triggers(ctx, name)

    def _triggers(self, ctx: Context, name: str) -> JSON:
        worker, rows = triggers.list_triggers(ctx, worker_name=name)
        items = [triggers.trigger_to_dict(ctx, t, worker=worker, urls=self.hook_urls) for t in rows]
        return _jsonable(
            {"worker": name, "paused": worker.paused, "items": items, "next_cursor": None}
        )

    def list_approvals(self, *, status: str | None = None, worker: str | None = None) -> JSON:
        ctx = self._need("read")
        rows, next_cursor = approvals.list_approvals(ctx, status=status or "pending", limit=500)
        items = [approvals.approval_to_dict(a) for a in rows]
        if worker:
            items = [a for a in items if a.get("worker") == worker]
        return _jsonable({"items": items, "next_cursor": next_cursor})

    def decide_approval(
        self,
        approval_id: str,
        *,
        approve: bool,
        edits: JSON | None = None,
        comment: str | None = None,
    ) -> JSON:
        ctx = self._need("run")
        approval = approvals.decide_approval(
            ctx,
            approval_id=approval_id,
            decision="approve" if approve else "reject",
            edited=edits,
            comment=comment,
            actor=self.key.id,
        )
        body = approvals.approval_to_dict(approval)
        body["run_status"] = runs.get_run(ctx, run_id=approval.run_id).status
        return _jsonable(body)

    # -- secrets -------------------------------------------------------------------------------

    def list_secrets(self) -> JSON:
        ctx = self._need("deploy")
        return _jsonable({"items": secrets.list_secrets(ctx), "next_cursor": None})

    def set_secret(self, name: str, value: str) -> JSON:
        secrets.set_secret(self._need("deploy"), name=name, value=value)
        return {"name": name, "set": True}

    def delete_secret(self, name: str) -> JSON:
        secrets.delete_secret(self._need("deploy"), name=name)
        return {"name": name, "deleted": True}

    # -- handoffs: the key is the actor; the services apply visibility and the table -----------

    def handoff_my_roles(self) -> JSON:
        return _jsonable(handoff_agents.my_roles(self._need("read"), actor=self.key))

    def handoff_list_jobs(
        self,
        *,
        status: list[str] | None = None,
        role: str | None = None,
        assignee: str | None = None,
        source: str | None = None,
        my_roles: bool = False,
        cursor: str | None = None,
        limit: int = 50,
    ) -> JSON:
        items, next_cursor = handoffs.list_jobs(
            self._need("read"),
            actor=self.key,
            status=status,
            role=role,
            assignee=assignee,
            source=source,
            my_roles=my_roles,
            cursor=cursor,
            limit=limit,
        )
        return _jsonable({"items": items, "next_cursor": next_cursor})

    def handoff_get_job(self, job_id: str, *, events: bool = True) -> JSON:
        ctx = self._need("read")
        return _jsonable(handoffs.get_job(ctx, actor=self.key, job_id=job_id, events=events))

    def handoff_create_job(self, **spec: Any) -> JSON:
        return _jsonable(handoffs.create_job(self._need("run"), actor=self.key, **spec))

    def handoff_claim_job(self, job_id: str, *, lease_seconds: float | None = None) -> JSON:
        ctx = self._need("run")
        job = handoff_flow.claim(ctx, actor=self.key, job_id=job_id, lease_seconds=lease_seconds)
        return _jsonable(job)

    def handoff_claim_next_job(
        self, *, role: str | None = None, lease_seconds: float | None = None
    ) -> JSON:
        ctx = self._need("run")
        job = handoff_flow.claim_next(ctx, actor=self.key, role=role, lease_seconds=lease_seconds)
        return _jsonable({"job": job})

    def handoff_heartbeat(self, job_id: str, *, lease_seconds: float | None = None) -> JSON:
        ctx = self._need("run")
        body = handoff_flow.heartbeat(
            ctx, actor=self.key, job_id=job_id, lease_seconds=lease_seconds
        )
        return _jsonable(body)

    def handoff_set_status(
        self,
        job_id: str,
        status: str,
        *,
        reason: str | None = None,
        lease_seconds: float | None = None,
    ) -> JSON:
        job = handoff_flow.set_status(
            self._need("run"),
            actor=self.key,
            job_id=job_id,
            status=status,
            reason=reason,
            lease_seconds=lease_seconds,
        )
        return _jsonable(job)

    def handoff_update_job(
        self, job_id: str, *, context: JSON | None = None, constraints: list[str] | None = None
    ) -> JSON:
        job = handoffs.update_job(
            self._need("run"),
            actor=self.key,
            job_id=job_id,
            context=context,
            constraints=constraints,
        )
        return _jsonable(job)

    def handoff_complete_job(
        self,
        job_id: str,
        *,
        summary: str = "",
        data: JSON | None = None,
        artifacts: list[JSON] | None = None,
    ) -> JSON:
        job = handoff_flow.complete(
            self._need("run"),
            actor=self.key,
            job_id=job_id,
            summary=summary,
            data=data,
            artifacts=artifacts,
        )
        return _jsonable(job)

    def handoff_reject_job(
        self, job_id: str, *, reason: str, role: str | None = None, priority: str | None = None
    ) -> JSON:
        retry = handoff_review.reject(
            self._need("run"),
            actor=self.key,
            job_id=job_id,
            reason=reason,
            role=role,
            priority=priority,
        )
        return _jsonable(retry)

    def handoff_reopen_context(self, job_id: str) -> JSON:
        ctx = self._need("read")
        return _jsonable(handoff_review.reopen_context(ctx, actor=self.key, job_id=job_id))
