"""A request rate per client address for whatever reaches floom without a valid key.

Keyed requests have their key's rate (api/auth.py). Everything else (webhooks at /hooks,
the sign-in page and its form, /healthz, the web UI before sign-in, the docs) and every
request whose key or session turned out not to be valid is charged to its client address:
token buckets of FLOOM_ANONYMOUS_RATE_LIMIT_PER_MINUTE that hold
FLOOM_ANONYMOUS_RATE_LIMIT_BURST, one for requests without a credential and one for refused
credentials; empty, the address is answered 429 `rate_limited` with Retry-After before
anything else runs (for the second, also with a credential: failed ones emptied it).
The address is the one api/forwarded.py settles on (behind a trusted proxy, the client's);
an IPv6 client counts by its /64, which one host usually holds whole. Each table holds at
most MAX_ADDRESSES addresses, the least recently seen leaving first, so its memory is
bounded whatever the number of senders.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from floom.api.errors import floom_error_response
from floom.config import Settings
from floom.errors import RateLimited

MAX_ADDRESSES = 10_000
log = logging.getLogger("floom.webhooks")
SESSION_COOKIE = (
    b"floom_session="  # api/ui_support.SESSION_COOKIE (not imported: the UI loads lazily)
)


class AddressLimiter:
    """Token buckets per address, least recently used first out beyond `max_addresses`;
    `per_minute` 0 lets everything through."""

    def __init__(
        self,
        *,
        per_minute: int,
        burst: int,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_second = per_minute / 60
        self.burst = float(max(burst, 1))
        self.max_addresses = max_addresses
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def charge(self, address: str, *, cost: float = 1.0) -> int | None:
        """Take `cost` from the address's bucket (0: only look); the seconds to wait when
        it holds less than one request, else None."""
        if self.per_second <= 0:
            return None
        with self._lock:
            now = self.clock()
            tokens, then = self._buckets.pop(address, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.per_second)
            refused = tokens < 1
            if not refused:
                tokens -= cost
            self._buckets[address] = (tokens, now)  # the most recent, at the end
            while len(self._buckets) > self.max_addresses:
                self._buckets.popitem(last=False)
        return math.ceil((1 - tokens) / self.per_second) if refused else None


def client_key(scope: dict[str, Any]) -> str:
    """The address a request is counted against: IPv4 as it is, IPv6 by its /64."""
    client = scope.get("client")
    host = client[0] if client else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host or "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class AddressRateLimit:
    """ASGI middleware: requests without a credential are charged to their address as they
    come; requests with one only once it has been refused, to a bucket of their own, so a
    neighbour's anonymous requests never stop a valid key sent from the same address, and
    guessing keys stops before the lookup once the guesses have emptied that bucket."""

    def __init__(self, app: Any, *, settings: Settings) -> None:
        self.app = app
        self.anonymous, self.refused = (
            AddressLimiter(
                per_minute=settings.anonymous_rate_limit_per_minute,
                burst=settings.anonymous_rate_limit_burst,
            )
            for _ in range(2)
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.anonymous.per_second <= 0:
            await self.app(scope, receive, send)
            return
        address = client_key(scope)
        if not _has_credential(scope):
            wait = self.anonymous.charge(address)
            if wait is not None:
                await _refuse(scope, receive, send, wait)
                return
            await self.app(scope, receive, send)
            return
        wait = self.refused.charge(address, cost=0.0)
        if wait is not None:
            await _refuse(scope, receive, send, wait)
            return

        async def send_watched(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and _refused_credential(message):
                self.refused.charge(address)
            await send(message)

        await self.app(scope, receive, send_watched)


def _has_credential(scope: dict[str, Any]) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return True
        if name == b"cookie" and SESSION_COOKIE in value:
            return True
    return False


def _refused_credential(message: dict[str, Any]) -> bool:
    """A 401, or the web UI sending a browser whose session is not valid to sign in."""
    status = message.get("status")
    if status == 401:
        return True
    if status in (302, 303, 307):
        for name, value in message.get("headers", ()):
            if name == b"location" and value.startswith(b"/login"):
                return True
    return False


async def _refuse(scope: dict[str, Any], receive: Any, send: Any, wait: int) -> None:
    refusal = RateLimited(
        f"too many requests without a valid API key from this address; try again in {wait} s",
        hint="send a valid API key (keyed requests have their key's own rate); the operator "
        "sets FLOOM_ANONYMOUS_RATE_LIMIT_PER_MINUTE and FLOOM_ANONYMOUS_RATE_LIMIT_BURST",
        details={"retry_after_seconds": wait},
    )
    await floom_error_response(refusal, surface="rest")(scope, receive, send)


class HookFailureBudget:
    """Failed signature checks at /hooks, counted per client address and per hook (the
    path's name, whether or not a webhook is there: the answer must not tell). A sender
    whose bucket, or a hook whose bucket, its failures emptied is answered 429 before its
    body is read or any HMAC computed, and the log says so once per emptying, not once a
    request. Each bucket holds a minute's worth: FLOOM_WEBHOOK_FAILURES_PER_MINUTE per
    address, FLOOM_WEBHOOK_HOOK_FAILURES_PER_MINUTE per hook. A flood from one address holds
    back only that address. A flood at one hook from many addresses holds back the hook's
    new senders while it lasts, but not an address that delivered a verified event to it in
    the last VERIFIED_SENDER_SECONDS: the sender a hook is for keeps getting through."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> None:
        per_address = settings.webhook_failures_per_minute
        per_hook = settings.webhook_hook_failures_per_minute
        self.by_address = AddressLimiter(per_minute=per_address, burst=per_address)
        self.by_hook = AddressLimiter(per_minute=per_hook, burst=per_hook)
        self.clock = clock
        # (hook, address) -> when it last delivered a verified event; oldest first.
        self.senders: OrderedDict[tuple[str, str], float] = OrderedDict()

    def check(self, *, hook: str, address: str) -> None:
        """Raise RateLimited when the address's failures are used up, or the hook's are and
        the address is not one of the hook's verified senders."""
        key = hook[:HOOK_KEY_CHARS]
        waits = [
            wait
            for wait in (
                self.by_address.charge(address, cost=0.0),
                None if self._known(key, address) else self.by_hook.charge(key, cost=0.0),
            )
            if wait is not None
        ]
        if waits:
            wait = max(waits)
            raise RateLimited(
                f"too many deliveries that failed their signature check; try again in {wait} s",
                hint="sign deliveries with the webhook's secret, and send them again after "
                "the wait",
                details={"retry_after_seconds": wait},
            )

    def failed(self, *, hook: str, address: str) -> None:
        """Count a failed check; the log says when it empties a bucket."""
        key = hook[:HOOK_KEY_CHARS]
        for limiter, charged, what, setting in (
            (self.by_address, address, f"from {address}", "FLOOM_WEBHOOK_FAILURES_PER_MINUTE"),
            (self.by_hook, key, f"to /hooks/{key!r}", "FLOOM_WEBHOOK_HOOK_FAILURES_PER_MINUTE"),
        ):
            limiter.charge(charged)
            wait = limiter.charge(charged, cost=0.0)
            if wait is not None:
                log.warning(
                    "webhook deliveries %s failed their signature check too often; they are "
                    "answered 429 for %d s (%s)",
                    what,
                    wait,
                    setting,
                )

    def verified(self, *, hook: str, address: str) -> None:
        """Remember that `address` delivered an event `hook` verified."""
        sender = (hook[:HOOK_KEY_CHARS], address)
        self.senders[sender] = self.clock()
        self.senders.move_to_end(sender)
        while len(self.senders) > VERIFIED_SENDERS:
            self.senders.popitem(last=False)

    def _known(self, hook: str, address: str) -> bool:
        seen = self.senders.get((hook, address))
        return seen is not None and self.clock() - seen < VERIFIED_SENDER_SECONDS


HOOK_KEY_CHARS = 200
# How long, and for how many (hook, address) pairs, a verified delivery lets its sender
# past a hook's emptied budget.
VERIFIED_SENDER_SECONDS = 3600.0
VERIFIED_SENDERS = 10_000
