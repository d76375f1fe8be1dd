"""http_request's own rules over the egress guard (floom/net/egress.py): only the tool's
allow_domains and methods, redirects followed hop by hop (each target checked like the first
URL, credentials kept from other origins), the body read up to a bound."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urljoin

import httpx

from floom.agent.tools import ToolError
from floom.net.egress import (
    RUNS,
    EgressPolicy,
    EgressRefused,
    describe_failure,
    guarded_client,
)

MAX_REDIRECTS = 5
MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class HttpPolicy:
    allow_domains: tuple[str, ...]
    methods: tuple[str, ...] | None = None
    egress: EgressPolicy = field(default_factory=EgressPolicy)


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: dict[str, str]
    body: str
    truncated: bool
    url: str


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


def request(
    *,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None,
    policy: HttpPolicy,
    timeout: float,
    secret_headers: frozenset[str] = frozenset(),
    secret_body: bool = False,
) -> HttpReply:
    """Send the request hop by hop, checking every redirect target like the first URL.

    `secret_headers` (lower-case names) and `secret_body` say which parts carry a secret
    floom filled in: like credentials, they are never handed to another origin than the
    first, which alone chose the redirect (a body that would be resent is refused)."""
    withheld = _CREDENTIALS | secret_headers
    method = method.upper()
    if policy.methods is not None and method not in policy.methods:
        raise ToolError(
            f"method {method} is not allowed for this tool; allowed: {', '.join(policy.methods)}"
        )
    with guarded_client(
        policy.egress, places=RUNS, timeout=timeout, follow_redirects=False
    ) as client:
        for _ in range(MAX_REDIRECTS + 1):
            reply, location = _one_hop(client, method, url, headers, content, policy)
            if location is None:
                return reply
            target = urljoin(url, location)
            if reply.status == 303 or (reply.status in (301, 302) and method == "POST"):
                method, content = "GET", None
            if _origin(target) != _origin(url):
                # Like browsers: credentials are not handed to another origin.
                headers = {k: v for k, v in headers.items() if k.lower() not in withheld}
                if secret_body and content is not None:
                    raise ToolError(
                        f"refused: {url} redirects ({reply.status}) to another origin "
                        f"({_shown_origin(target)}), which would be sent the body again with "
                        "the secret filled into it; request that URL yourself if it is meant"
                    )
            url = target
    raise ToolError(f"more than {MAX_REDIRECTS} redirects")


_CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization"})


def _origin(url: str) -> tuple[str, str, int | None]:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return ("", url, None)
    return (parsed.scheme, parsed.host, parsed.port)


def _shown_origin(url: str) -> str:
    scheme, host, port = _origin(url)
    return f"{scheme}://{host}" + (f":{port}" if port else "")


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
    send_headers = {k: v for k, v in headers.items() if k.lower() != "host"}
    try:
        req = client.build_request(method, parsed, headers=send_headers, content=content)
        response = client.send(req, stream=True)
    except EgressRefused:
        raise
    except httpx.HTTPError as exc:
        raise ToolError(f"{method} {url} failed: {describe_failure(exc)}") from exc
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
