"""Outbound HTTP for agents: only to allowed domains, never to private, loopback or link-local
addresses, checked after DNS resolution and pinned to the checked address (no rebinding)."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx

from floom.agent.tools import ToolError

MAX_REDIRECTS = 5
MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class HttpPolicy:
    allow_domains: tuple[str, ...]
    methods: tuple[str, ...] | None = None
    # Unsafe, for tests: reach private addresses, and resolve names from this map first.
    allow_private: bool = False
    resolve: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: dict[str, str]
    body: str
    truncated: bool
    url: str


def parse_resolve(text: str) -> tuple[tuple[str, str], ...]:
    """ "host=address,host2=address" (FLOOM_AGENT_HTTP_RESOLVE) as pairs."""
    pairs = []
    for item in text.split(","):
        host, sep, addr = item.strip().partition("=")
        if sep and host and addr:
            pairs.append((host.strip().lower(), addr.strip()))
    return tuple(pairs)


def domain_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    for pattern in allowed:
        pattern = pattern.lower()
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False


def _kind_of(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address is off limits, or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_private:
        return "private"
    if ip.is_multicast or ip.is_reserved or ip.is_unspecified or not ip.is_global:
        return "non-public"
    return None


def resolve_checked(host: str, port: int, policy: HttpPolicy) -> str:
    """The address to connect to for host, after refusing any non-public one."""
    mapped = dict(policy.resolve).get(host.lower())
    if mapped:
        addresses = [mapped]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ToolError(f"cannot resolve {host}: {exc.strerror}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise ToolError(f"{host} has no address")
    for address in addresses:
        kind = _kind_of(ipaddress.ip_address(address.split("%")[0]))
        if kind and not policy.allow_private:
            raise ToolError(
                f"refused: {host} resolves to {address}, a {kind} address; agents may only "
                "reach public addresses"
            )
    return addresses[0]


def request(
    *,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None,
    policy: HttpPolicy,
    timeout: float,
) -> HttpReply:
    """Send the request hop by hop, checking every redirect target like the first URL."""
    method = method.upper()
    if policy.methods is not None and method not in policy.methods:
        raise ToolError(
            f"method {method} is not allowed for this tool; allowed: {', '.join(policy.methods)}"
        )
    for _ in range(MAX_REDIRECTS + 1):
        # A client per hop: a pooled connection is bound to the name it was checked for.
        with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
            reply, location = _one_hop(client, method, url, headers, content, policy)
        if location is None:
            return reply
        target = urljoin(url, location)
        if _origin(target) != _origin(url):
            # Like browsers: credentials are not handed to another origin.
            headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIALS}
        url = target
        if reply.status == 303 or (reply.status in (301, 302) and method == "POST"):
            method, content = "GET", None
    raise ToolError(f"more than {MAX_REDIRECTS} redirects")


_CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization"})


def _origin(url: str) -> tuple[str, str, int | None]:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return ("", url, None)
    return (parsed.scheme, parsed.host, parsed.port)


def _one_hop(
    client: httpx.Client,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None,
    policy: HttpPolicy,
) -> tuple[HttpReply, str | None]:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ToolError(f"not a valid URL: {url}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ToolError(f"only http and https URLs can be requested, not {url!r}")
    host = parsed.host.lower()
    if not domain_allowed(host, policy.allow_domains):
        raise ToolError(
            f"refused: {host} is not in this tool's allow_domains "
            f"({', '.join(policy.allow_domains)})"
        )
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    address = resolve_checked(host, port, policy)
    pinned = parsed.copy_with(host=address)
    send_headers = {k: v for k, v in headers.items() if k.lower() != "host"}
    send_headers["Host"] = parsed.netloc.decode("ascii")
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    try:
        req = client.build_request(
            method, pinned, headers=send_headers, content=content, extensions=extensions
        )
        response = client.send(req, stream=True)
    except httpx.TimeoutException as exc:
        raise ToolError(f"{method} {url} timed out") from exc
    except httpx.HTTPError as exc:
        raise ToolError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc
    try:
        if response.is_redirect and "location" in response.headers:
            return _reply(response, b"", False, url), response.headers["location"]
        data = b""
        truncated = False
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) > MAX_BODY_BYTES:
                data, truncated = data[:MAX_BODY_BYTES], True
                break
    finally:
        response.close()
    return _reply(response, data, truncated, url), None


def _reply(response: httpx.Response, data: bytes, truncated: bool, url: str) -> HttpReply:
    keep = ("content-type", "location", "link", "retry-after", "x-ratelimit-remaining")
    return HttpReply(
        status=response.status_code,
        headers={k: v for k, v in response.headers.items() if k.lower() in keep},
        body=data.decode(response.encoding or "utf-8", errors="replace"),
        truncated=truncated,
        url=url,
    )
