"""What every floom client says and reads on the wire, with the standard library only: the API
key it sends, how a start request is built, how a log stream's lines and events are read,
and the FloomError an answer or a failed connection becomes. FloomClient (httpx) and the
CLI's quick path (client_lite, sockets) share it."""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from floom.client_env import admin_key_file
from floom.errors import ClientError, FloomError, rebuild
from floom.hints import act, told

UNREACHABLE_HINT = told("start it with ", act("serve"), " or set FLOOM_BASE_URL")
# A client waits through `?wait=` calls of this long; the server allows 60 s at most, and the
# read timeout leaves room for the answer.
WAIT_CALL_SECONDS = 30.0
MAX_SERVER_WAIT_SECONDS = 60.0
WAIT_READ_MARGIN_SECONDS = 15.0
CONNECT_SECONDS = 10.0
USER_AGENT = "floom-client"
LINE_END = re.compile("\r\n|\r|\n")


def configured_api_key() -> str | None:
    """FLOOM_API_KEY, else the admin key a local server saved in its data dir."""
    key = os.environ.get("FLOOM_API_KEY", "").strip()
    if key:
        return key
    try:
        return admin_key_file().read_text().strip() or None
    except OSError:
        return None


def missing_key(where: Path | None) -> ClientError:
    """No key to send: say where one comes from."""
    saved = f", or run where the server saved its admin key ({where})" if where else ""
    return ClientError(
        "no API key configured", status=0, code="no_api_key", hint=f"set FLOOM_API_KEY{saved}"
    )


def url_path(*parts: str) -> str:
    """URL path segments joined by slashes, each percent-encoded so an id cannot add a segment."""
    return "/".join(quote(p, safe="") for p in parts)


def json_body(value: Any) -> bytes:
    """A request's JSON body, encoded as httpx encodes `json=`."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def start_body(
    inputs: dict[str, Any], *, coerce_strings: bool = False, force: bool = False
) -> dict[str, Any]:
    """A start request's body as the CLI's quick path sends it, without pydantic: the fields
    it uses of floom.schemas.runs.RunRequest (the one shape of that body)."""
    body: dict[str, Any] = {"inputs": inputs, "coerce_strings": coerce_strings}
    if force:
        body["force"] = True
    return body


class StartRequest:
    """`POST /workers/{name}/runs` with `body` (a RunRequest as JSON), and `?wait=` when the
    caller waits for the end."""

    def __init__(
        self, worker: str, body: dict[str, Any], *, wait: float = 0, until: str = "ended"
    ) -> None:
        self.path = f"/api/v1/workers/{url_path(worker)}/runs"
        self.body = body
        self.params: dict[str, str] | None = None
        self.read_seconds: float | None = None  # None: the client's default timeout
        if wait > 0:
            wait = min(wait, MAX_SERVER_WAIT_SECONDS)
            self.params = {"wait": f"{wait:g}", "until": until}
            self.read_seconds = wait + WAIT_READ_MARGIN_SECONDS


def answer_error(status: int, content: bytes, text: str) -> FloomError:
    """The FloomError an error answer carries (the server's own subclass, rebuilt from its
    code), or a ClientError naming the status when the body is not floom's error shape."""
    try:
        err = json.loads(content)["error"]
        return rebuild(
            status=status,
            code=str(err.get("code") or "http_error"),
            message=str(err.get("message") or f"HTTP {status}"),
            hint=err.get("hint"),
            details=err.get("details"),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        text = text.strip()[:200]
        return ClientError(
            f"floom answered HTTP {status}" + (f": {text}" if text else ""),
            status=status,
            code="http_error",
            hint="check that FLOOM_BASE_URL points at a floom server",
        )


def unreachable(base_url: str) -> ClientError:
    return ClientError(
        f"cannot reach floom at {base_url}", status=0, code="unreachable", hint=UNREACHABLE_HINT
    )


def timed_out(base_url: str) -> ClientError:
    return ClientError(
        f"floom at {base_url} did not answer in time",
        status=0,
        code="timeout",
        hint="check that the server is running and not overloaded",
    )


def bad_url(base_url: str) -> ClientError:
    return ClientError(
        f"'{base_url}' is not a usable floom URL",
        status=0,
        code="bad_url",
        hint="set FLOOM_BASE_URL to e.g. http://127.0.0.1:8321",
    )


def transport_failed(base_url: str, exc: Exception) -> ClientError:
    return ClientError(f"talking to floom at {base_url} failed: {exc}", status=0, code="transport")


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(event, data) pairs of a server-sent event stream; comments and ids are skipped."""
    kind = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield kind, "\n".join(data)
            kind, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            kind = value
        elif field == "data":
            data.append(value)


def text_lines(body: Iterable[bytes]) -> Iterator[str]:
    """The body's lines as text, each as soon as its end (\\r\\n, \\n or \\r) arrives: only
    those end an event stream's line, not every break str.splitlines knows (U+2028 and
    the like travel unescaped inside JSON)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    for data in body:
        pending += decoder.decode(data)
        # A "\r" at the end may be the first half of "\r\n": keep it for the next read.
        held = pending.endswith("\r")
        *lines, pending = LINE_END.split(pending[:-1] if held else pending)
        pending += "\r" if held else ""
        yield from lines
    pending += decoder.decode(b"", final=True)
    if pending:
        yield from LINE_END.split(pending.removesuffix("\r"))
