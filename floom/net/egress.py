"""The egress guard: the one rule set for every connection floom makes on a worker's behalf
(an agent's `http_request`, its MCP tool sources, Composio calls, run callbacks and alert
channels: floom/services/alerts/senders.py), checked after name
resolution and pinned to the checked address, so that DNS rebinding cannot swap it.

The rules, the same for every source:
- never an address of this host, in any range: loopback, and every address on its
  interfaces (read for each connection: floom/net/addresses.py);
- never a private, link-local (cloud metadata), shared, multicast, reserved or otherwise
  non-global address, unless the operator lists its network in FLOOM_EGRESS_ALLOW (which
  cannot open the host's own addresses);
- every redirect is a new connection, checked the same way;
- no proxy from the environment (a proxy would resolve the name itself, past the check).

What a refused or failing endpoint answered never reaches a run's error or a tool's error
raw: `describe_failure` says what kind of failure it was, never the body, and bounds it.

FLOOM_AGENT_HTTP_ALLOW_PRIVATE and FLOOM_AGENT_HTTP_RESOLVE relax all of this for tests
(loopback stand-ins); a run says so in its log.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from floom.errors import ToolError
from floom.net.addresses import Network, host_networks

if TYPE_CHECKING:
    import httpx
    import httpx2

    from floom.config import Settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
DESCRIBE_LIMIT = 300
# Networks FLOOM_EGRESS_ALLOW can never open: whatever the host is, these are it.
NEVER_ALLOWED: tuple[Network, ...] = (
    ipaddress.IPv4Network("0.0.0.0/8"),
    ipaddress.IPv4Network("127.0.0.0/8"),
    ipaddress.IPv6Network("::/127"),
)
ALLOW_HINT = "list networks in CIDR form, comma-separated, e.g. FLOOM_EGRESS_ALLOW=10.1.2.0/24"


# httpx and httpcore log every request's URL at INFO and DEBUG, and the URLs floom sends to
# can hold secrets (a Slack webhook's URL is one, a callback's query may be): a node whose
# operator turns on INFO logging must not write them out.
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class EgressRefused(ToolError):
    """A connection on a worker's behalf was refused by the egress guard."""


@dataclass(frozen=True)
class EgressPolicy:
    """The operator's choices: `allow_networks` opens non-public networks (never the host's
    own addresses). `allow_private` and `resolve` are for tests only."""

    allow_networks: tuple[Network, ...] = ()
    allow_private: bool = False
    resolve: tuple[tuple[str, str], ...] = ()

    @property
    def relaxed_for_tests(self) -> bool:
        return self.allow_private or bool(self.resolve)


def policy_of(settings: Settings) -> EgressPolicy:
    return EgressPolicy(
        allow_networks=parse_allowed_networks(settings.egress_allow),
        allow_private=settings.agent_http_allow_private,
        resolve=parse_resolve(settings.agent_http_resolve),
    )


RELAXED_WARNING = (
    "warning: FLOOM_AGENT_HTTP_ALLOW_PRIVATE or FLOOM_AGENT_HTTP_RESOLVE is set: the egress "
    "guard's address checks are relaxed (meant for tests only)"
)


def parse_allowed_networks(text: str) -> tuple[Network, ...]:
    """FLOOM_EGRESS_ALLOW ("10.1.2.0/24,fd00:1::/64") as networks; raises ValueError naming
    the entry that is not an allowable network."""
    networks: list[Network] = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        try:
            network = ipaddress.ip_network(entry)
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not a network such as 10.1.2.0/24") from exc
        for closed in NEVER_ALLOWED:
            if network.version == closed.version and network.overlaps(closed):
                raise ValueError(f"{entry!r} overlaps {closed}, which floom never connects to")
        networks.append(network)
    return tuple(networks)


def parse_resolve(text: str) -> tuple[tuple[str, str], ...]:
    """ "host=address,host2=address" (FLOOM_AGENT_HTTP_RESOLVE) as pairs."""
    pairs = []
    for item in text.split(","):
        host, sep, addr = item.strip().partition("=")
        if sep and host and addr:
            pairs.append((host.strip().lower(), addr.strip()))
    return tuple(pairs)


