"""The seam between the MCP tools and floom: what a tool may ask, whichever transport serves it.

Two implementations: `rest_backend.RestBackend` (the stdio server, a client of the REST API)
and `local_backend.LocalBackend` (the `/mcp` endpoint inside the server, calling services
with the caller's API key).
"""

from __future__ import annotations

import abc
from typing import Any

from floom.errors import FloomError
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
from floom.services.access.principal import Principal

JSON = dict[str, Any]


class NotAvailable(FloomError):
    """This floom server does not offer the feature yet."""

    status = 501
    code = "not_available"


class Backend(abc.ABC):
    """Every method is synchronous (tools run them on a worker thread) and returns plain JSON
    values in the shapes of the REST API's bodies, so both implementations look the same
    to a tool.

    Failures raise floom.errors.FloomError (a client rebuilds the server's subclass), each
    carrying a stable `code`, a message and a hint; the tools turn them into tool errors in
    one place. A method whose feature the server lacks raises NotAvailable. A refused scope
    raises an error with code "forbidden" that names the scope, and changes nothing.
    """

    #: Whether deploy/validate may read a folder path on the machine running this backend.
    reads_local_folders: bool = False

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release connections; the backend is not used afterwards."""

    @abc.abstractmethod
    def caller(self) -> Principal | None:
        """Who calls (its key's id, name, scopes and agent), so that tools/list shows only the
        tools its scope allows; None when that cannot be known, and then every tool is listed
        (the server still refuses what the scope does not allow)."""

    # -- workers and versions ------------------------------------------------------------------

    @abc.abstractmethod
    def list_workers(self, *, cursor: str | None = None, limit: int = 50) -> Page[WorkerPublic]:
        """{"items": [worker with manifest], "next_cursor"}, by name."""

    @abc.abstractmethod
    def get_worker(self, name: str) -> WorkerDetail:
        """The worker, its active manifest and "recent_runs"."""

    @abc.abstractmethod
    def get_manifest_yaml(self, name: str) -> str:
        """The worker.yml text of the worker's active version."""

    @abc.abstractmethod
    def validate(self, archive: bytes) -> ValidationResult:
        """{"valid", "problems", "manifest"} for a tar.gz of a worker folder; stores nothing."""

    @abc.abstractmethod
    def deploy(self, archive: bytes, *, skip_eval_gate: bool = False) -> DeployResult:
        """{"worker", "version", "created", "activated"}; unchanged content makes no version.
        A failed eval gate raises code "eval_gate_failed" unless `skip_eval_gate`."""

    @abc.abstractmethod
    def list_versions(self, name: str) -> Page[VersionPublic]:
        """{"items": [version], ...}, newest first, each with "active"."""

    @abc.abstractmethod
    def rollback(
        self,
        name: str,
        *,
        version_id: str | None,
        run_id: str | None,
        state_version: int | None = None,
    ) -> RollbackResult:
        """{"worker", "version"} after making the given version (or a run's version) active;
        with `state_version`, that kept state version is set again in the same transaction
        (both or neither; NotFound when it is no longer kept)."""

    @abc.abstractmethod
    def get_state(self, name: str, *, version: int | None = None) -> WorkerStatePublic:
        """The worker's state as REST answers it (current, or a kept `version`)."""

    @abc.abstractmethod
    def set_state(
        self,
        name: str,
        *,
        state: Any = None,
        from_version: int | None = None,
        if_version: int | None = None,
    ) -> WorkerStatePublic:
        """Write a new state version (deploy scope): `state`, or a kept version's value
        again; the state as written."""

    @abc.abstractmethod
    def state_versions(self, name: str, *, limit: int = 20) -> Page[StateVersionPublic]:
        """{"items": [state version], "next_cursor"}, newest first."""

    @abc.abstractmethod
    def delete_worker(self, name: str, *, purge_runs: bool) -> WorkerDeleted:
        """Delete a worker (deploy scope); what was deleted, as counts, as REST answers it."""

    # -- runs ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def start_run(self, worker: str, run: RunRequest, *, wait_seconds: float = 0) -> RunPublic:
        """Queue a run of the active version (or `run.version_id`); bad inputs raise code
        "input_invalid", a paused worker "worker_paused" unless `run.force`. With
        `wait_seconds` a backend may answer once the run has settled, in the same request
        (the caller checks the status: a backend may also answer at once).
        `run.callback_url` gets the run's record when it ends."""

    @abc.abstractmethod
    def list_runs(self, query: RunQuery) -> Page[RunPublic]:
        """{"items": [run], "next_cursor"}, newest first."""

    @abc.abstractmethod
    def get_run(self, run_id: str) -> RunDetail:
        """The run with its artifacts (and tool calls and approvals where the server has them)."""

    @abc.abstractmethod
    async def wait_for_run(self, run_id: str, *, seconds: float) -> RunDetail:
        """The run (as get_run) once it has settled (ended, or waiting for a person), or as it
        is after `seconds`. The one method a tool awaits on the event loop instead of a
        worker thread: a wait holds no thread in the server. A key over its cap of
        concurrent waits raises code "too_many_waits"."""

    @abc.abstractmethod
    def get_logs(
        self, run_id: str, *, after: int = 0, tail: int | None = None, limit: int = 1000
    ) -> LogPage:
        """{"items": [event], "last_seq", "run_status", "complete"}: events above `after`, or
        the last `tail` events."""

    @abc.abstractmethod
    def list_artifacts(self, run_id: str) -> Page[ArtifactPublic]:
        """{"items": [{"name", "size", "digest", "content_type", "url"}]}: the files a run left
        under its output directory, by name; "url" is the download path on the server."""

    @abc.abstractmethod
    def read_artifact(self, run_id: str, name: str) -> bytes:
        """An artifact's stored bytes: text as floom stored it (secrets redacted when the run
        ended), binary files as the worker wrote them."""

    @abc.abstractmethod
    def link(self, path: str) -> str:
        """The absolute URL of `path` on the floom server, for a client to fetch with its own
        API key (as a bearer token)."""

    @abc.abstractmethod
    def cancel_run(self, run_id: str) -> RunDetail:
        """The run after asking it to stop."""

    @abc.abstractmethod
    def replay_run(self, run_id: str, *, latest: bool = False, force: bool = False) -> RunPublic:
        """A new run with the same inputs, on the same version unless `latest`."""

    # -- replays from recordings and evals -----------------------------------------------------

    @abc.abstractmethod
    def start_replay(
        self, run_id: str, *, mode: str, version_id: str | None = None, model: str | None = None
    ) -> RunPublic:
        """A replay of an agent run from its recording (run scope): the new run."""

    @abc.abstractmethod
    def get_replay(self, run_id: str) -> ReplayReport:
        """A replay's report: status, diff against the original, divergence (exact)."""

    @abc.abstractmethod
    def start_eval(self, worker: str, start: EvalStart) -> EvalReport:
        """Start an eval (run scope): its report so far."""

    @abc.abstractmethod
    def get_eval(self, eval_id: str) -> EvalReport:
        """An eval's report: per run and totals."""

    # -- alerts --------------------------------------------------------------------------------
    # Not abstract: a backend without them answers NotAvailable, like an older server.

    def alert_channels(self) -> ChannelList:
        """{"items": [channel]}: settings name secrets, never their values (read scope)."""
        raise NotAvailable("alerts are not available here")

    def add_alert_channel(self, name: str, kind: str, config: JSON) -> ChannelPublic:
        """A new channel, its settings checked (deploy scope); code alert_channel_invalid."""
        raise NotAvailable("alerts are not available here")

    def update_alert_channel(self, name: str, change: ChannelChange) -> ChannelPublic:
        """Merge `change` over a channel's settings (a null removes one), checked as when
        added (deploy scope)."""
        raise NotAvailable("alerts are not available here")

    def test_alert_channel(self, name: str) -> AlertDelivery:
        """Send a test alert now: the delivery, or code alert_undeliverable saying why."""
        raise NotAvailable("alerts are not available here")

    def alert_rules(self) -> RuleList:
        """{"items": [rule]}: the global rules (read scope)."""
        raise NotAvailable("alerts are not available here")

    def add_alert_rule(self, rule: RuleCreate) -> RulePublic:
        """A new global rule (deploy scope); code alert_rule_invalid names the field."""
        raise NotAvailable("alerts are not available here")

    def set_alert_rule_enabled(self, name: str, enabled: bool) -> RulePublic:
        """The rule, turned on or off (deploy scope); NotFound if there is no such rule."""
        raise NotAvailable("alerts are not available here")

    def alert_deliveries(self, query: DeliveryQuery) -> Page[AlertDelivery]:
        """{"items": [delivery], "next_cursor"}, newest first (read scope)."""
        raise NotAvailable("alerts are not available here")

    def resend_alert_delivery(self, delivery_id: str) -> AlertDelivery:
        """Queue a delivery to be sent again (deploy scope)."""
        raise NotAvailable("alerts are not available here")

    # -- triggers, approvals -------------------------------------------------------------------

    @abc.abstractmethod
    def list_triggers(self, name: str) -> TriggerListing:
        """{"worker", "paused", "items": [trigger with its next fires]}."""

    @abc.abstractmethod
    def set_paused(self, name: str, *, paused: bool, trigger: str | None = None) -> TriggerListing:
        """Pause or resume a worker (or one trigger, by id); returns the trigger listing."""

    @abc.abstractmethod
    def list_approvals(self, query: ApprovalQuery) -> Page[ApprovalPublic]:
        """{"items": [approval], "next_cursor"}: oldest first, a page at a time."""

    @abc.abstractmethod
    def decide_approval(
        self,
        approval_id: str,
        *,
        approve: bool,
        edits: JSON | None = None,
        comment: str | None = None,
    ) -> ApprovalDecided:
        """The approval after the decision."""

    # -- secrets -------------------------------------------------------------------------------

    @abc.abstractmethod
    def list_secrets(self) -> Page[SecretPublic]:
        """{"items": [{"name", "created_at", "updated_at"}]}: names only, never values."""

    @abc.abstractmethod
    def set_secret(self, name: str, value: str) -> SecretSet:
        """{"name", "set": true}; the value is never returned."""

    @abc.abstractmethod
    def delete_secret(self, name: str) -> SecretDeleted:
        """{"name", "deleted": true}."""

    # -- handoffs (jobs between agents, by role) -------------------------------------------------
    # The caller acts as its key's agent, whose roles are read on every call. A job the caller
    # may not see raises code "not_found"; a move the transition table refuses raises
    # "illegal_transition" (or "forbidden") with the allowed moves in the details.

    @abc.abstractmethod
    def handoff_my_roles(self) -> WhoAmI:
        """{"agent": {"id", "label"} or None, "admin", "roles": [name]}, as they are now."""

    @abc.abstractmethod
    def handoff_list_jobs(self, query: JobQuery) -> Page[JobPublic]:
        """{"items": [job], "next_cursor"}: the jobs the caller may see, newest first."""

    @abc.abstractmethod
    def handoff_get_job(self, job_id: str, *, events: bool = True) -> JobPublic:
        """One job; with `events`, its audit trail (oldest first) in "events"."""

    @abc.abstractmethod
    def handoff_create_job(self, job: JobRequest) -> JobPublic:
        """The published (or pending) job; a repeated idempotency key returns the first job
        with "replayed": true and creates nothing."""

    @abc.abstractmethod
    def handoff_claim_job(self, job_id: str, *, lease_seconds: float | None = None) -> JobPublic:
        """The job, now held by the caller until its lease runs out."""

    @abc.abstractmethod
    def handoff_claim_next_job(
        self, *, role: str | None = None, lease_seconds: float | None = None
    ) -> ClaimNextResult:
        """{"job": the claimed job, or None when no published job of the caller's roles waits}."""

    @abc.abstractmethod
    def handoff_heartbeat(self, job_id: str, *, lease_seconds: float | None = None) -> LeaseState:
        """{"id", "status", "lease_expires_at"} after extending the caller's lease."""

    @abc.abstractmethod
    def handoff_set_status(
        self,
        job_id: str,
        status: str,
        *,
        reason: str | None = None,
        lease_seconds: float | None = None,
    ) -> JobPublic:
        """The job after the move (block, unblock, release, fail, cancel, claim, complete)."""

    @abc.abstractmethod
    def handoff_update_job(
        self, job_id: str, *, context: JSON | None = None, constraints: list[str] | None = None
    ) -> JobPublic:
        """The job with its context and/or constraints replaced."""

    @abc.abstractmethod
    def handoff_complete_job(
        self,
        job_id: str,
        *,
        summary: str = "",
        data: JSON | None = None,
        artifacts: list[JSON] | None = None,
    ) -> JobPublic:
        """The completed job (follow-ons and dependents are published in the same step)."""

    @abc.abstractmethod
    def handoff_reject_job(
        self, job_id: str, *, reason: str, role: str | None = None, priority: str | None = None
    ) -> JobPublic:
        """The retry job, linked to the rejected one by "retry_of"."""

    @abc.abstractmethod
    def handoff_reopen_context(self, job_id: str) -> ReopenContext:
        """The focused context of a retry: summary, constraints, rejections, attempt."""
