"""Webhook signature checks: Standard Webhooks, GitHub, and floom's own HMAC-SHA256 scheme.

Every check compares in constant time and, where the scheme signs a timestamp, refuses one
more than five minutes away from now. Each returns the delivery's id (the sender's, or a
digest of the signature when the sender gives none) and, for schemes whose delivery id is
not signed, a digest of the signature: a captured request sent again under a new id still
repeats its signature, so it is recognised as a duplicate.

floom's `hmac-sha256` scheme, for senders that can compute an HMAC but not a whole standard:

    X-Floom-Timestamp: <unix seconds>
    X-Floom-Signature: sha256=<hex of HMAC-SHA256(secret, "<timestamp>.<raw body>")>
    X-Floom-Delivery: <optional id; repeats of it are acknowledged and not run again>
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook

from floom.errors import FloomError

TOLERANCE_SECONDS = 300
# The fewest bytes a Standard Webhooks secret may decode to. The library decodes the secret
# leniently (characters outside base64 are dropped), so "xy!!!!!!" is a 1-byte key anyone
# could find by trying 256, and "!!!!" none at all.
MIN_STANDARD_KEY_BYTES = 16
FLOOM_TIMESTAMP = "x-floom-timestamp"
FLOOM_SIGNATURE = "x-floom-signature"
FLOOM_DELIVERY = "x-floom-delivery"
GITHUB_SIGNATURE = "x-hub-signature-256"
GITHUB_DELIVERY = "x-github-delivery"
STANDARD_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")
# Never stored with a delivery: they carry credentials or would let it be re-sent as signed.
CREDENTIAL_WORDS = ("authorization", "cookie", "signature", "token", "secret", "api-key", "apikey")


class WebhookUnsigned(FloomError):
    """The request carries no signature."""

    status = 401
    code = "webhook_unsigned"


class WebhookSignatureInvalid(FloomError):
    """The request's signature does not match."""

    status = 401
    code = "webhook_signature_invalid"


class WebhookStale(FloomError):
    """The request's signed timestamp is too far from now."""

    status = 401
    code = "webhook_stale"


@dataclass(frozen=True)
class Verified:
    delivery_id: str
    signature_digest: str | None = None  # set when the delivery id is not itself signed


def verify(
    kind: str,
    *,
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    now: datetime | None = None,
) -> Verified:
    """Check the request; return its identity or raise one of the errors above."""
    lower = {k.lower(): v for k, v in headers.items()}
    if kind == "standard":
        return Verified(verify_standard(secret=secret, headers=lower, body=body))
    if kind == "github":
        return _verify_github(secret, lower, body)
    return _verify_floom(secret, lower, body, now or datetime.now(UTC))


# The headers that carry a signature, one per scheme.
SIGNATURE_HEADERS = ("webhook-signature", GITHUB_SIGNATURE, FLOOM_SIGNATURE)


def refusal(headers: Mapping[str, str]) -> WebhookUnsigned | WebhookSignatureInvalid:
    """The one answer to a request at /hooks that no webhook's secret verified: whether the
    hook exists, is ready, which scheme it signs with and why the check failed are the
    operator's to know (the log says), not a sender's. Only the request decides it: one
    carrying none of the schemes' signature headers is unsigned."""
    lower = {k.lower() for k in headers}
    if not lower.intersection(SIGNATURE_HEADERS):
        return WebhookUnsigned(
            "the request is not signed",
            hint="sign the raw body with the webhook's secret in the scheme its trigger "
            "names: Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature), "
            "GitHub (X-Hub-Signature-256) or floom's (X-Floom-Timestamp, X-Floom-Signature)",
        )
    return WebhookSignatureInvalid(
        "the request's signature does not match a webhook at this address",
        hint="check the URL and the secret with the operator of this floom server, and sign "
        "the raw body, sent unchanged, in the scheme the webhook's trigger names",
    )


def standard_key_problem(secret: str) -> str | None:
    """Why `secret` cannot sign Standard Webhooks (decoded as the library decodes it, with or
    without its whsec_ prefix), or None when it can. Never quotes the secret."""
    text = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(text + "==")
    except (binascii.Error, ValueError):
        return "it is not base64"
    if len(key) < MIN_STANDARD_KEY_BYTES:
        return f"it decodes to {len(key)} bytes, fewer than {MIN_STANDARD_KEY_BYTES}"
    return None


