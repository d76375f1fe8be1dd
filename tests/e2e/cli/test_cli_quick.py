"""`floom run` through the quick path (floom/cli/quick.py: no typer or httpx, and no rich
unless log lines are shown) prints the same bytes and exits with the same code as the typer
command, and hands a run that outlasts its start request, or a log stream that breaks off,
over to the typer command's wait."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from floom.client.lite import LiteClient
from floom.client.wire import StartRequest
from floom.errors import ClientError
from tests.e2e.api.test_waits import NOOP, SLEEPER, keys_of
from tests.support.harness import (
    EXAMPLES,
    LiveServer,
    deploy_folder,
    free_port,
    live_server,
    make_worker,
    wait_until,
)

BROKEN = "import sys\nprint('about to fail', file=sys.stderr)\nsys.exit(3)\n"
CHATTY = (
    "import json, time\n"
    "for n in range(4):\n    print('line', n, flush=True)\n    time.sleep(0.3)\n"
    "json.dump({'outputs': {'said': 4}}, open('result.json', 'w'))\n"
)
# Line breaks that JSON leaves unescaped and str.splitlines splits at, inside one log line.
ODD = "print('before\\u2028after\\x85end', flush=True)\n"
# What changes from one run to the next: ids, times, digests, durations, version ids.
VARYING = re.compile(
    r'run_[0-9a-f]+|"\d{4}-\d\d-\d\dT[0-9:.+]+"|"sandbox_seconds": [0-9.]+|"digest": "[0-9a-f]+"'
    r"|\b\d\d:\d\d:\d\d\b|(?<= in )(\d+\.\d[sm]|\d+ms)\b|\bv[0-9a-f]{12}\b"
)
TYPER_ONLY = "import sys; from floom.cli.command import main; sys.argv[0] = 'floom'; main()"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One SQLite server for the module, whose key may hold one wait at a time."""
    root = tmp_path_factory.mktemp("quick")
    with live_server(root / "data", f"sqlite:///{root / 'floom.db'}", max_waits_per_key=1) as srv:
        with srv.client() as api:
            deploy_folder(api, EXAMPLES / "hello")
            workers = (
                ("broken", BROKEN),
                ("noop", NOOP),
                ("sleeper", SLEEPER),
                ("chatty", CHATTY),
                ("odd", ODD),
            )
            for name, script in workers:
                manifest = f"name: {name}\nlimits: {{timeout_seconds: 900}}\n"
                deploy_folder(api, make_worker(root / name, manifest, {"run.py": script}))
        yield srv


def floom(env: dict[str, str], *args: str, typer_only: bool = False) -> tuple[int, str, str]:
    head = ["-c", TYPER_ONLY] if typer_only else ["-m", "floom.cli"]
    done = subprocess.run(
        [sys.executable, *head, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, VARYING.sub("X", done.stdout), done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("run", "hello", "-i", "name=Ada", "--wait", "--json"),
        ("run", "hello", "--input-json", '{"name": "Bo", "times": 2}', "--wait", "--json"),
        ("run", "hello", "--json", "--force"),
        ("run", "hello", "-i", "name=Cy", "--timeout", "20", "--json"),
        ("run", "hello"),
        ("run", "broken", "--wait", "--json"),
        ("run", "hello", "-i", "times=abc", "--wait", "--json"),
        ("run", "nosuch", "--wait", "--json"),
        ("run", "hello", "-i", "name=Ada", "-i", "times=2", "--wait"),
        ("run", "chatty", "--wait"),
        ("run", "broken", "--wait"),
        ("run", "hello", "-i", "times=abc", "--wait"),
        ("run", "nosuch", "--wait"),
        ("run", "odd", "--wait"),
    ],
)
def test_the_quick_path_prints_what_the_typer_command_prints(
    server: LiveServer, args: tuple[str, ...]
) -> None:
    env = server.cli_env()
    quick = floom(env, *args)
    assert quick == floom(env, *args, typer_only=True)
    assert quick[0] == (1 if args[1] in ("broken", "nosuch") or "times=abc" in args else 0)
    if "--wait" in args and "--json" not in args and quick[0] == 0:
        assert quick[1].startswith("run X of ")
        assert "succeeded in X" in quick[1]
    if args[1] == "odd":
        # One line (no split at either), each shown as an escape, as every printer shows them.
        assert "stdout before\\u2028after\\x85end\n" in quick[1]


@pytest.mark.parametrize(
    "case", ["no key", "bad key", "unreachable", "read-only key"], ids=lambda c: c
)
def test_the_quick_path_fails_as_the_typer_command_does(
    server: LiveServer, tmp_path: Path, case: str
) -> None:
    env = server.cli_env()
    if case == "no key":
        env.update(FLOOM_API_KEY="", FLOOM_DATA_DIR=str(tmp_path / "nowhere"))
    elif case == "bad key":
        env["FLOOM_API_KEY"] = "flm_not_a_key"
    elif case == "unreachable":
        env["FLOOM_BASE_URL"] = f"http://127.0.0.1:{free_port()}"
    else:
        env["FLOOM_API_KEY"] = floom(env, "keys", "create", "--scope", "read")[1].strip()
    args = ("run", "hello", "--wait", "--json")
    quick = floom(env, *args)
    assert quick == floom(env, *args, typer_only=True)
    code, stdout, stderr = quick
    assert code == 1
    assert stdout == ""
    assert stderr.startswith("error: ")
    assert "\nhint: " in stderr


