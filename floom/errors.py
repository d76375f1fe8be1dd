"""One exception root for floom; every subclass carries an HTTP status and a stable code.

Every class that sets its own `code` is registered, so a client can rebuild the same class
from a response (`error_class(code)`) and the catalogue (`catalogue()`) lists every code a
caller can meet, for the docs (docs/reference/error-codes.md) and the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, ClassVar

from floom.hints import Hint, Told
from floom.hints import cli as cli_hints

_BY_CODE: dict[str, type[FloomError]] = {}


class FloomError(Exception):
    """Something went wrong in floom."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"
    #: Written for the person at this very machine (the stdio MCP server's own setup names the
    #: commands they run at their shell): told as the CLI writes it, whatever the surface.
    as_written: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            # Two classes with one code would make a client rebuild the wrong one.
            known = _BY_CODE.get(cls.code)
            if known is not None and _name(known) != _name(cls):
                raise TypeError(f"error code {cls.code!r} is taken by {_name(known)}")
            _BY_CODE[cls.code] = cls

    def __init__(
        self, message: Told | None = None, *, hint: Told | None = None, details: Any = None
    ) -> None:
        # Text and actions (floom.hints), which each surface renders its own way; `message`
        # and `hint` are the CLI's rendering, the words as floom stores them.
        self.said = Hint.of(message or (self.__doc__ or "").strip())
        self.advice = Hint.of(hint) if hint else None
        self.message = cli_hints.render(self.said) or ""
        self.hint = cli_hints.render(self.advice)
        self.details = details
        super().__init__(self.message)

    @property
    def details(self) -> Any:
        """What the error is about, in detail; a hint in them (a problem's) as the CLI says it."""
        return self.details_for(cli_hints.written)

    @details.setter
    def details(self, details: Any) -> None:
        self._details = details

    def details_for(self, tell: Callable[[Told], str | None]) -> Any:
        """`details`, with each hint in them (text and actions) told by `tell`: a surface's
        rendering (floom.hints.surface)."""
        return _told_in(self._details, tell)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "hint": self.hint}
        if self.details is not None:
            body["details"] = self.details
        return body


def _told_in(details: Any, tell: Callable[[Told], str | None]) -> Any:
    if isinstance(details, Hint):
        return tell(details)
    if isinstance(details, list):
        return [_told_in(item, tell) for item in details]
    if isinstance(details, dict):
        return {key: _told_in(value, tell) for key, value in details.items()}
    return details


# The most of a name or an id a caller sent that an error quotes back.
QUOTED_MOST = 80


def quoted(ref: str) -> str:
    """A name or id a caller sent, as an error quotes it: at most QUOTED_MOST characters (an
    id of a megabyte named nothing, and is not answered back whole)."""
    return ref if len(ref) <= QUOTED_MOST else ref[:QUOTED_MOST] + "..."


class InvalidRequest(FloomError):
    """The request is not valid."""

    status = 400
    code = "invalid_request"


class ManifestInvalid(InvalidRequest):
    """The worker's manifest has problems."""

    code = "manifest_invalid"


class ManifestTooLarge(ManifestInvalid):
    """worker.yml is over a parser limit (bytes, nesting depth or number of nodes).

    Refused before the document is built; `details` names the limit and its maximum."""

    status = 422
    code = "manifest_too_large"


class ManifestAliasesRefused(ManifestInvalid):
    """worker.yml uses a YAML anchor or alias, which floom refuses.

    Aliases can expand a small document without bound; write the repeated part out."""

    status = 422
    code = "manifest_aliases_refused"


class BundleInvalid(InvalidRequest):
    """The worker archive is not acceptable."""

    code = "bundle_invalid"


class BundleTooLarge(BundleInvalid):
    """The worker archive has more entries (files and directories) than floom accepts."""

    status = 422
    code = "bundle_too_large"


class BundlePathInvalid(BundleInvalid):
    """An archive entry's name is too long or clashes with another entry's name."""

    status = 422
    code = "bundle_path_invalid"


class InputInvalid(InvalidRequest):
    """The run's inputs do not match the worker's declared inputs."""

    status = 422
    code = "input_invalid"


class Unauthorized(FloomError):
    """A valid API key is required."""

    status = 401
    code = "unauthorized"


class Forbidden(FloomError):
    """The API key lacks the scope this action needs."""

    status = 403
    code = "forbidden"


class NotExposed(FloomError):
    """The worker cannot be started from this surface: its worker.yml `expose` leaves it out.

    `details` name the surface ("surface") and the ones the worker allows ("allowed")."""

    status = 403
    code = "not_exposed"


