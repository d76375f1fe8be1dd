"""One exception root for floom; every subclass carries an HTTP status and a stable code."""

from __future__ import annotations

from typing import Any


class FloomError(Exception):
    """Something went wrong in floom."""

    status = 500
    code = "internal"

    def __init__(
        self, message: str | None = None, *, hint: str | None = None, details: Any = None
    ) -> None:
        self.message = message or (self.__doc__ or "").strip()
        self.hint = hint
        self.details = details
        super().__init__(self.message)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "hint": self.hint}
        if self.details is not None:
            body["details"] = self.details
        return body


class InvalidRequest(FloomError):
    """The request is not valid."""

    status = 400
    code = "invalid_request"


class ManifestInvalid(InvalidRequest):
    """The worker's manifest has problems."""

    code = "manifest_invalid"


class BundleInvalid(InvalidRequest):
    """The worker archive is not acceptable."""

    code = "bundle_invalid"


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


class NotFound(FloomError):
    """The thing asked for does not exist."""

    status = 404
    code = "not_found"


class Conflict(FloomError):
    """The request conflicts with the current state."""

    status = 409
    code = "conflict"


class PayloadTooLarge(FloomError):
    """The request body is too large."""

    status = 413
    code = "payload_too_large"


class SecretMissing(FloomError):
    """A secret the worker declares is not set."""

    status = 409
    code = "secret_missing"


class LimitExceeded(FloomError):
    """A limit set in worker.yml or by the server has been reached."""

    status = 429
    code = "limit_exceeded"


class WorkerPaused(Conflict):
    """The worker is paused."""

    code = "worker_paused"