def _loaded(env: dict[str, str], *args: str) -> tuple[str, str]:
    """`floom ARGS`'s stdout, and its stderr ending with the heavy modules it loaded (the run
    state machine's dataclasses cost about 18 ms of CPU: the statuses come without it)."""
    probe = (
        f"import sys; sys.argv = ['floom', *{args!r}]\n"
        "from floom.cli import main\n"
        "try:\n    main()\nexcept SystemExit as done:\n    code = done.code\n"
        "heavy = ('typer', 'rich', 'httpx', 'pydantic', 'floom.services.runs.rules')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print('LOADED', heavy, code, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    return done.stdout, done.stderr.strip()


def test_run_wait_json_loads_neither_typer_rich_nor_httpx(server: LiveServer) -> None:
    stdout, stderr = _loaded(server.cli_env(), "run", "hello", "--wait", "--json")
    assert '"status": "succeeded"' in stdout
    assert stderr.endswith("LOADED [] 0"), stderr


def test_run_wait_shows_the_log_without_loading_typer_or_httpx(server: LiveServer) -> None:
    stdout, stderr = _loaded(server.cli_env(), "run", "chatty", "--wait")
    assert stderr.endswith("LOADED ['rich'] 0"), stderr
    lines = VARYING.sub("X", stdout).splitlines()
    assert lines[0] == "run X of chatty (X)"
    assert [line for line in lines if " stdout " in line] == [
        f"X stdout line {n}" for n in range(4)
    ]
    assert lines[-3:] == ["run X succeeded in X", "outputs:", "  said: 4"]


class CuttingRelay:
    """A loopback relay to a server that cuts the first log stream sent through it right
    after passing on a log event; every other exchange passes whole."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "", parts.port or 80)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.streams = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with self.listener:
            while True:
                try:
                    near = self.listener.accept()[0]
                except OSError:
                    return
                threading.Thread(target=self._relay, args=(near,), daemon=True).start()

    def _relay(self, near: socket.socket) -> None:
        far = socket.create_connection(self.upstream)
        with near, far, contextlib.suppress(OSError):
            first = near.recv(65536)
            cut = b"/logs/stream" in first and self.streams == 0
            self.streams += b"/logs/stream" in first
            far.sendall(first)
            threading.Thread(target=self._copy, args=(near, far), daemon=True).start()
            while answer := far.recv(65536):
                near.sendall(answer)
                if cut and b"event: log" in answer:
                    break
            for sock in (near, far):
                sock.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)

    def close(self) -> None:
        self.listener.close()


def test_a_log_stream_that_breaks_off_is_followed_on_without_a_line_twice(
    server: LiveServer,
) -> None:
    relay = CuttingRelay(server.base_url)
    try:
        env = {**server.cli_env(), "FLOOM_BASE_URL": relay.url}
        quick = floom(env, "run", "chatty", "--wait")
    finally:
        relay.close()
    assert relay.streams == 2  # the quick path's, cut; then the typer command's follow
    assert quick == floom(server.cli_env(), "run", "chatty", "--wait", typer_only=True)
    assert quick[0] == 0
    assert quick[1].count("stdout line") == 4


def test_a_run_that_outlasts_its_start_request_is_followed_to_its_end(server: LiveServer) -> None:
    # The key's one wait is held by a request on a sleeping run, so the start is answered at
    # once with the run queued; the typer command's wait then follows it to its end.
    with server.client() as api, ThreadPoolExecutor(max_workers=1) as pool:
        held = api.post("/api/v1/workers/sleeper/runs", json={}).json()["id"]
        pool.submit(api.get, f"/api/v1/runs/{held}", params={"wait": 30}, timeout=50)
        wait_until(lambda: server.ctx.node.run_ends.open_waits(keys_of(server)) == 1, timeout=10)
        try:
            code, stdout, stderr = floom(server.cli_env(), "run", "noop", "--wait", "--json")
        finally:
            api.post(f"/api/v1/runs/{held}/cancel")
    assert code == 0, stderr
    assert '"status": "succeeded"' in stdout
    assert '"worker": "noop"' in stdout


def test_a_proxy_setting_sends_the_command_through_httpx_and_its_proxy(
    server: LiveServer,
) -> None:
    env = {**server.cli_env(), "HTTP_PROXY": f"http://127.0.0.1:{free_port()}"}
    quick = floom(env, "run", "hello", "--json")
    assert quick == floom(env, "run", "hello", "--json", typer_only=True)
    assert quick[0] == 1
    assert "error: " in quick[2]


def _answer_once(answer: bytes) -> tuple[str, threading.Thread]:
    """A loopback listener that reads one request and sends `answer`, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener, listener.accept()[0] as conn:
            conn.settimeout(10)
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", thread


def test_the_quick_client_reads_a_chunked_answer_and_refuses_a_cut_one() -> None:
    record = b'{"id": "run_1", "status": "queued"}'
    chunked = (
        b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (10, record[:10])
        + b"%x\r\n%s\r\n" % (len(record) - 10, record[10:])
        + b"0\r\n\r\n"
    )
    url, thread = _answer_once(chunked)
    assert LiteClient(url, "flm_key", surface="cli").start_run(
        StartRequest("w", {"inputs": {}})
    ) == {
        "id": "run_1",
        "status": "queued",
    }
    thread.join(10)

    cut = b"HTTP/1.1 202 Accepted\r\ncontent-length: 100\r\n\r\n" + record
    url, thread = _answer_once(cut)
    with pytest.raises(ClientError) as caught:
        LiteClient(url, "flm_key", surface="cli").start_run(StartRequest("w", {"inputs": {}}))
    assert caught.value.code == "transport"
    assert "cut short" in caught.value.message
    thread.join(10)