# -- the rules ---------------------------------------------------------------------------------


def refusal(address: Address, policy: EgressPolicy, host: tuple[Network, ...]) -> str | None:
    """Why the guard refuses `address` ("a loopback address", ...), or None. `host` is this
    host's networks (host_networks())."""
    if policy.allow_private:
        return None
    for ip in _embedded(address):
        if ip.is_loopback or _within(ip, NEVER_ALLOWED):
            return "a loopback address"
        if _within(ip, host):
            return "an address of this host"
    for ip in _embedded(address):
        kind = _kind_of(ip)
        if kind and not _within(ip, policy.allow_networks):
            return kind
    return None


def _within(ip: Address, networks: tuple[Network, ...]) -> bool:
    # `in` across IP versions compares the integers: the version must be checked first.
    return any(ip.version == net.version and ip in net for net in networks)


def _embedded(address: Address) -> list[Address]:
    """The address and the IPv4 addresses an IPv6 one carries (mapped, 6to4, Teredo, NAT64):
    each is checked, as each is where the connection may end up."""
    found: list[Address] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            found.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            found.append(address.sixtofour)
        if address.teredo is not None:
            found.extend(address.teredo)
        if address in _NAT64:
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _kind_of(ip: Address) -> str | None:
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_private:
        return "a private address"
    if ip.is_multicast or ip.is_reserved or ip.is_unspecified or not ip.is_global:
        return "a non-public address"
    return None


