"""Who and how a client reached floom, when a TLS-terminating proxy stands in front of it.

floom speaks plain HTTP; behind a proxy the connection comes from the proxy. From the
addresses in FLOOM_FORWARDED_ALLOW_IPS (the proxies floom is told to trust), the proxy's
`Forwarded` (RFC 7239) or `X-Forwarded-Proto` / `X-Forwarded-For` headers say the client's
scheme and address; from anyone else they are ignored. Every rule that depends on them reads
the request as rewritten here: the session cookie's `Secure` flag, the per-address limit of
requests without a key. This is the one place they are read (`floom serve` turns uvicorn's
own reading off).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from floom.config import trusted_networks


class ForwardedHeaders:
    """ASGI middleware: a request from a trusted proxy gets the scheme and client address
    its forwarding headers name (the last hop's, skipping trusted proxies in a chain)."""

    def __init__(self, app: Any, *, trusted: str) -> None:
        self.app = app
        self.networks = trusted_networks(trusted)

    def trusts(self, host: str | None) -> bool:
        if host is None:
            return False
        if self.networks is None:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a unix socket's peer, or a name: not an address to trust
        return any(address in network for network in self.networks)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            peer = scope.get("client")
            if self.trusts(peer[0] if peer else None):
                self._rewrite(scope)
        await self.app(scope, receive, send)

    def _rewrite(self, scope: dict[str, Any]) -> None:
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", ()):
            if name in (b"forwarded", b"x-forwarded-proto", b"x-forwarded-for"):
                # Several lines of one header are one list, in order.
                headers[name] = headers[name] + b"," + value if name in headers else value
        if b"forwarded" in headers:
            hops = _forwarded_hops(headers[b"forwarded"].decode("latin-1"))
            clients = [hop.get("for", "") for hop in hops]
            proto = hops[-1].get("proto", "") if hops else ""
        else:
            clients = headers.get(b"x-forwarded-for", b"").decode("latin-1").split(",")
            protos = headers.get(b"x-forwarded-proto", b"").decode("latin-1").split(",")
            proto = protos[-1]
        proto = proto.strip().lower()
        if proto in ("http", "https"):
            if scope["type"] == "websocket":
                proto = "wss" if proto == "https" else "ws"
            scope["scheme"] = proto
        client = self._client(clients)
        if client:
            scope["client"] = (client, 0)

    def _client(self, hops: list[str]) -> str | None:
        """The nearest hop that is not a trusted proxy itself (or the farthest one given)."""
        addresses = [a for a in (_address(h) for h in hops) if a]
        for address in reversed(addresses):
            if not self.trusts(address):
                return address
        return addresses[0] if addresses else None


def _forwarded_hops(value: str) -> list[dict[str, str]]:
    hops = []
    for element in value.split(","):
        pairs: dict[str, str] = {}
        for pair in element.split(";"):
            key, sep, val = pair.partition("=")
            if sep:
                pairs[key.strip().lower()] = val.strip().strip('"')
        hops.append(pairs)
    return hops


def _address(hop: str) -> str | None:
    """An address from a forwarding hop ("1.2.3.4", "1.2.3.4:80", "[2001:db8::1]:443",
    "2001:db8::1"), or None for anything else ("unknown", an obfuscated name)."""
    hop = hop.strip()
    if hop.startswith("["):
        hop = hop[1:].partition("]")[0]
    elif hop.count(":") == 1:
        hop = hop.partition(":")[0]
    try:
        return str(ipaddress.ip_address(hop))
    except ValueError:
        return None