STANDARD_KEY_FORM = "whsec_ followed by the base64 of 24 to 64 random bytes"


def verify_standard(*, secret: str, headers: Mapping[str, str], body: bytes) -> str:
    """The delivery's id once its signature matches; a signature that matches but whose
    timestamp is out of tolerance is stale. The signature is checked first: a sender
    without the secret learns nothing from the timestamp's answer."""
    lower = {k.lower(): v for k, v in headers.items()}
    if not all(lower.get(h) for h in STANDARD_HEADERS):
        raise WebhookUnsigned(
            "the request is not signed: Standard Webhooks headers "
            f"{', '.join(STANDARD_HEADERS)} are required",
            hint="sign it with a Standard Webhooks library and the shared secret",
        )
    msg_id = lower["webhook-id"]
    try:
        sent = int(lower["webhook-timestamp"].strip())
        expected = Webhook(secret).sign(msg_id, datetime.fromtimestamp(sent, UTC), body).encode()
    except (
        ValueError,
        TypeError,
        OverflowError,
        OSError,
        EmptyWebhookSecretError,
    ) as exc:
        raise _mismatch() from exc  # a timestamp that is no time, or a key that is no key
    passed = lower["webhook-signature"].split(" ")
    if not any(hmac.compare_digest(expected, given.encode()) for given in passed):
        raise _mismatch()
    if abs(datetime.now(UTC).timestamp() - sent) > TOLERANCE_SECONDS:
        raise _stale()
    return msg_id


def _verify_github(secret: str, headers: Mapping[str, str], body: bytes) -> Verified:
    given = headers.get(GITHUB_SIGNATURE, "")
    if not given:
        raise WebhookUnsigned(
            "the request is not signed: X-Hub-Signature-256 is missing",
            hint="set the webhook's secret in GitHub to the value of the floom secret",
        )
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), given.strip().encode()):
        raise _mismatch()
    digest = _digest(given)
    return Verified(headers.get(GITHUB_DELIVERY) or digest, digest)


def _verify_floom(secret: str, headers: Mapping[str, str], body: bytes, now: datetime) -> Verified:
    given = headers.get(FLOOM_SIGNATURE, "")
    stamp = headers.get(FLOOM_TIMESTAMP, "")
    if not given or not stamp:
        raise WebhookUnsigned(
            "the request is not signed: X-Floom-Timestamp and X-Floom-Signature are required",
            hint='X-Floom-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>',
        )
    try:
        sent = int(stamp.strip())
    except ValueError as exc:
        raise _mismatch() from exc
    # The signature before the timestamp: only a holder of the secret learns it is stale.
    mac = hmac.new(secret.encode(), f"{sent}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(f"sha256={mac}".encode(), given.strip().encode()):
        raise _mismatch()
    if abs(now.timestamp() - sent) > TOLERANCE_SECONDS:
        raise _stale()
    digest = _digest(given)
    return Verified(headers.get(FLOOM_DELIVERY) or digest, digest)


def sign_floom(*, secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers of a request signed with floom's hmac-sha256 scheme (for senders, tests)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Floom-Timestamp": str(timestamp), "X-Floom-Signature": f"sha256={mac}"}


def storable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers worth keeping with a delivery, without any that carry credentials."""
    return {
        k.lower(): v
        for k, v in headers.items()
        if not any(word in k.lower() for word in CREDENTIAL_WORDS)
    }


def _digest(signature: str) -> str:
    return "sig-" + hashlib.sha256(signature.strip().encode()).hexdigest()[:40]


def _mismatch() -> WebhookSignatureInvalid:
    return WebhookSignatureInvalid(
        "the request's signature does not match",
        hint="sign the raw body with the secret the trigger names; the body must be sent unchanged",
    )


def _stale() -> WebhookStale:
    return WebhookStale(
        f"the request's signed timestamp is more than {TOLERANCE_SECONDS // 60} minutes from "
        "the server's time",
        hint="send deliveries when they are made, and keep the sender's clock in sync",
    )