def resolve_checked(host: str, port: int, policy: EgressPolicy) -> str:
    """The address to connect to for `host`: every address it resolves to is checked, and
    the first is the one used. Raises EgressRefused."""
    mapped = dict(policy.resolve).get(host.lower())
    written = _written_address(host)
    if mapped:
        addresses = [mapped]
    elif written is not None:
        addresses = [str(written)]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid name"
            raise EgressRefused(f"cannot resolve {host}: {reason}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise EgressRefused(f"{host} has no address")
    try:
        networks = () if policy.allow_private else host_networks()
    except OSError as exc:
        raise EgressRefused(
            f"refused: cannot tell whether {host} is this host ({exc}); try again"
        ) from exc
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError as exc:
            raise EgressRefused(f"{host} resolves to {address!r}, not an address") from exc
        kind = refusal(ip, policy, networks)
        if kind:
            raise EgressRefused(
                f"refused: {host} resolves to {address}, {kind}; floom connects on a worker's "
                "behalf only to public addresses"
            )
    return addresses[0]


def _written_address(host: str) -> Address | None:
    """`host` as an address when it is one written out (93.184.215.14, 2001:db8::1)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def needs_lookup(host: str, policy: EgressPolicy) -> bool:
    """Whether resolving `host` asks the system's resolver: not for an address written out,
    nor for a name FLOOM_AGENT_HTTP_RESOLVE maps."""
    return not dict(policy.resolve).get(host.lower()) and _written_address(host) is None


# Every name resolved on a worker's or a caller's behalf (a channel saved, a run started with
# a callback URL, a worker.yml validated, and every connection: an alert or a callback sent,
# an agent's request): each is given RESOLVE_SECONDS, and at most RESOLVING are resolved at
# once, so that names whose servers never answer (a domain a caller runs, fast when checked
# and silent when sent) hold neither the server's threads nor the alert loop. Each kind of
# caller has places of its own: names a caller (any read key, for a worker.yml's callbacks)
# or a run's agent keeps hanging never leave floom's own alerts and callbacks unresolved.
RESOLVE_SECONDS = 3.0
RESOLVING = 8
CHECKS = threading.BoundedSemaphore(RESOLVING)
"""Places for the checks a caller waits for: a channel saved, a callback URL checked."""
SENDS = threading.BoundedSemaphore(RESOLVING)
"""Places for floom's own connections: an alert or a run's callback sent."""
RUNS = threading.BoundedSemaphore(RESOLVING)
"""Places for the connections a run's agent makes (its HTTP tools, its MCP servers)."""


def resolve_checked_now(
    host: str,
    port: int,
    policy: EgressPolicy,
    *,
    seconds: float | None = None,
    places: threading.BoundedSemaphore = SENDS,
) -> str:
    """resolve_checked, answered within about `seconds` (default RESOLVE_SECONDS; twice
    that at most, when RESOLVING others are under way): a name not resolved by then is
    refused (EgressRefused, "cannot resolve"). The resolution goes on in a thread of its
    own until the resolver gives up, holding one of the RESOLVING `places` (CHECKS, SENDS
    or RUNS: whose it is); the caller does not wait for it. An address written out or a
    name the resolve setting maps is answered at once, in the caller's thread."""
    if not needs_lookup(host, policy):
        # Nothing to wait for: no thread, and no place taken from the names that need one.
        return resolve_checked(host, port, policy)
    seconds = RESOLVE_SECONDS if seconds is None else seconds
    if not places.acquire(timeout=seconds):
        raise EgressRefused(f"cannot resolve {host}: too many names are being resolved; try again")
    outcome: list[str | BaseException] = []

    def resolve() -> None:
        try:
            outcome.append(resolve_checked(host, port, policy))
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome.append(exc)
        finally:
            places.release()

    worker = threading.Thread(target=resolve, name="floom-resolve", daemon=True)
    worker.start()
    worker.join(seconds)
    if not outcome:
        raise EgressRefused(f"cannot resolve {host}: no answer within {seconds:g} s")
    found = outcome[0]
    if isinstance(found, BaseException):
        raise found
    return found


# -- guarded HTTP clients ----------------------------------------------------------------------


def _pin(url: Any, policy: EgressPolicy, places: threading.BoundedSemaphore) -> tuple[str, str]:
    """(host name, checked address) for a request's URL; raises EgressRefused."""
    if url.scheme not in ("http", "https"):
        raise EgressRefused(f"only http and https can be reached, not {url.scheme!r}")
    host = url.raw_host.decode("ascii").lower()
    if not host:
        raise EgressRefused("a URL without a host")
    port = url.port or (443 if url.scheme == "https" else 80)
    return host, resolve_checked_now(host, port, policy, places=places)


class AnswerTooLarge(EgressRefused):
    """An answer went past what its client reads of one (`max_answer_bytes`)."""


def _uncompressed(headers: Any, most: int) -> None:
    """Refuse an answer compressed though floom asked for none: its size on the wire would
    not bound what it unpacks to."""
    coding = headers.get("content-encoding", "").strip().lower()
    if coding not in ("", "identity"):
        raise AnswerTooLarge(
            f"it answered compressed ({coding[:40]}), which floom did not ask for and reads "
            f"only up to {most} bytes unpacked"
        )


def _too_large(most: int) -> AnswerTooLarge:
    return AnswerTooLarge(f"its answer was larger than {most} bytes, more than floom reads")


def guarded_client(
    policy: EgressPolicy,
    *,
    places: threading.BoundedSemaphore = SENDS,
    max_answer_bytes: int | None = None,
    **options: Any,
) -> httpx.Client:
    """An httpx.Client whose every connection goes through the guard (redirects included,
    when followed), its names resolved in `places`; no proxy from the environment. With
    `max_answer_bytes`, an answer is asked for and read uncompressed, and reading past that
    many bytes of it raises AnswerTooLarge: for clients that read answers whole."""
    import httpx

    class _Capped(httpx.SyncByteStream):
        def __init__(self, inner: Any, most: int) -> None:
            self.inner, self.most = inner, most

        def __iter__(self) -> Any:
            seen = 0
            for chunk in self.inner:
                seen += len(chunk)
                if seen > self.most:
                    raise _too_large(self.most)
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class _Transport(httpx.BaseTransport):
        def __init__(self) -> None:
            # A pool per host name: a connection checked (and TLS-verified) for one name is
            # never reused for another name that resolves to the same address.
            self._pools: dict[str, httpx.HTTPTransport] = {}

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            # The connection goes to the checked address; the Host header and the TLS name
            # (certificate checks included) stay the host's name.
            host, address = _pin(request.url, policy, places)
            pinned = httpx.Request(
                request.method,
                request.url.copy_with(host=address),
                headers=request.headers,
                stream=request.stream,
                extensions={**request.extensions, "sni_hostname": host},
            )
            pool = self._pools.get(host)
            if pool is None:
                pool = self._pools[host] = httpx.HTTPTransport(trust_env=False)
            if max_answer_bytes is None:
                return pool.handle_request(pinned)
            pinned.headers["Accept-Encoding"] = "identity"
            response = pool.handle_request(pinned)
            try:
                _uncompressed(response.headers, max_answer_bytes)
            except AnswerTooLarge:
                response.close()
                raise
            response.stream = _Capped(response.stream, max_answer_bytes)
            return response

        def close(self) -> None:
            for pool in self._pools.values():
                pool.close()

    return httpx.Client(transport=_Transport(), trust_env=False, **options)


def guarded_async_client(
    policy: EgressPolicy,
    *,
    places: threading.BoundedSemaphore = SENDS,
    max_answer_bytes: int | None = None,
    **options: Any,
) -> httpx2.AsyncClient:
    """The same for the MCP SDK's HTTP client (httpx2)."""
    import httpx2

    class _Capped(httpx2.AsyncByteStream):
        def __init__(self, inner: Any, most: int) -> None:
            self.inner, self.most = inner, most

        async def __aiter__(self) -> Any:
            seen = 0
            async for chunk in self.inner:
                seen += len(chunk)
                if seen > self.most:
                    raise _too_large(self.most)
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class _Transport(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self._pools: dict[str, httpx2.AsyncHTTPTransport] = {}

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            import anyio.to_thread

            # Name resolution blocks: off the event loop, as httpx's own would be.
            host, address = await anyio.to_thread.run_sync(_pin, request.url, policy, places)
            pinned = httpx2.Request(
                request.method,
                request.url.copy_with(host=address),
                headers=request.headers,
                stream=request.stream,
                extensions={**request.extensions, "sni_hostname": host},
            )
            pool = self._pools.get(host)
            if pool is None:
                pool = self._pools[host] = httpx2.AsyncHTTPTransport(trust_env=False)
            if max_answer_bytes is None:
                return await pool.handle_async_request(pinned)
            pinned.headers["Accept-Encoding"] = "identity"
            response = await pool.handle_async_request(pinned)
            try:
                _uncompressed(response.headers, max_answer_bytes)
            except AnswerTooLarge:
                await response.aclose()
                raise
            response.stream = _Capped(response.stream, max_answer_bytes)
            return response

        async def aclose(self) -> None:
            for pool in self._pools.values():
                await pool.aclose()

    return httpx2.AsyncClient(transport=_Transport(), trust_env=False, **options)


# -- what a failure may say --------------------------------------------------------------------


def describe_failure(exc: BaseException) -> str:
    """A failed connection or exchange in floom's words: the guard's refusal, a timeout, a
    failed connection, an HTTP status, a protocol error's code. Never what the other end
    sent (a refused or failing endpoint may be a service that should not be read), and at
    most DESCRIBE_LIMIT characters."""
    return _describe(exc)[:DESCRIBE_LIMIT]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    if isinstance(exc, EgressRefused):
        return str(exc)
    for module in (sys.modules.get("httpx"), sys.modules.get("httpx2")):
        if module is None:
            continue
        if isinstance(exc, module.HTTPStatusError):
            return f"it answered HTTP {exc.response.status_code}"
        if isinstance(exc, module.TimeoutException):
            return "it timed out"
        if isinstance(exc, module.ConnectError):
            return "could not connect"
        if isinstance(exc, module.TransportError):
            return f"the connection failed ({type(exc).__name__})"
    code = getattr(getattr(exc, "error", None), "code", None)
    if isinstance(code, int):
        return f"it answered a protocol error (code {code})"
    if isinstance(exc, TimeoutError):
        return "it timed out"
    if exc.__cause__ is not None and exc.__cause__ is not exc:
        return _describe(exc.__cause__)
    return f"it failed ({type(exc).__name__})"
