"""A local stand-in for the Anthropic Messages API (POST /v1/messages, plain or streamed as
server-sent events when the request asks for `stream`), driven by a script of replies, so the
real `anthropic` SDK runs against it."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any

from tests.standins.http import STOP_POLL_SECONDS, JSONHandler

Reply = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_{next(_ids):06d}",
        "name": name,
        "input": arguments or {},
    }


def reply(
    *blocks: dict[str, Any],
    input_tokens: int = 100,
    output_tokens: int = 20,
    delay: float = 0.0,
    hold: threading.Event | None = None,
) -> dict[str, Any]:
    """One scripted model turn; stop_reason follows from the blocks. Streamed, each line of
    text is its own delta; with `hold`, the stream stops before its last block until the
    event is set (so a test can see what a run shows mid-turn)."""
    return {
        "content": list(blocks),
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        "delay": delay,
        "hold": hold,
    }


def failure(status: int = 500, message: str = "overloaded") -> dict[str, Any]:
    """One scripted turn that fails with an API error."""
    return {"error_status": status, "message": message}


class MessagesStandin:
    """Answers each POST /v1/messages with the next scripted reply and records the request."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.requests: list[dict[str, Any]] = []
        self.auth_headers: list[str] = []
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self.url = ""

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def tool_names(self, index: int = -1) -> list[str]:
        return [t["name"] for t in self.requests[index].get("tools", [])]

    def tool_results(self, index: int = -1) -> list[dict[str, Any]]:
        """The tool_result blocks of the last user message of request `index`."""
        content = self.requests[index]["messages"][-1]["content"]
        return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, message, _ = self._plan(body)
        return status, message

    def _plan(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], threading.Event | None]:
        with self._lock:
            self.requests.append(body)
            step = self._script.pop(0) if self._script else None
        if step is None:
            return (
                500,
                {
                    "type": "error",
                    "error": {"type": "api_error", "message": "stand-in script exhausted"},
                },
                None,
            )
        planned = step(body) if callable(step) else step
        if "error_status" in planned:
            return (
                planned["error_status"],
                {"type": "error", "error": {"type": "api_error", "message": planned["message"]}},
                None,
            )
        if planned.get("delay"):
            time.sleep(planned["delay"])
        content = planned["content"]
        uses_tools = any(b.get("type") == "tool_use" for b in content)
        message = {
            "id": f"msg_{next(_ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": "tool_use" if uses_tools else "end_turn",
            "stop_sequence": None,
            "usage": planned["usage"],
        }
        return 200, message, planned.get("hold")


def stream_events(message: dict[str, Any], hold: threading.Event | None) -> Iterator[Any]:
    """The Messages API's server-sent events for one whole reply, in its order; a
    threading.Event in the sequence means "wait for it here"."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 0}
    yield "message_start", {"type": "message_start", "message": start}
    blocks = message["content"]
    for index, block in enumerate(blocks):
        if hold is not None and index == len(blocks) - 1:
            yield hold
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [
                {"type": "text_delta", "text": part}
                for part in block["text"].splitlines(keepends=True)
            ]
        else:
            opening = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": opening,
            },
        )
        for delta in deltas:
            yield (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": delta,
                },
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


@contextmanager
def messages_standin(key: str) -> Iterator[MessagesStandin]:
    standin = MessagesStandin(key)

    class Handler(JSONHandler):
        def do_POST(self) -> None:  # http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            auth = self.headers.get("x-api-key") or self.headers.get("Authorization") or ""
            standin.auth_headers.append(auth)
            if auth not in (key, f"Bearer {key}"):
                self._send(
                    401,
                    {
                        "type": "error",
                        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
                    },
                )
                return
            if self.path.split("?")[0] != "/v1/messages":
                self._send(
                    404,
                    {"type": "error", "error": {"type": "not_found_error", "message": self.path}},
                )
                return
            status, message, hold = standin._plan(body)
            if status != 200 or not body.get("stream"):
                self._send(status, message)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for event in stream_events(message, hold):
                if isinstance(event, threading.Event):
                    event.wait(timeout=60)
                    continue
                name, data = event
                self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(STOP_POLL_SECONDS,), daemon=True)
    thread.start()
    standin.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()