class NotFound(FloomError):
    """The thing asked for does not exist."""

    status = 404
    code = "not_found"


class Conflict(FloomError):
    """The request conflicts with the current state."""

    status = 409
    code = "conflict"


class IllegalTransition(Conflict):
    """The thing cannot move to that status from the one it is in (a run or a handoff job)."""

    code = "illegal_transition"


class BodyTooSlow(FloomError):
    """The request (its headers or its body) did not arrive in time; send it at once."""

    status = 408
    code = "request_timeout"


class PayloadTooLarge(FloomError):
    """The request body is too large."""

    status = 413
    code = "payload_too_large"


class HeadersTooLarge(FloomError):
    """The request line and headers are too large or too many; send fewer or shorter ones."""

    status = 431
    code = "headers_too_large"


class ServerBusy(FloomError):
    """This node holds as many connections as it may, every one serving a request; retry
    shortly."""

    status = 503
    code = "server_busy"


class InputsTooLarge(PayloadTooLarge):
    """A run's inputs are larger than FLOOM_MAX_INPUT_BYTES."""

    code = "inputs_too_large"


class SecretNameRefused(InvalidRequest):
    """A secret's name would change how programs load or run (LD_*, PYTHON*, PATH, FLOOM_*...)."""

    code = "secret_name_refused"


class LimitExceeded(FloomError):
    """A limit set in worker.yml or by the server has been reached."""

    status = 429
    code = "limit_exceeded"


class WorkerPaused(Conflict):
    """The worker is paused."""

    code = "worker_paused"


class StateConflict(Conflict):
    """The worker's state changed since it was read; nothing was written.

    A run ends with this code when another run (or an operator) wrote the worker's state
    after this run read it; an operator's set with `if_version` gets it as a 409."""

    code = "state_conflict"


class StateInvalid(InvalidRequest):
    """A worker's state is not a JSON value floom keeps (over a JSON bound, or not JSON)."""

    status = 422
    code = "state_invalid"


class StateTooLarge(PayloadTooLarge):
    """A worker's state is larger than its limit (state.max_bytes or FLOOM_MAX_STATE_BYTES)."""

    code = "state_too_large"


class StoreUnavailable(FloomError):
    """floom's database cannot be reached right now."""

    status = 503
    code = "store_unavailable"


class RowLocked(StoreUnavailable):
    """Another floom node holds a row this needs, past the lock timeout; try again shortly.

    `details` carry `retry_after_seconds` (the API answers it as Retry-After)."""

    code = "row_locked"


class BlobStoreUnavailable(FloomError):
    """The object store holding floom's blobs cannot be reached right now; try again shortly.

    `details` carry `retry_after_seconds` (the API answers it as Retry-After)."""

    status = 503
    code = "blob_store_unavailable"


class BlobUnreadable(FloomError):
    """A stored archive, artifact, workspace or run log is missing or fails its checksum.

    The message names the run or version and the object."""

    status = 502
    code = "blob_unreadable"


class NodeDraining(FloomError):
    """This floom node is shutting down and lets its running runs end; retry later or on
    another node."""

    status = 503
    code = "node_draining"


class StoreNewerThanNode(FloomError):
    """The database was migrated by a newer floom than this node; upgrade the node."""

    status = 503
    code = "store_newer_than_node"


class DataDirInUse(FloomError):
    """Another floom node process runs its sandboxes from this data dir."""

    status = 409
    code = "data_dir_in_use"


class RateLimited(FloomError):
    """Too many requests with this API key; wait and try again."""

    status = 429
    code = "rate_limited"


class TooManyWaits(RateLimited):
    """This API key already waits for as many runs at once as the server allows."""

    code = "too_many_waits"


class TooManyStreams(RateLimited):
    """This API key already holds as many open streams as the server allows."""

    code = "too_many_streams"


class ProviderError(FloomError):
    """The model provider could not answer; `retryable` says whether trying again may help."""

    status = 502
    code = "model_error"

    def __init__(
        self,
        message: Told | None = None,
        *,
        retryable: bool = False,
        hint: Told | None = None,
        details: Any = None,
    ) -> None:
        super().__init__(message, hint=hint, details=details)
        self.retryable = retryable


class ProviderAuthFailed(ProviderError):
    """The model provider refused floom's key."""

    code = "provider_auth"


