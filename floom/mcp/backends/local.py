"""The Backend of the `/mcp` endpoint inside the floom server: floom's services, called with
the API key the MCP client sent, whose scope decides what it may do."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import anyio.to_thread

from floom.errors import Conflict
from floom.mcp.backends.base import JSON, Backend
from floom.mcp.catalog import CatalogWorker
from floom.schemas import admin as admin_models
from floom.schemas import alerts as alert_views
from floom.schemas import handoffs as handoff_models
from floom.schemas import replays as replay_views
from floom.schemas import workers as worker_models
from floom.schemas.admin import SecretDeleted, SecretPublic, SecretSet
from floom.schemas.alerts import AlertDeliveryPublic as AlertDelivery
from floom.schemas.alerts import (
    ChannelChange,
    ChannelList,
    ChannelPublic,
    DeliveryQuery,
    RuleCreate,
    RuleList,
    RulePublic,
)
from floom.schemas.common import Page
from floom.schemas.handoffs import (
    ClaimNextResult,
    JobPublic,
    JobQuery,
    JobRequest,
    LeaseState,
    ReopenContext,
    WhoAmI,
)
from floom.schemas.replays import EvalReport, EvalStart, ReplayReport
from floom.schemas.runs import (
    ApprovalDecided,
    ApprovalPublic,
    ApprovalQuery,
    ArtifactPublic,
    LogPage,
    RunDetail,
    RunPublic,
    RunQuery,
    RunRequest,
)
from floom.schemas.triggers import TriggerListing
from floom.schemas.workers import (
    DeployResult,
    RollbackResult,
    StateVersionPublic,
    ValidationResult,
    VersionPublic,
    WorkerDeleted,
    WorkerDetail,
    WorkerPublic,
    WorkerStatePublic,
)
from floom.services.access import secrets
from floom.services.access.principal import SYSTEM, Principal
from floom.services.alerts import callbacks
from floom.services.alerts import channels as alert_channels
from floom.services.alerts import deliveries as alert_deliveries
from floom.services.alerts import rules as alert_rules
from floom.services.context import Context
from floom.services.handoffs import agents as handoff_agents
from floom.services.handoffs import flow as handoff_flow
from floom.services.handoffs import jobs as handoffs
from floom.services.handoffs import review as handoff_review
from floom.services.replays import evals
from floom.services.replays import gate as eval_gate
from floom.services.replays import replay as replays
from floom.services.runs import approvals
from floom.services.runs import lifecycle as runs
from floom.services.runs import waits as run_waits
from floom.services.triggers import registry as triggers
from floom.services.workers import deletion as worker_deletion
from floom.services.workers import state as worker_state
from floom.services.workers import versions as workers
from floom.store.models import Worker
from floom.views import admin as admin_views
from floom.views import handoffs as handoff_views
from floom.views import runs as run_views
from floom.views import triggers as trigger_views
from floom.views import workers as worker_views
from floom.vocabulary import RunTrigger


class CatalogSource:
    """Every worker's name and active manifest, for the MCP catalog (server-internal, no key).

    Polled every few seconds, so a manifest is read again only when the worker's active
    version changed: one query per 200 workers in the steady state."""

    def __init__(self, ctx: Callable[[], Context], *, cap: int = 1000) -> None:
        self._ctx = ctx
        self._cap = cap
        self._seen: dict[str, tuple[str | None, CatalogWorker]] = {}

    def __call__(self) -> list[CatalogWorker]:
        ctx = self._ctx()
        rows: list[Worker] = []
        cursor: str | None = None
        while len(rows) < self._cap:
            page, cursor = workers.list_workers(ctx, cursor=cursor, limit=200, caller=SYSTEM)
            rows.extend(page)
            if not cursor:
                break
        seen: dict[str, tuple[str | None, CatalogWorker]] = {}
        for w in rows[: self._cap]:
            known = self._seen.get(w.name)
            if known is None or known[0] != w.active_version_id:
                manifest = None
                if w.active_version_id:
                    version = workers.get_version(
                        ctx, version_id=w.active_version_id, caller=SYSTEM
                    )
                    manifest = workers.manifest_of(version)
                # The kind is left out, as this listing always has (a gated agent's tool is
                # described by its approvals alone here).
                known = (w.active_version_id, CatalogWorker(w.name, None, manifest))
            seen[w.name] = known
        self._seen = seen
        return [body for _, body in seen.values()]


class LocalBackend(Backend):
    """Calls floom's services as `caller`, which decide what it may do; this class only
    translates their results into the tools' JSON. `base_url` is where the caller reached
    this server, for webhook URLs when FLOOM_PUBLIC_URL is not set."""

    def __init__(self, ctx: Context, caller: Principal, *, base_url: str = "") -> None:
        self.ctx = ctx
        self.principal = caller
        self.public_url = (ctx.settings.public_url or base_url).rstrip("/")
        self.hook_urls = triggers.HookUrls(self.public_url)

    def caller(self) -> Principal:
        return self.principal

    # -- workers and versions ------------------------------------------------------------------

    def list_workers(self, *, cursor: str | None = None, limit: int = 50) -> Page[WorkerPublic]:
        ctx, caller = self.ctx, self.principal
        return worker_views.worker_page(ctx, cursor=cursor, limit=limit, caller=caller)

    def get_worker(self, name: str) -> WorkerDetail:
        return worker_views.worker_detail(self.ctx, name=name, caller=self.principal)

    def get_manifest_yaml(self, name: str) -> str:
        ctx, caller = self.ctx, self.principal
        worker = workers.get_worker(ctx, name=name, caller=caller)
        if worker.active_version_id is None:
            raise Conflict(f"worker '{name}' has no active version", hint="deploy it")
        version = workers.get_version(ctx, version_id=worker.active_version_id, caller=caller)
        return version.manifest_yaml

    def validate(self, archive: bytes) -> ValidationResult:
        ctx = self.ctx
        validation = workers.validate_archive(ctx, archive=archive, caller=self.principal)
        return worker_models.ValidationResult.of(validation, surface=self.principal.surface)

    def deploy(self, archive: bytes, *, skip_eval_gate: bool = False) -> DeployResult:
        ctx = self.ctx
        result = eval_gate.deploy_gated(
            ctx, archive=archive, caller=self.principal, skip_gate=skip_eval_gate
        )
        return worker_views.deploy_result(ctx, result, caller=self.principal)

    def list_versions(self, name: str) -> Page[VersionPublic]:
        return worker_views.version_page(self.ctx, name=name, caller=self.principal)

    def rollback(
        self,
        name: str,
        *,
        version_id: str | None,
        run_id: str | None,
        state_version: int | None = None,
    ) -> RollbackResult:
        ctx = self.ctx
        if state_version is not None:
            rollback = worker_state.rollback_with_state(
                ctx,
                name=name,
                version_id=version_id,
                run_id=run_id,
                state_version=state_version,
                caller=self.principal,
            )
        else:
            rollback = workers.rollback(
                ctx, name=name, version_id=version_id, run_id=run_id, caller=self.principal
            )
        result = worker_views.rollback_result(
            ctx, name=name, rollback=rollback, caller=self.principal
        )
        return result

    def get_state(self, name: str, *, version: int | None = None) -> WorkerStatePublic:
        view = worker_views.worker_state_public(
            self.ctx, name=name, version=version, caller=self.principal
        )
        return view

    def set_state(
        self,
        name: str,
        *,
        state: Any = None,
        from_version: int | None = None,
        if_version: int | None = None,
    ) -> WorkerStatePublic:
        row = worker_state.set_state(
            self.ctx,
            worker_name=name,
            state=state,
            from_version=from_version,
            if_version=if_version,
            caller=self.principal,
        )
        return self.get_state(name, version=row.version)

    def state_versions(self, name: str, *, limit: int = 20) -> Page[StateVersionPublic]:
        page = worker_views.state_version_page(
            self.ctx, name=name, limit=limit, caller=self.principal
        )
        return page

    def delete_worker(self, name: str, *, purge_runs: bool) -> WorkerDeleted:
        ctx = self.ctx
        deletion = worker_deletion.delete_worker(
            ctx, name=name, purge_runs=purge_runs, caller=self.principal
        )
        return worker_models.WorkerDeleted.of(deletion)

    # -- runs ----------------------------------------------------------------------------------

    def start_run(self, worker: str, run: RunRequest, *, wait_seconds: float = 0) -> RunPublic:
        # In the server's process a tool's wait costs no round trip: the tool awaits
        # wait_for_run on the event loop instead of holding this worker thread.
        ctx = self.ctx
        callback = callbacks.check_callback_url(ctx, run.callback_url)
        started = runs.create_run(
            ctx,
            worker_name=worker,
            inputs=run.inputs,
            coerce_strings=run.coerce_strings,
            trigger=RunTrigger.MCP,
            caller=self.principal,
            version_id=run.version_id,
            force=run.force,
            in_transaction=callbacks.recorder(callback),
        )
        return run_views.started_run(ctx, started, surface=self.principal.surface)

    def list_runs(self, query: RunQuery) -> Page[RunPublic]:
        ctx = self.ctx
        rows, next_cursor = runs.list_runs(ctx, **query.model_dump(), caller=self.principal)
        return run_views.run_page(rows, next_cursor, surface=self.principal.surface)

    def get_run(self, run_id: str) -> RunDetail:
        return run_views.run_detail(self.ctx, run_id=run_id, caller=self.principal)

    async def wait_for_run(self, run_id: str, *, seconds: float) -> RunDetail:
        ctx = self.ctx
        _, detail = await run_waits.wait_and_read(
            ctx,
            run_id=run_id,
            timeout=seconds,
            until="settled",
            caller=self.principal,
            then=functools.partial(run_views.run_detail_of, ctx, caller=self.principal),
        )
        if detail is not None:  # read with the run that ended the wait
            return detail
        return await anyio.to_thread.run_sync(self.get_run, run_id)

    def get_logs(
        self, run_id: str, *, after: int = 0, tail: int | None = None, limit: int = 1000
    ) -> LogPage:
        ctx = self.ctx
        page = run_views.log_page(
            ctx, run_id=run_id, after=after, tail=tail, limit=limit, caller=self.principal
        )
        return page

    def list_artifacts(self, run_id: str) -> Page[ArtifactPublic]:
        return run_views.artifact_page(self.ctx, run_id=run_id, caller=self.principal)

    def read_artifact(self, run_id: str, name: str) -> bytes:
        _, data = runs.read_artifact(self.ctx, run_id=run_id, name=name, caller=self.principal)
        return data

    def link(self, path: str) -> str:
        return self.public_url + path

    def cancel_run(self, run_id: str) -> RunDetail:
        ctx = self.ctx
        runs.cancel_run(ctx, run_id=run_id, caller=self.principal)
        return self.get_run(run_id)

    def replay_run(self, run_id: str, *, latest: bool = False, force: bool = False) -> RunPublic:
        ctx = self.ctx
        run = runs.replay_run(ctx, run_id=run_id, latest=latest, caller=self.principal, force=force)
        return run_views.started_run(ctx, run, surface=self.principal.surface)

    # -- replays from recordings and evals -----------------------------------------------------

    def alert_channels(self) -> ChannelList:
        rows = alert_channels.list_channels(self.ctx, caller=self.principal)
        full = alert_channels.sees_whole_urls(self.principal)
        return alert_views.ChannelList(
            items=[alert_views.channel_public(r, full=full) for r in rows]
        )

    def add_alert_channel(self, name: str, kind: str, config: JSON) -> ChannelPublic:
        row = alert_channels.create_channel(
            self.ctx, name=name, kind=kind, config=config, caller=self.principal
        )
        return alert_views.channel_public(row)

    def update_alert_channel(self, name: str, change: ChannelChange) -> ChannelPublic:
        row = alert_channels.change_channel(
            self.ctx, name=name, changes=change.config, caller=self.principal
        )
        return alert_views.channel_public(row)

    def test_alert_channel(self, name: str) -> AlertDelivery:
        sent = alert_deliveries.send_test(self.ctx, channel_name=name, caller=self.principal)
        return alert_views.delivery_public(sent)

    def alert_rules(self) -> RuleList:
        rows = alert_rules.list_rules(self.ctx, caller=self.principal)
        return alert_views.RuleList(items=[alert_views.rule_public(r) for r in rows])

    def add_alert_rule(self, rule: RuleCreate) -> RulePublic:
        row = alert_rules.create_rule(self.ctx, **rule.model_dump(), caller=self.principal)
        return alert_views.rule_public(row)

    def set_alert_rule_enabled(self, name: str, enabled: bool) -> RulePublic:
        row = alert_rules.set_enabled(self.ctx, name=name, enabled=enabled, caller=self.principal)
        return alert_views.rule_public(row)

    def alert_deliveries(self, query: DeliveryQuery) -> Page[AlertDelivery]:
        rows, next_cursor = alert_deliveries.list_deliveries(
            self.ctx, **query.model_dump(), caller=self.principal
        )
        return alert_views.delivery_page(
            rows, next_cursor, full=alert_channels.sees_whole_urls(self.principal)
        )

    def resend_alert_delivery(self, delivery_id: str) -> AlertDelivery:
        sent = alert_deliveries.resend(self.ctx, delivery_id=delivery_id, caller=self.principal)
        return alert_views.delivery_public(sent)

    def start_replay(
        self, run_id: str, *, mode: str, version_id: str | None = None, model: str | None = None
    ) -> RunPublic:
        ctx = self.ctx
        run = replays.start_replay(
            ctx, run_id=run_id, mode=mode, version_id=version_id, model=model, caller=self.principal
        )
        return run_views.started_run(ctx, run, surface=self.principal.surface)

    def get_replay(self, run_id: str) -> ReplayReport:
        ctx = self.ctx
        report = replays.replay_report(ctx, run_id=run_id, caller=self.principal)
        return replay_views.replay_report(report)

    def start_eval(self, worker: str, start: EvalStart) -> EvalReport:
        ctx = self.ctx
        row = evals.start_eval(
            ctx,
            worker_name=worker,
            selector=start.runs,
            version_id=start.version_id,
            model=start.model,
            caller=self.principal,
        )
        return self.get_eval(row.id)

    def get_eval(self, eval_id: str) -> EvalReport:
        ctx = self.ctx
        report = evals.eval_report(ctx, eval_id=eval_id, caller=self.principal)
        return replay_views.eval_report(report)

    # -- triggers, approvals -------------------------------------------------------------------

    def list_triggers(self, name: str) -> TriggerListing:
        return self._triggers(self.ctx, name)

    def set_paused(self, name: str, *, paused: bool, trigger: str | None = None) -> TriggerListing:
        ctx = self.ctx
        triggers.set_paused(
            ctx, worker_name=name, paused=paused, trigger_id=trigger, caller=self.principal
        )
        return self._triggers(ctx, name)

    def _triggers(self, ctx: Context, name: str) -> TriggerListing:
        listing = trigger_views.trigger_listing(
            ctx, name=name, urls=self.hook_urls, caller=self.principal
        )
        return listing

    def list_approvals(self, query: ApprovalQuery) -> Page[ApprovalPublic]:
        pending = query.model_copy(update={"status": query.status or approvals.PENDING})
        rows, next_cursor = approvals.list_approvals(
            self.ctx, **pending.model_dump(), caller=self.principal
        )
        return run_views.approval_page(rows, next_cursor)

    def decide_approval(
        self,
        approval_id: str,
        *,
        approve: bool,
        edits: JSON | None = None,
        comment: str | None = None,
    ) -> ApprovalDecided:
        ctx = self.ctx
        approvals.decide_approval(
            ctx,
            approval_id=approval_id,
            decision="approve" if approve else "reject",
            edited=edits,
            comment=comment,
            caller=self.principal,
        )
        return run_views.approval_decided(ctx, approval_id=approval_id, caller=self.principal)

    # -- secrets -------------------------------------------------------------------------------

    def list_secrets(self) -> Page[SecretPublic]:
        return admin_views.secret_page(self.ctx, caller=self.principal)

    def set_secret(self, name: str, value: str) -> SecretSet:
        secrets.set_secret(self.ctx, name=name, value=value, caller=self.principal)
        return admin_models.SecretSet(name=name, set=True)

    def delete_secret(self, name: str) -> SecretDeleted:
        secrets.delete_secret(self.ctx, name=name, caller=self.principal)
        return admin_models.SecretDeleted(name=name, deleted=True)

    # -- handoffs: the key is the actor; the services apply visibility and the table -----------

    def _job(self, job: handoffs.JobRecord) -> JobPublic:
        return handoff_views.job_public(job, surface=self.principal.surface)

    def handoff_my_roles(self) -> WhoAmI:
        who = handoff_agents.my_roles(self.ctx, actor=self.principal)
        return handoff_models.WhoAmI.model_validate(who)

    def handoff_list_jobs(self, query: JobQuery) -> Page[JobPublic]:
        ctx = self.ctx
        items, next_cursor = handoffs.list_jobs(ctx, actor=self.principal, **query.model_dump())
        surface = self.principal.surface
        return handoff_views.job_page(items, next_cursor, surface=surface)

    def handoff_get_job(self, job_id: str, *, events: bool = True) -> JobPublic:
        ctx = self.ctx
        return self._job(handoffs.get_job(ctx, actor=self.principal, job_id=job_id, events=events))

    def handoff_create_job(self, job: JobRequest) -> JobPublic:
        created = handoffs.create_job(self.ctx, actor=self.principal, **job.model_dump())
        return self._job(created)

    def handoff_claim_job(self, job_id: str, *, lease_seconds: float | None = None) -> JobPublic:
        ctx = self.ctx
        job = handoff_flow.claim(
            ctx, actor=self.principal, job_id=job_id, lease_seconds=lease_seconds
        )
        return self._job(job)

    def handoff_claim_next_job(
        self, *, role: str | None = None, lease_seconds: float | None = None
    ) -> ClaimNextResult:
        ctx = self.ctx
        job = handoff_flow.claim_next(
            ctx, actor=self.principal, role=role, lease_seconds=lease_seconds
        )
        return handoff_views.claim_next_result(job, surface=self.principal.surface)

    def handoff_heartbeat(self, job_id: str, *, lease_seconds: float | None = None) -> LeaseState:
        ctx = self.ctx
        state = handoff_flow.heartbeat(
            ctx, actor=self.principal, job_id=job_id, lease_seconds=lease_seconds
        )
        return handoff_models.LeaseState.model_validate(state)

    def handoff_set_status(
        self,
        job_id: str,
        status: str,
        *,
        reason: str | None = None,
        lease_seconds: float | None = None,
    ) -> JobPublic:
        job = handoff_flow.set_status(
            self.ctx,
            actor=self.principal,
            job_id=job_id,
            status=status,
            reason=reason,
            lease_seconds=lease_seconds,
        )
        return self._job(job)

    def handoff_update_job(
        self, job_id: str, *, context: JSON | None = None, constraints: list[str] | None = None
    ) -> JobPublic:
        job = handoffs.update_job(
            self.ctx,
            actor=self.principal,
            job_id=job_id,
            context=context,
            constraints=constraints,
        )
        return self._job(job)

    def handoff_complete_job(
        self,
        job_id: str,
        *,
        summary: str = "",
        data: JSON | None = None,
        artifacts: list[JSON] | None = None,
    ) -> JobPublic:
        job = handoff_flow.complete(
            self.ctx,
            actor=self.principal,
            job_id=job_id,
            summary=summary,
            data=data,
            artifacts=artifacts,
        )
        return self._job(job)

    def handoff_reject_job(
        self, job_id: str, *, reason: str, role: str | None = None, priority: str | None = None
    ) -> JobPublic:
        retry = handoff_review.reject(
            self.ctx,
            actor=self.principal,
            job_id=job_id,
            reason=reason,
            role=role,
            priority=priority,
        )
        return self._job(retry)

    def handoff_reopen_context(self, job_id: str) -> ReopenContext:
        ctx = self.ctx
        focus = handoff_review.reopen_context(ctx, actor=self.principal, job_id=job_id)
        return handoff_models.ReopenContext.model_validate(focus)
