"""The Backend of the stdio server `floom mcp`: a client of a floom server's REST API."""

from __future__ import annotations

import functools
from typing import Any

import anyio.to_thread

from floom.client.handoffs import HandoffClient
from floom.client.rest import FloomClient
from floom.client_env import admin_key_file
from floom.errors import ClientError, Conflict, FloomError
from floom.hints import Hint, act, told
from floom.mcp.backends.base import JSON, Backend, NotAvailable
from floom.schemas.admin import KeyPublic, SecretDeleted, SecretPublic, SecretSet
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
from floom.services.access.principal import SCOPES, Principal

NO_KEY = (
    "the floom MCP server was started without an API key: FLOOM_API_KEY is not set and no "
    "--key-file names one (it never picks up a key it was not given)"
)


class NotConfigured(ClientError):
    """`floom mcp` was started without a key to act as (or with a key file it cannot use)."""

    as_written = True

    def __init__(self, message: str = NO_KEY) -> None:
        super().__init__(message, status=0, code="not_configured", hint=setup_hint())


def setup_hint() -> Hint:
    """How to give `floom mcp` a key, naming where this machine's local server keeps its
    admin key: the person at this machine's shell does it, so it is told as the CLI says it
    (NotConfigured.as_written)."""
    admin_key = admin_key_file()
    return told(
        "start ",
        act("mcp"),
        f" with FLOOM_API_KEY set, or with `--key-file {admin_key}` (the admin key a ",
        act("serve"),
        " on this machine saved), and FLOOM_BASE_URL for a server that is not on this "
        "machine; a key of its own is safer: ",
        act("keys create", scope="deploy"),
        f". With Claude Code: `claude mcp add floom -- floom mcp --key-file {admin_key}`",
    )


def principal_of_key(key: KeyPublic) -> Principal:
    """The caller a key's public record (GET /api/v1/keys/me) describes."""
    return Principal(
        key_id=key.id,
        name=key.name or key.id,
        scopes=tuple(s for s in key.scopes if s in SCOPES),
        agent_id=key.agent_id,
        surface="mcp",
    )