class ProviderKeyMissing(ProviderError):
    """No model provider key is set on the floom server that runs agents."""

    status = 503
    code = "provider_key_missing"


class ToolError(FloomError):
    """An agent's tool call failed in a way the model should read and may recover from."""

    status = 422
    code = "tool_error"


class ReplayDiverged(ProviderError):
    """An exact replay left its recording: floom handled the recorded run differently."""

    code = "replay_diverged"


class RecordingEnded(ProviderError):
    """An exact replay reached the end of its recording; the original run ended there."""

    code = "recording_ended"


class NotReplayable(Conflict):
    """The run cannot be replayed from its recording (not a finished agent run)."""

    code = "not_replayable"


class EvalGateFailed(Conflict):
    """The eval the worker's gate requires did not pass; the new version is not active."""

    code = "eval_gate_failed"


class SourceUnavailable(FloomError):
    """A tool source an agent declares (an MCP server, Composio) cannot be reached."""

    status = 503
    code = "tool_source_unavailable"


class SecretUndecryptable(FloomError):
    """A stored secret cannot be decrypted with this node's secret key."""

    status = 500
    code = "secret_key_mismatch"


class RuntimeMissing(FloomError):
    """A program a worker's entry needs is not installed on this node."""

    status = 503
    code = "runtime_missing"


class BackupInvalid(InvalidRequest):
    """A backup directory is not a floom backup, or its files do not match its checksums."""

    code = "backup_invalid"


class RestoreNotWritten(FloomError):
    """A restore could not write a backup's file into the data dir (a full disk, a quota).

    The message names the file and why; nothing was restored."""

    status = 507
    code = "restore_not_written"


class ClientError(FloomError):
    """A request from a floom client failed with a code this client does not know.

    Also what a client raises when no response came at all (status 0, `unreachable`).
    """

    def __init__(
        self,
        message: Told | None = None,
        *,
        status: int = 500,
        code: str = "internal",
        hint: Told | None = None,
        details: Any = None,
    ) -> None:
        super().__init__(message, hint=hint, details=details)
        self.status = status  # type: ignore[misc]
        self.code = code  # type: ignore[misc]


def error_class(code: str) -> type[FloomError] | None:
    """The registered FloomError subclass of a stable code, or None when unknown."""
    return _BY_CODE.get(code)


def rebuild(
    *, status: int, code: str, message: str, hint: str | None = None, details: Any = None
) -> FloomError:
    """The error a server answered, as the same FloomError subclass the server raised."""
    cls = _BY_CODE.get(code)
    if cls is None or cls.status != status or not _plain_init(cls):
        return ClientError(message, status=status, code=code, hint=hint, details=details)
    return cls(message, hint=hint, details=details)


def catalogue() -> list[dict[str, Any]]:
    """Every stable error code with its HTTP status and meaning, sorted by code."""
    return [
        {"code": code, "status": cls.status, "meaning": (cls.__doc__ or "").strip().split("\n")[0]}
        for code, cls in sorted(_BY_CODE.items())
    ]


class RunErrorCode(StrEnum):
    """Why a run did not succeed, as it records it in `error_code` (a queued run's says how
    its previous attempt ended; a skipped run's why its tick or event did not become a run).
    Where a refusal of the same name exists, the code is that refusal's (a test checks)."""

    # The script or agent, judged at the attempt's end (floom/engine/attempt.py).
    TIMED_OUT = "timed_out"
    LIMIT_EXCEEDED = "limit_exceeded"
    CANCELLED = "cancelled"
    EXIT_CODE = "exit_code"
    WORKER_ERROR = "worker_error"
    RESULT_INVALID = "result_invalid"
    OUTPUTS_INVALID = "outputs_invalid"
    STATE_INVALID = "state_invalid"
    STATE_TOO_LARGE = "state_too_large"
    STATE_CONFLICT = "state_conflict"
    SECRET_MISSING = "secret_missing"
    SECRET_NAME_REFUSED = "secret_name_refused"
    # floom, the node or the sandbox.
    SANDBOX_ERROR = "sandbox_error"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    EXECUTOR_ERROR = "executor_error"
    EXECUTOR_LOST = "executor_lost"
    INTERRUPTED = "interrupted"
    # Agent runs (floom/agent/).
    AGENT_ERROR = "agent_error"
    MODEL_ERROR = "model_error"
    PROVIDER_AUTH = "provider_auth"
    PROVIDER_KEY_MISSING = "provider_key_missing"
    COMPOSIO_KEY_MISSING = "composio_key_missing"
    TOOL_SOURCE_UNAVAILABLE = "tool_source_unavailable"
    REPLAY_DIVERGED = "replay_diverged"
    RECORDING_ENDED = "recording_ended"
    # A person's decision (floom/services/runs/approvals.py).
    REJECTED = "rejected"
    # Skipped runs: a trigger's tick or event that did not start one (floom/services/triggers/).
    OVERLAP_SKIP = "overlap_skip"
    MISSED = "missed"
    PAUSED = "paused"
    INPUT_INVALID = "input_invalid"
    START_FAILED = "start_failed"


