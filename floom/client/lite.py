"""The CLI's hot requests with the standard library's socket: the same request, answer and errors
as FloomClient's, without importing httpx (about 0.15 s of every CLI call) or http.client
(which loads ssl and the email parser, about a quarter of what is left).

One request per connection (`Connection: close`): the answer is a status line, headers and
a body sized by Content-Length, or sent in chunks until the server closes. Only plain-HTTP
servers reached without a proxy, with an ASCII key: `LiteClient.from_env` answers None for
any other configuration, and the caller uses FloomClient, which handles TLS, proxies and
the rest.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from typing import Any, NamedTuple
from urllib.parse import urlencode, urlsplit

from floom.client.wire import (
    CONNECT_SECONDS,
    USER_AGENT,
    StartRequest,
    answer_error,
    configured_api_key,
    json_body,
    missing_key,
    sse_events,
    text_lines,
    timed_out,
    transport_failed,
    unreachable,
    url_path,
)
from floom.client_env import admin_key_file, client_base_url

DEFAULT_TIMEOUT_SECONDS = 30.0  # FloomClient's
# FloomClient's read timeout on the log stream: the server says something (a keep-alive
# comment) every 15 s, so a longer silence is a stalled connection.
STREAM_READ_SECONDS = 30.0
# httpx reads these (any case) and would go through a proxy: leave those calls to it.
PROXY_VARIABLES = ("http_proxy", "all_proxy")
READ_BYTES = 65536


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


class _BadAnswer(Exception):
    """The bytes the server sent are not an HTTP/1.1 answer this client can read."""


class LiteClient:
    """One JSON request at a time to a plain-HTTP floom server, as FloomClient would send it."""

    def __init__(self, base_url: str, api_key: str | None, *, surface: str | None) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url
        self.api_key = api_key
        self.host = parts.hostname or ""
        self.port = parts.port or 80
        self.prefix = parts.path
        self.headers = {
            "Host": parts.netloc,
            "Accept": "*/*",
            "User-Agent": USER_AGENT,
            "Connection": "close",
        }
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        if surface:
            self.headers["X-Floom-Client"] = surface

    @classmethod
    def from_env(cls, *, surface: str | None = None) -> LiteClient | None:
        """The client FLOOM_BASE_URL and the configured key describe, or None when the URL is
        not plain HTTP (or not plainly a URL), a proxy is configured or the key or URL is
        not ASCII."""
        if any(k.lower() in PROXY_VARIABLES and v for k, v in os.environ.items()):
            return None
        base_url = client_base_url()
        key = configured_api_key()
        try:
            parts = urlsplit(base_url)
            usable = (
                parts.scheme == "http"
                and bool(parts.hostname)
                and parts.port != 0
                and not (parts.username or parts.password or parts.query or parts.fragment)
                and base_url.isascii()
                and (key or "").isascii()
            )
        except ValueError:  # e.g. a port that is not a number
            return None
        return cls(base_url, key, surface=surface) if usable else None

    def start_run(self, request: StartRequest) -> dict[str, Any]:
        """The answer to `POST /workers/{name}/runs` (with `?wait=` when the request waits)."""
        path = self.prefix + request.path
        if request.params:
            path += "?" + urlencode(request.params)
        # FloomClient's timeouts: 30 s for everything, or 10 s to connect and the wait's own
        # read timeout when the request waits.
        if request.read_seconds is None:
            connect = read = DEFAULT_TIMEOUT_SECONDS
        else:
            connect, read = CONNECT_SECONDS, request.read_seconds
        return self._json("POST", path, json_body(request.body), connect, read)

    def get_run(self, run_id: str) -> dict[str, Any]:
        """The answer to `GET /runs/{id}`: the run record."""
        path = f"{self.prefix}/api/v1/runs/{url_path(run_id)}"
        return self._json("GET", path, None, DEFAULT_TIMEOUT_SECONDS, DEFAULT_TIMEOUT_SECONDS)

    def follow_log(self, run_id: str, *, after: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
        """("log", event) for each of the run's log events above seq `after` as it is
        written, then ("end", run) once the run has ended, from the server-sent event stream.
        Raises ClientError when the stream cannot be read to its end event (refused, not a
        stream, cut off, silent for STREAM_READ_SECONDS): FloomClient.follow, which
        reconnects and falls back to polling, can take over from the last seq."""
        if not self.api_key:
            raise missing_key(admin_key_file())
        path = f"{self.prefix}/api/v1/runs/{url_path(run_id)}/logs/stream?after={after}"
        sock = self._connect(CONNECT_SECONDS)
        try:
            with sock:
                sock.settimeout(STREAM_READ_SECONDS)
                sock.sendall(self._head("GET", path, {"Accept": "text/event-stream"}))
                received = _Received(sock)
                status, headers = _parse_head(received.until(b"\r\n\r\n"))
                kind = headers.get("content-type", "")
                if status != 200 or not kind.startswith("text/event-stream"):
                    raise _BadAnswer(f"the log stream answered HTTP {status} ({kind or 'no type'})")
                chunked = "chunked" in headers.get("transfer-encoding", "").lower()
                body = received.chunks() if chunked else received.rest()
                for event, data in sse_events(text_lines(body)):
                    if event in ("log", "end"):
                        yield event, json.loads(data)
                    if event == "end":
                        return
            raise _BadAnswer("the log stream ended before the run did")
        except TimeoutError as exc:
            raise timed_out(self.base_url) from exc
        except (OSError, ValueError, _BadAnswer) as exc:  # ValueError: a garbled event
            raise transport_failed(self.base_url, exc) from exc

    def _json(
        self, method: str, path: str, body: bytes | None, connect: float, read: float
    ) -> dict[str, Any]:
        if not self.api_key:
            raise missing_key(admin_key_file())
        answer = self._exchange(method, path, body, connect, read)
        if answer.status >= 400:
            charset = _charset(answer.headers.get("content-type", "")) or "utf-8"
            raise answer_error(answer.status, answer.body, answer.body.decode(charset, "replace"))
        result: dict[str, Any] = json.loads(answer.body)
        return result

    def _head(self, method: str, path: str, extra: dict[str, str]) -> bytes:
        headers = {**self.headers, **extra}
        head = f"{method} {path} HTTP/1.1\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
        return head.encode("ascii")

    def _connect(self, seconds: float) -> socket.socket:
        try:
            return socket.create_connection((self.host, self.port), timeout=seconds)
        except TimeoutError as exc:
            raise timed_out(self.base_url) from exc
        except OSError as exc:  # refused, no route, unknown host
            raise unreachable(self.base_url) from exc

    def _exchange(
        self, method: str, path: str, body: bytes | None, connect: float, read: float
    ) -> Answer:
        # As httpx sends them: a body's type and length, and neither without a body.
        extra = {}
        if body is not None:
            extra = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        sock = self._connect(connect)
        received = b""
        try:
            with sock:
                sock.settimeout(read)  # between two reads, as httpx's read timeout
                sock.sendall(self._head(method, path, extra) + (body or b""))
                while not _complete(received) and (chunk := sock.recv(READ_BYTES)):
                    received += chunk
            return _parse(received)
        except TimeoutError as exc:
            raise timed_out(self.base_url) from exc
        except (OSError, _BadAnswer) as exc:
            raise transport_failed(self.base_url, exc) from exc


class _Received:
    """An answer's bytes, read from its socket as they are asked for."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> bool:
        chunk = self.sock.recv(READ_BYTES)
        self.buffer += chunk
        return bool(chunk)

    def until(self, separator: bytes) -> bytes:
        """The bytes before the next `separator` (which is consumed)."""
        while separator not in self.buffer:
            if not self._more():
                raise _BadAnswer("the server's answer was cut short")
        part, _, self.buffer = self.buffer.partition(separator)
        return part

    def chunks(self) -> Iterator[bytes]:
        """A chunked body's data, chunk by chunk, up to the last (empty) chunk."""
        while True:
            try:
                size = int(self.until(b"\r\n").split(b";", 1)[0], 16)
            except ValueError as exc:
                raise _BadAnswer("the server's chunked answer is garbled") from exc
            if size == 0:
                return
            while len(self.buffer) < size + 2:
                if not self._more():
                    raise _BadAnswer("the server's chunked answer was cut short")
            data, self.buffer = self.buffer[:size], self.buffer[size + 2 :]
            yield data

    def rest(self) -> Iterator[bytes]:
        """The body up to the server's close."""
        if self.buffer:
            yield self.buffer
            self.buffer = b""
        while self._more():
            yield self.buffer
            self.buffer = b""


