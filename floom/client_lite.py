"""The CLI's hot requests over the standard library's http.client: the same request, answer and
errors as FloomClient's, without importing httpx (about 0.15 s of every CLI call).

Only plain-HTTP servers reached without a proxy: `LiteClient.from_env` answers None for any
other configuration, and the caller uses FloomClient, which handles TLS and proxies.
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any
from urllib.parse import urlencode, urlsplit

from floom.client_env import admin_key_file, client_base_url
from floom.client_wire import (
    CONNECT_SECONDS,
    USER_AGENT,
    StartRequest,
    answer_error,
    configured_api_key,
    json_body,
    missing_key,
    timed_out,
    transport_failed,
    unreachable,
)

DEFAULT_TIMEOUT_SECONDS = 30.0  # FloomClient's
# httpx reads these (any case) and would go through a proxy: leave those calls to it.
PROXY_VARIABLES = ("http_proxy", "all_proxy")


class LiteClient:
    """One JSON request at a time to a plain-HTTP floom server, as FloomClient would send it."""

    def __init__(self, base_url: str, api_key: str | None, *, surface: str | None) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url
        self.api_key = api_key
        self.host = parts.hostname or ""
        self.port = parts.port or 80
        self.prefix = parts.path
        self.headers = {"User-Agent": USER_AGENT, "Accept": "*/*"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        if surface:
            self.headers["X-Floom-Client"] = surface

    @classmethod
    def from_env(cls, *, surface: str | None = None) -> LiteClient | None:
        """The client FLOOM_BASE_URL and the configured key describe, or None when the URL is
        not plain HTTP (or not plainly a URL) or a proxy is configured."""
        if any(k.lower() in PROXY_VARIABLES and v for k, v in os.environ.items()):
            return None
        base_url = client_base_url()
        try:
            parts = urlsplit(base_url)
            usable = (
                parts.scheme == "http"
                and bool(parts.hostname)
                and parts.port != 0
                and not (parts.username or parts.password or parts.query or parts.fragment)
            )
        except ValueError:  # e.g. a port that is not a number
            return None
        return cls(base_url, configured_api_key(), surface=surface) if usable else None

    def start_run(self, request: StartRequest) -> dict[str, Any]:
        """The answer to `POST /workers/{name}/runs` (with `?wait=` when the request waits)."""
        if not self.api_key:
            raise missing_key(admin_key_file())
        path = self.prefix + request.path
        if request.params:
            path += "?" + urlencode(request.params)
        # FloomClient's timeouts: 30 s for everything, or 10 s to connect and the wait's own
        # read timeout when the request waits.
        if request.read_seconds is None:
            connect = read = DEFAULT_TIMEOUT_SECONDS
        else:
            connect, read = CONNECT_SECONDS, request.read_seconds
        result: dict[str, Any] = self._json("POST", path, json_body(request.body), connect, read)
        return result

    def _json(self, method: str, path: str, body: bytes, connect: float, read: float) -> Any:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=connect)
        try:
            try:
                conn.connect()
            except TimeoutError as exc:
                raise timed_out(self.base_url) from exc
            except OSError as exc:  # refused, no route, unknown host
                raise unreachable(self.base_url) from exc
            assert conn.sock is not None
            conn.sock.settimeout(read)
            headers = {**self.headers, "Content-Type": "application/json"}
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                content = response.read()
            except TimeoutError as exc:
                raise timed_out(self.base_url) from exc
            except (OSError, http.client.HTTPException) as exc:
                raise transport_failed(self.base_url, exc) from exc
        finally:
            conn.close()
        if response.status >= 400:
            charset = response.headers.get_content_charset() or "utf-8"
            raise answer_error(response.status, content, content.decode(charset, "replace"))
        return json.loads(content)
