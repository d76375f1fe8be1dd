"""floom's closed sets of words: the statuses, triggers and kinds that the tables store, the
run state machine moves between, and every surface (REST, MCP, the CLI, the UI) shows.

Each is a StrEnum, so a member is the very string stored and sent (`RunStatus.QUEUED ==
"queued"`, `json.dumps` writes "queued"): the database schema and the JSON shapes are
those of plain strings, and the type checker sees a misspelt word. A leaf: this module
imports nothing from floom, so the client and the CLI's quick path read it for free. The
run error codes are in the error catalogue (floom.errors.RunErrorCode).
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run is in its life (the moves between them: floom/services/runs/rules.py)."""

    QUEUED = "queued"
    RUNNING = "running"
    # Waiting for a person (floom/services/runs/approvals.py); holds no executor slot.
    AWAITING_APPROVAL = "awaiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    LIMIT_EXCEEDED = "limit_exceeded"
    # A trigger's tick or event that did not become a run (overlap, missed, paused, bad
    # input); its error code says why. Born finished: it never runs.
    SKIPPED = "skipped"


class RunTrigger(StrEnum):
    """How a run was started, as the run records it (`trigger`)."""

    MANUAL = "manual"  # the CLI or the web UI
    SCHEDULE = "schedule"
    WEBHOOK = "webhook"
    COMPOSIO = "composio"
    REPLAY = "replay"
    API = "api"  # REST, by any other client
    MCP = "mcp"
    HANDOFF = "handoff"  # a handoff job bridged to a run
    AGENT = "agent"  # an agent run's child run


class TriggerKind(StrEnum):
    """The kinds of trigger a worker.yml declares (`triggers:`), as the triggers table keeps
    them."""

    SCHEDULE = "schedule"
    WEBHOOK = "webhook"
    COMPOSIO = "composio"
    HANDOFF = "handoff"


class ApprovalKind(StrEnum):
    """What a person is asked to decide: one gated tool call, or a run's outputs."""

    TOOL_CALL = "tool_call"
    RUN = "run"


class ApprovalStatus(StrEnum):
    """Where an approval stands."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    # Withdrawn: its run was cancelled before anyone decided.
    CANCELLED = "cancelled"


class ToolCallStatus(StrEnum):
    """How one tool call of an agent run ended (or that it waits for a person)."""

    OK = "ok"
    ERROR = "error"
    # Not run: bad input, an unknown tool, or a replay that cannot answer it.
    REFUSED = "refused"
    # A person rejected it.
    REJECTED = "rejected"
    AWAITING_APPROVAL = "awaiting_approval"
    # Its run was cancelled while it waited for a person.
    CANCELLED = "cancelled"


class JobStatus(StrEnum):
    """Where a handoff job stands (the moves between them: floom/services/handoffs/rules.py)."""

    PENDING = "pending"  # waiting for the jobs it depends on
    PUBLISHED = "published"
    IN_PROGRESS = "in_progress"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobPriority(StrEnum):
    """A handoff job's priority, lowest first: claims take the highest first."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    URGENT = "urgent"


class Scope(StrEnum):
    """What an API key may do, each including the ones before it."""

    READ = "read"
    RUN = "run"
    DEPLOY = "deploy"
    ADMIN = "admin"


class StateSource(StrEnum):
    """Who wrote a version of a worker's state."""

    RUN = "run"  # a run's success
    OPERATOR = "operator"  # set by a key
    RESTORE = "restore"  # an earlier version set again


class ReplayMode(StrEnum):
    """How an agent run is replayed from its recording."""

    # On the run's own version: neither the model nor any tool is called.
    EXACT = "exact"
    # On a version (and model) of choice, the recording answering the tool calls.
    WHAT_IF = "what_if"


class Decision(StrEnum):
    """What a person decides on an approval."""

    APPROVE = "approve"
    REJECT = "reject"


class ChannelKind(StrEnum):
    """Where an alert channel sends: an outbound webhook, a Slack-compatible incoming webhook,
    or email."""

    WEBHOOK = "webhook"
    SLACK = "slack"
    EMAIL = "email"


class DeliveryPurpose(StrEnum):
    """What a delivery carries: an alert, a channel's test, or a run's callback."""

    ALERT = "alert"
    TEST = "test"
    CALLBACK = "callback"


class DeliveryStatus(StrEnum):
    """Where a delivery stands: retried while pending, then delivered or failed; an alert
    over its channel's rate is throttled (kept, not sent)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    THROTTLED = "throttled"


class PreviousAttempt(StrEnum):
    """How the attempt before a run's current one ended, as the run keeps it and the next
    attempt's script reads it in $FLOOM_PREVIOUS_ATTEMPT."""

    INTERRUPTED = "interrupted"  # its node shut down while it ran
    LOST = "lost"  # its node died or stopped renewing its lease
    FAILED = "failed"  # it failed and is retried


class NodeState(StrEnum):
    """A node as the nodes table shows it: live (renewing its lease), lost (silent past its
    lease), or stopped (it said so)."""

    LIVE = "live"
    LOST = "lost"
    STOPPED = "stopped"