_RUN_ERROR_MEANINGS: dict[RunErrorCode, str] = {
    RunErrorCode.TIMED_OUT: "The run ran longer than limits.timeout_seconds.",
    RunErrorCode.LIMIT_EXCEEDED: "The run reached a limit (memory, processes, disk, tokens, "
    "model turns or monthly cost); not retried.",
    RunErrorCode.CANCELLED: "The run was cancelled.",
    RunErrorCode.EXIT_CODE: "The script exited with a non-zero code.",
    RunErrorCode.WORKER_ERROR: "The script reported an error in result.json.",
    RunErrorCode.RESULT_INVALID: "The script's result.json could not be read (not JSON, "
    "too large, not an object).",
    RunErrorCode.OUTPUTS_INVALID: "The outputs do not match the worker's declared outputs.",
    RunErrorCode.STATE_INVALID: "The state the run left is not a JSON value floom keeps.",
    RunErrorCode.STATE_TOO_LARGE: "The state the run left is larger than its limit.",
    RunErrorCode.STATE_CONFLICT: "The worker's state changed after the run read it; its "
    "new state was not written.",
    RunErrorCode.SECRET_MISSING: "A secret the worker declares is not set.",
    RunErrorCode.SECRET_NAME_REFUSED: "A secret the worker declares has a name floom refuses "
    "to put in a run's environment.",
    RunErrorCode.SANDBOX_ERROR: "The sandbox failed while the run's process ran.",
    RunErrorCode.SANDBOX_UNAVAILABLE: "The sandbox backend could not start the run's process.",
    RunErrorCode.EXECUTOR_ERROR: "floom failed running the attempt (a bug; see the node's log).",
    RunErrorCode.EXECUTOR_LOST: "The node running the attempt stopped renewing its lease.",
    RunErrorCode.INTERRUPTED: "The node running the attempt shut down; the run was queued again.",
    RunErrorCode.AGENT_ERROR: "The agent kept ending its turn without calling finish.",
    RunErrorCode.MODEL_ERROR: "The model provider could not answer.",
    RunErrorCode.PROVIDER_AUTH: "The model provider refused floom's key.",
    RunErrorCode.PROVIDER_KEY_MISSING: "No model provider key is set on the node.",
    RunErrorCode.COMPOSIO_KEY_MISSING: "The worker uses Composio tools and no Composio key "
    "is set on the node.",
    RunErrorCode.TOOL_SOURCE_UNAVAILABLE: "A tool source the agent declares (an MCP server, "
    "Composio) could not be reached.",
    RunErrorCode.REPLAY_DIVERGED: "An exact replay left its recording.",
    RunErrorCode.RECORDING_ENDED: "An exact replay reached the end of its recording.",
    RunErrorCode.REJECTED: "A person rejected the run's outputs.",
    RunErrorCode.OVERLAP_SKIP: "Skipped: a schedule's tick came while its previous run was "
    "still active.",
    RunErrorCode.MISSED: "Skipped: a schedule's tick passed while no scheduler ran.",
    RunErrorCode.PAUSED: "Skipped: the worker or its trigger was paused.",
    RunErrorCode.INPUT_INVALID: "Skipped: the event did not give valid inputs.",
    RunErrorCode.START_FAILED: "Skipped: the tick or event could not start a run.",
}


def run_error_code(error: FloomError) -> RunErrorCode:
    """The code a run records when `error` ends it: the error's own code, which is one of
    RunErrorCode for every error an attempt ends with (a test holds the classes to it)."""
    return RunErrorCode(error.code)


def run_error_catalogue() -> list[dict[str, str]]:
    """Every code a run can record in `error_code`, with its meaning, in the enum's order."""
    return [{"code": code.value, "meaning": _RUN_ERROR_MEANINGS[code]} for code in RunErrorCode]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain_init(cls: type[FloomError]) -> bool:
    return cls.__init__ is FloomError.__init__ or issubclass(cls, ProviderError)