def _complete(data: bytes) -> bool:
    """Whether `data` holds a whole answer sized by Content-Length (else the server's close
    ends it)."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(rest) >= int(value)
    return False


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and headers (names in lower case) of an answer's head."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, status_and_reason = lines[0].partition(" ")
    status = status_and_reason.partition(" ")[0]
    if not version.startswith("HTTP/1.") or not status.isdigit():
        raise _BadAnswer("the server's answer is not HTTP/1.1")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status), headers


def _parse(data: bytes) -> Answer:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        raise _BadAnswer("the server's answer was cut short or is not HTTP/1.1")
    status, headers = _parse_head(head)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return Answer(status, headers, _dechunk(rest))
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or len(rest) < int(length):
            raise _BadAnswer("the server's answer was cut short")
        rest = rest[: int(length)]
    return Answer(status, headers, rest)


def _dechunk(data: bytes) -> bytes:
    parts: list[bytes] = []
    at = 0
    try:
        while True:
            end = data.index(b"\r\n", at)
            size = int(data[at:end].split(b";", 1)[0], 16)
            if size == 0:
                return b"".join(parts)
            parts.append(data[end + 2 : end + 2 + size])
            at = end + 2 + size + 2
            if at > len(data):
                raise ValueError
    except ValueError as exc:
        raise _BadAnswer("the server's chunked answer was cut short") from exc


def _charset(content_type: str) -> str | None:
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"') or None
    return None
