"""The soak's clients (bench_soak.py starts this): client threads that run workers/hello
through the floom server from a process of their own, so their CPU, allocations and GIL
stay out of the server's process. Standard library only (no floom, no httpx).

Protocol: the first line on stdin is {"url", "token", "clients"}; then one command per
line, {"cmd": "runs", "count", "stop_at"} or {"cmd": "probe", "run_id"}. Every answer is
one JSON line on stdout; "runs" also writes {"progress": n, ...} lines every
PROGRESS_EVERY runs before its answer.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

PROGRESS_EVERY = 1000
KEEP_FAILURES = 5
HTTP_TIMEOUT_SECONDS = 60
RUN_BODY = json.dumps({"inputs": {"name": "s"}})


class Client:
    """One keep-alive connection; a broken one is replaced at the next request."""

    def __init__(self, url: str, token: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: str | None = None) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(
                self.host, self.port, timeout=HTTP_TIMEOUT_SECONDS
            )
        try:
            self.conn.request(method, path, body=body, headers=self.headers)
            resp = self.conn.getresponse()
            return resp.status, resp.read()
        except BaseException:
            self.close()
            raise

    def ok(self, method: str, path: str, body: str | None = None) -> bytes:
        status, data = self.call(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data[:200]!r}")
        return data

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def run_many(url: str, token: str, clients: int, count: int, stop_at: float) -> dict[str, Any]:
    """`count` runs over `clients` threads, each waiting for its run's end (one POST with
    ?wait=30); stops taking new runs once the wall clock passes `stop_at` (0: no limit).
    Every run must answer 2xx with status succeeded, or it counts as failed."""
    lock = threading.Lock()
    state: dict[str, Any] = {"taken": 0, "done": 0, "failures": 0, "failed": [], "last_id": ""}
    t0 = time.monotonic()

    def fail(message: str) -> None:
        state["failures"] += 1
        if len(state["failed"]) < KEEP_FAILURES:
            state["failed"].append(message)

    def loop() -> None:
        client = Client(url, token)
        try:
            while True:
                with lock:
                    if state["taken"] >= count or (stop_at and time.time() > stop_at):
                        return
                    state["taken"] += 1
                try:
                    status, data = client.call(
                        "POST", "/api/v1/workers/hello/runs?wait=30", RUN_BODY
                    )
                    body = json.loads(data) if data else {}
                except Exception as exc:  # a broken call is a failed run, not the soak's end
                    status, body = 0, {"error": repr(exc)}
                with lock:
                    state["done"] += 1
                    if not isinstance(body, dict) or "id" not in body:  # refused: says why
                        fail(f"HTTP {status}: {str(body)[:200]}")
                    else:
                        state["last_id"] = body["id"]
                        if body.get("status") != "succeeded":
                            fail(f"{body['id']}: {body.get('status')}")
                    if state["done"] % PROGRESS_EVERY == 0:
                        say(
                            {
                                "progress": state["done"],
                                "failures": state["failures"],
                                "seconds": time.monotonic() - t0,
                            }
                        )
        finally:
            client.close()

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "done": state["done"],
        "failures": state["failures"],
        "failed": state["failed"],
        "last_id": state["last_id"],
        "seconds": time.monotonic() - t0,
    }


def probe(url: str, token: str, run_id: str) -> dict[str, float]:
    """Milliseconds (median of 5) of the calls whose cost must not grow with the number of
    runs; a failed call ends the soak (the server answers these or something is wrong)."""
    client = Client(url, token)

    def page() -> None:
        cursor = json.loads(client.ok("GET", "/api/v1/runs"))["next_cursor"]
        client.ok("GET", "/api/v1/runs?" + urllib.parse.urlencode({"limit": 50, "cursor": cursor}))

    calls: dict[str, Callable[[], object]] = {
        "list": lambda: client.ok("GET", "/api/v1/runs?limit=50"),
        "page": page,
        "logs": lambda: client.ok("GET", f"/api/v1/runs/{run_id}/logs"),
        "submit": lambda: client.ok("POST", "/api/v1/workers/hello/runs?wait=30", "{}"),
    }
    costs = {}
    try:
        for name, call in calls.items():
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            costs[name] = sorted(times)[2] * 1000
    finally:
        client.close()
    return costs


def main() -> int:
    setup = json.loads(sys.stdin.readline())
    url, token, clients = setup["url"], setup["token"], int(setup["clients"])
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "runs":
            say(run_many(url, token, clients, int(command["count"]), command.get("stop_at", 0)))
        elif command["cmd"] == "probe":
            say(probe(url, token, command["run_id"]))
        else:
            raise SystemExit(f"soak client: unknown command {command['cmd']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
