"""The public and request models the REST client answers with and sends (floom/schemas), in
one namespace: floom.client.rest imports it at its first use, as `models` (which
floom.client.handoffs uses too), so that importing the client costs no pydantic (about 0.1 s)
to a command that never reads an answer."""

from __future__ import annotations

from floom.schemas.admin import KeyCreated, KeyPublic, SecretDeleted, SecretPublic, SecretSet
from floom.schemas.alerts import AlertDeliveryPublic as AlertDelivery
from floom.schemas.alerts import (
    CallbackKey,
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
    AgentCreated,
    AgentPublic,
    ClaimNextResult,
    JobPublic,
    JobQuery,
    JobRequest,
    LeaseState,
    ReopenContext,
    RolePublic,
    WhoAmI,
)
from floom.schemas.health import Health
from floom.schemas.nodes import NodeList
from floom.schemas.replays import EvalReport, EvalStart, ReplayReport
from floom.schemas.runs import (
    ApprovalDecided,
    ApprovalPublic,
    ApprovalQuery,
    ArtifactPublic,
    LogPage,
    RunDetail,
    RunEventPublic,
    RunPublic,
    RunQuery,
    RunRequest,
)
from floom.schemas.triggers import DeliveryDetail, DeliveryPublic, TriggerListing
from floom.schemas.workers import (
    DeployResult,
    RollbackResult,
    StateVersionPublic,
    ValidationResult,
    VersionDetail,
    VersionPublic,
    WorkerDeleted,
    WorkerDetail,
    WorkerPublic,
    WorkerStatePublic,
)

__all__ = [
    "AgentCreated",
    "AgentPublic",
    "AlertDelivery",
    "ApprovalDecided",
    "ApprovalPublic",
    "ApprovalQuery",
    "ArtifactPublic",
    "CallbackKey",
    "ChannelChange",
    "ChannelList",
    "ChannelPublic",
    "ClaimNextResult",
    "DeliveryDetail",
    "DeliveryPublic",
    "DeliveryQuery",
    "DeployResult",
    "EvalReport",
    "EvalStart",
    "Health",
    "JobPublic",
    "JobQuery",
    "JobRequest",
    "KeyCreated",
    "KeyPublic",
    "LeaseState",
    "LogPage",
    "NodeList",
    "Page",
    "ReopenContext",
    "ReplayReport",
    "RolePublic",
    "RollbackResult",
    "RuleCreate",
    "RuleList",
    "RulePublic",
    "RunDetail",
    "RunEventPublic",
    "RunPublic",
    "RunQuery",
    "RunRequest",
    "SecretDeleted",
    "SecretPublic",
    "SecretSet",
    "StateVersionPublic",
    "TriggerListing",
    "ValidationResult",
    "VersionDetail",
    "VersionPublic",
    "WhoAmI",
    "WorkerDeleted",
    "WorkerDetail",
    "WorkerPublic",
    "WorkerStatePublic",
]