class RestBackend(Backend):
    """Without a client (no key configured) every call raises `setup_error`, a
    NotConfigured saying how to configure one. `caller` is the key as the server described
    it, when already asked."""

    reads_local_folders = True

    def __init__(
        self,
        client: FloomClient | None,
        *,
        caller: Principal | None = None,
        setup_error: NotConfigured | None = None,
    ) -> None:
        self._client = client
        self._setup_error = setup_error
        self._paths: set[str] | None = None
        self._handoffs: HandoffClient | None = None
        self._caller = caller

    @property
    def client(self) -> FloomClient:
        if self._client is None:
            raise self._setup_error or NotConfigured()
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def caller(self) -> Principal | None:
        """The configured key as the server knows it, asked once; None while it cannot be
        known (no key, server unreachable or older), and then every tool is listed."""
        if self._caller is None and self._client is not None:
            try:
                key = self._client.my_key()
            except FloomError:
                return None
            self._caller = principal_of_key(key)
        return self._caller

    def _offers(self, path: str, what: str) -> None:
        if self._paths is None:
            self._paths = self.client.api_paths()
        if path not in self._paths:
            raise NotAvailable(
                f"{what} are not available on the floom server at {self.client.base_url}",
                hint="upgrade that floom server to a version with this feature",
            )

    # -- workers and versions ------------------------------------------------------------------

    def list_workers(self, *, cursor: str | None = None, limit: int = 50) -> Page[WorkerPublic]:
        return self.client.list_workers(cursor=cursor, limit=limit)

    def get_worker(self, name: str) -> WorkerDetail:
        return self.client.get_worker(name)

    def get_manifest_yaml(self, name: str) -> str:
        worker = self.client.get_worker(name)
        version_id = worker.active_version_id
        if not version_id:
            raise Conflict(f"worker '{name}' has no active version", hint="deploy it")
        return self.client.get_version(name, version_id).manifest_yaml

    def validate(self, archive: bytes) -> ValidationResult:
        return self.client.validate(archive)

    def deploy(self, archive: bytes, *, skip_eval_gate: bool = False) -> DeployResult:
        return self.client.deploy(archive, skip_eval_gate=skip_eval_gate)

    def list_versions(self, name: str) -> Page[VersionPublic]:
        return self.client.list_versions(name)

    def rollback(
        self,
        name: str,
        *,
        version_id: str | None,
        run_id: str | None,
        state_version: int | None = None,
    ) -> RollbackResult:
        return self.client.rollback(
            name, version_id=version_id, run_id=run_id, state_version=state_version
        )

    def get_state(self, name: str, *, version: int | None = None) -> WorkerStatePublic:
        return self.client.get_state(name, version=version)

    def set_state(
        self,
        name: str,
        *,
        state: Any = None,
        from_version: int | None = None,
        if_version: int | None = None,
    ) -> WorkerStatePublic:
        return self.client.set_state(
            name, state=state, from_version=from_version, if_version=if_version
        )

    def state_versions(self, name: str, *, limit: int = 20) -> Page[StateVersionPublic]:
        return self.client.state_versions(name, limit=limit)

    def delete_worker(self, name: str, *, purge_runs: bool) -> WorkerDeleted:
        return self.client.delete_worker(name, purge_runs=purge_runs)

    # -- runs ----------------------------------------------------------------------------------

    def start_run(self, worker: str, run: RunRequest, *, wait_seconds: float = 0) -> RunPublic:
        # One request when the tool waits: the server holds the start until the run settles.
        return self.client.start_run(worker, run, wait=wait_seconds, until="settled")

    def list_runs(self, query: RunQuery) -> Page[RunPublic]:
        return self.client.list_runs(query)

    def get_run(self, run_id: str) -> RunDetail:
        return self.client.get_run(run_id)

    async def wait_for_run(self, run_id: str, *, seconds: float) -> RunDetail:
        # The server does the waiting (?wait=); this process's thread only holds the request.
        wait = functools.partial(self.client.wait_for_run, run_id, seconds=seconds, until="settled")
        return await anyio.to_thread.run_sync(wait)

    def get_logs(
        self, run_id: str, *, after: int = 0, tail: int | None = None, limit: int = 1000
    ) -> LogPage:
        if tail:
            return self.client.get_logs(run_id, tail=tail)
        return self.client.get_logs(run_id, after=after, limit=limit)

    def list_artifacts(self, run_id: str) -> Page[ArtifactPublic]:
        return self.client.list_artifacts(run_id)

    def read_artifact(self, run_id: str, name: str) -> bytes:
        return self.client.download_artifact(run_id, name)

    def link(self, path: str) -> str:
        return self.client.base_url + path

    def cancel_run(self, run_id: str) -> RunDetail:
        return self.client.cancel_run(run_id)

    def replay_run(self, run_id: str, *, latest: bool = False, force: bool = False) -> RunPublic:
        return self.client.replay_run(run_id, latest=latest, force=force)

    # -- replays from recordings and evals -----------------------------------------------------

    def alert_channels(self) -> ChannelList:
        self._offers("/api/v1/alerts/channels", "alerts")
        return self.client.list_alert_channels()

    def add_alert_channel(self, name: str, kind: str, config: JSON) -> ChannelPublic:
        self._offers("/api/v1/alerts/channels", "alerts")
        return self.client.add_alert_channel(name, kind, config)

    def update_alert_channel(self, name: str, change: ChannelChange) -> ChannelPublic:
        self._offers("/api/v1/alerts/channels/{name}", "alerts")
        return self.client.change_alert_channel(name, change)

    def test_alert_channel(self, name: str) -> AlertDelivery:
        self._offers("/api/v1/alerts/channels", "alerts")
        return self.client.test_alert_channel(name)

    def alert_rules(self) -> RuleList:
        self._offers("/api/v1/alerts/rules", "alerts")
        return self.client.list_alert_rules()

    def add_alert_rule(self, rule: RuleCreate) -> RulePublic:
        self._offers("/api/v1/alerts/rules", "alerts")
        return self.client.add_alert_rule(rule)

    def set_alert_rule_enabled(self, name: str, enabled: bool) -> RulePublic:
        self._offers("/api/v1/alerts/rules/{name}", "alerts")
        return self.client.set_alert_rule_enabled(name, enabled)

    def alert_deliveries(self, query: DeliveryQuery) -> Page[AlertDelivery]:
        self._offers("/api/v1/alerts/deliveries", "alerts")
        return self.client.list_alert_deliveries(query)

    def resend_alert_delivery(self, delivery_id: str) -> AlertDelivery:
        self._offers("/api/v1/alerts/deliveries", "alerts")
        return self.client.resend_alert_delivery(delivery_id)

    def start_replay(
        self, run_id: str, *, mode: str, version_id: str | None = None, model: str | None = None
    ) -> RunPublic:
        self._offers("/api/v1/runs/{run_id}/replays", "replays")
        return self.client.start_replay(run_id, mode=mode, version_id=version_id, model=model)

    def get_replay(self, run_id: str) -> ReplayReport:
        self._offers("/api/v1/replays/{run_id}", "replays")
        return self.client.get_replay(run_id)

    def start_eval(self, worker: str, start: EvalStart) -> EvalReport:
        self._offers("/api/v1/workers/{name}/evals", "evals")
        return self.client.start_eval(worker, start)

    def get_eval(self, eval_id: str) -> EvalReport:
        self._offers("/api/v1/evals/{eval_id}", "evals")
        return self.client.get_eval(eval_id)

    # -- triggers, approvals -------------------------------------------------------------------

    def list_triggers(self, name: str) -> TriggerListing:
        self._offers("/api/v1/workers/{name}/triggers", "triggers")
        return self.client.list_triggers(name)

    def set_paused(self, name: str, *, paused: bool, trigger: str | None = None) -> TriggerListing:
        self._offers("/api/v1/workers/{name}/pause", "pausing and resuming")
        return self.client.set_paused(name, paused=paused, trigger_id=trigger)

    def list_approvals(self, query: ApprovalQuery) -> Page[ApprovalPublic]:
        self._offers("/api/v1/approvals", "approvals")
        return self.client.list_approvals(query)

    def decide_approval(
        self,
        approval_id: str,
        *,
        approve: bool,
        edits: JSON | None = None,
        comment: str | None = None,
    ) -> ApprovalDecided:
        self._offers("/api/v1/approvals", "approvals")
        if approve:
            return self.client.approve(approval_id, edited=edits, comment=comment)
        return self.client.reject(approval_id, comment=comment or "")

    # -- secrets -------------------------------------------------------------------------------

    def list_secrets(self) -> Page[SecretPublic]:
        return self.client.list_secrets()

    def set_secret(self, name: str, value: str) -> SecretSet:
        return self.client.set_secret(name, value)

    def delete_secret(self, name: str) -> SecretDeleted:
        return self.client.delete_secret(name)

    # -- handoffs ------------------------------------------------------------------------------

    @property
    def handoffs(self) -> HandoffClient:
        self._offers("/api/v1/handoffs/jobs", "handoffs")
        if self._handoffs is None:
            self._handoffs = HandoffClient(self.client)
        return self._handoffs

    def handoff_my_roles(self) -> WhoAmI:
        return self.handoffs.whoami()

    def handoff_list_jobs(self, query: JobQuery) -> Page[JobPublic]:
        return self.handoffs.list_jobs(query)

    def handoff_get_job(self, job_id: str, *, events: bool = True) -> JobPublic:
        return self.handoffs.get_job(job_id, events=events)

    def handoff_create_job(self, job: JobRequest) -> JobPublic:
        return self.handoffs.create_job(job)

    def handoff_claim_job(self, job_id: str, *, lease_seconds: float | None = None) -> JobPublic:
        return self.handoffs.claim(job_id, lease_seconds=lease_seconds)

    def handoff_claim_next_job(
        self, *, role: str | None = None, lease_seconds: float | None = None
    ) -> ClaimNextResult:
        return self.handoffs.claim_next(role=role, lease_seconds=lease_seconds)

    def handoff_heartbeat(self, job_id: str, *, lease_seconds: float | None = None) -> LeaseState:
        return self.handoffs.heartbeat(job_id, lease_seconds=lease_seconds)

    def handoff_set_status(
        self,
        job_id: str,
        status: str,
        *,
        reason: str | None = None,
        lease_seconds: float | None = None,
    ) -> JobPublic:
        return self.handoffs.set_status(job_id, status, reason=reason, lease_seconds=lease_seconds)

    def handoff_update_job(
        self, job_id: str, *, context: JSON | None = None, constraints: list[str] | None = None
    ) -> JobPublic:
        return self.handoffs.update_job(job_id, context=context, constraints=constraints)

    def handoff_complete_job(
        self,
        job_id: str,
        *,
        summary: str = "",
        data: JSON | None = None,
        artifacts: list[JSON] | None = None,
    ) -> JobPublic:
        return self.handoffs.complete(job_id, summary=summary, data=data, artifacts=artifacts)

    def handoff_reject_job(
        self, job_id: str, *, reason: str, role: str | None = None, priority: str | None = None
    ) -> JobPublic:
        return self.handoffs.reject(job_id, reason=reason, role=role, priority=priority)

    def handoff_reopen_context(self, job_id: str) -> ReopenContext:
        return self.handoffs.reopen_context(job_id)
