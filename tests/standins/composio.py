"""A local stand-in for the parts of Composio's v3 REST API that agent tools use: a tool's
schema (GET /api/v3/tools/{slug}) and executing it (POST /api/v3/tools/execute/{slug})."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.standins.http import JSONHandler, serve

TOOLS = {
    "GMAIL_SEND_EMAIL": {
        "slug": "GMAIL_SEND_EMAIL",
        "name": "Send email",
        "description": "Send an email from the connected Gmail account.",
        "toolkit": {"slug": "gmail"},
        "input_parameters": {
            "type": "object",
            "properties": {"recipient_email": {"type": "string"}, "body": {"type": "string"}},
            "required": ["recipient_email", "body"],
        },
    },
    "GMAIL_DELETE_MESSAGE": {
        "slug": "GMAIL_DELETE_MESSAGE",
        "name": "Delete message",
        "description": "Delete a message.",
        "toolkit": {"slug": "gmail"},
        "input_parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
}


@contextmanager
def composio_standin(api_key: str) -> Iterator[dict[str, Any]]:
    """Yields {"url", "executed": [(slug, body)], "keys": [x-api-key values seen], "paths":
    [request paths, as sent]}."""
    state: dict[str, Any] = {"executed": [], "keys": [], "paths": []}

    class Handler(JSONHandler):
        def _authorised(self) -> bool:
            state["keys"].append(self.headers.get("x-api-key"))
            state["paths"].append(self.path)
            if self.headers.get("x-api-key") != api_key:
                self._send(401, {"error": {"message": "invalid api key"}})
                return False
            return True

        def do_GET(self) -> None:  # http.server's naming
            if not self._authorised():
                return
            slug = self.path.split("?")[0].rsplit("/", 1)[-1]
            if slug in TOOLS:
                self._send(200, TOOLS[slug])
            else:
                self._send(404, {"error": {"message": f"no tool {slug}"}})

        def do_POST(self) -> None:  # http.server's naming
            if not self._authorised():
                return
            slug = self.path.rsplit("/", 1)[-1]
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            state["executed"].append((slug, body))
            self._send(
                200,
                {
                    "successful": True,
                    "error": None,
                    "data": {"id": "msg-1", "sent_to": body["arguments"].get("recipient_email")},
                },
            )

    with serve(Handler) as url:
        state["url"] = url
        yield state
