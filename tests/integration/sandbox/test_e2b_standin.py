"""The E2B stand-in, driven by the real `e2b` SDK pointed at it only through its own settings
(E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    NotEnoughSpaceException,
    RateLimitException,
    Sandbox,
    SandboxException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxUnreachableException,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry

from tests.standins.e2b import E2BStandin, e2b_standin  # noqa: F401 - the fixture
from tests.support.harness import wait_until


def test_many_files_go_up_in_one_request_and_come_back_as_text_and_bytes(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    sandbox = Sandbox.create(template="python-data", timeout=60, metadata={"run": "r1"})
    files: list[WriteEntry] = [
        WriteEntry(path=f"/home/user/bundle/f{i}.txt", data=f"file {i}") for i in range(300)
    ]
    files.append(WriteEntry(path="bundle/raw.bin", data=b"\x00\xff\x01"))

    written = sandbox.files.write_files(files)

    assert len(written) == 301
    assert e2b_standin.requests["POST /files"] == 1
    assert sandbox.files.read("/home/user/bundle/f7.txt") == "file 7"
    assert sandbox.files.read("bundle/raw.bin", format="bytes") == bytearray(b"\x00\xff\x01")
    listed = sandbox.files.list("/home/user/bundle")
    assert len(listed) == 301
    assert {e.path for e in listed} >= {"/home/user/bundle/raw.bin"}
    assert e2b_standin.host_path(sandbox.sandbox_id, "bundle/f7.txt").read_text() == "file 7"


def test_a_command_streams_each_line_while_it_runs_with_exact_exit_code(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    sandbox = Sandbox.create(timeout=60)
    sandbox.files.write(
        "/home/user/job/run.py",
        "import os, sys, time\n"
        "print('ready', flush=True)\n"
        "print('warn', file=sys.stderr, flush=True)\n"
        "while not os.path.exists('go'):\n"
        "    time.sleep(0.01)\n"
        "print(os.environ['GREETING'], os.getcwd().endswith('/job'))\n"
        "sys.exit(7)\n",
    )
    seen: list[tuple[str, str]] = []

    def on_stdout(text: str) -> None:
        seen.append(("stdout", text))
        if text == "ready\n":
            # The script only goes on once this line reached us: output is streamed.
            e2b_standin.host_path(sandbox.sandbox_id, "job/go").write_text("")

    with pytest.raises(CommandExitException) as ended:
        sandbox.commands.run(
            "python3 /home/user/job/run.py",
            cwd="/home/user/job",
            envs={"GREETING": "hello"},
            on_stdout=on_stdout,
            on_stderr=lambda text: seen.append(("stderr", text)),
            timeout=30,
        )

    assert ended.value.exit_code == 7
    assert ended.value.stderr == "warn\n"
    assert [text for stream, text in seen if stream == "stdout"] == ["ready\n", "hello True\n"]
    assert [text for stream, text in seen if stream == "stderr"] == ["warn\n"]
    assert sandbox.commands.run("true").exit_code == 0


def test_killing_a_command_stops_it_at_once(e2b_standin: E2BStandin) -> None:  # noqa: F811
    sandbox = Sandbox.create(timeout=60)
    handle = sandbox.commands.run("echo started; sleep 30", background=True)
    assert [p.pid for p in sandbox.commands.list()] == [handle.pid]

    started = time.monotonic()
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as ended:
        handle.wait()

    assert time.monotonic() - started < 2
    assert ended.value.exit_code == -1
    assert sandbox.commands.list() == []
    assert sandbox.commands.kill(handle.pid) is False


def test_sandboxes_are_listed_by_metadata_and_killed_by_id(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    mine = Sandbox.create(timeout=60, metadata={"node": "a", "run": "1"})
    other = Sandbox.create(timeout=60, metadata={"node": "b", "run": "2"})

    found = Sandbox.list(query=SandboxQuery(metadata={"node": "a"})).next_items()

    assert [s.sandbox_id for s in found] == [mine.sandbox_id]
    assert found[0].metadata == {"node": "a", "run": "1"}
    assert Sandbox.get_info(other.sandbox_id).metadata == {"node": "b", "run": "2"}
    assert Sandbox.connect(other.sandbox_id).commands.run("echo hi").stdout == "hi\n"
    assert Sandbox.kill(mine.sandbox_id) is True
    assert Sandbox.kill(mine.sandbox_id) is False
    assert other.kill() is True
    assert e2b_standin.sandboxes == {}
    assert e2b_standin.killed == [mine.sandbox_id, other.sandbox_id]
    assert [s.metadata["node"] for s in e2b_standin.created] == ["a", "b"]


def test_sandbox_settings_reach_its_commands_and_network_follows_the_flag(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    offline = Sandbox.create(timeout=60, envs={"LEVEL": "3"}, allow_internet_access=False)
    online = Sandbox.create(timeout=60)

    assert offline.commands.run("echo $LEVEL").stdout == "3\n"
    assert "tap0" not in offline.commands.run("cat /proc/net/dev").stdout
    assert "tap0" in online.commands.run("cat /proc/net/dev").stdout
    assert e2b_standin.sandboxes[offline.sandbox_id].allow_internet is False


def test_a_sandbox_ends_when_its_timeout_passes_unless_extended(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    short = Sandbox.create(timeout=1)
    kept = Sandbox.create(timeout=1)
    kept.set_timeout(60)

    wait_until(lambda: short.sandbox_id not in e2b_standin.sandboxes, timeout=5)
    assert kept.sandbox_id in e2b_standin.sandboxes
    with pytest.raises(SandboxNotRunningException):
        short.files.read("anything")


def test_an_unknown_template_gets_e2b_404(e2b_standin: E2BStandin) -> None:  # noqa: F811
    with pytest.raises(SandboxException) as refused:
        Sandbox.create(template="no-such-template")
    assert "404" in str(refused.value)
    assert "no-such-template" in str(refused.value)


def test_control_plane_faults_reach_the_sdk_as_its_own_exceptions(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    e2b_standin.fail_control_plane("rate_limited", times=2)
    Sandbox.create(timeout=60)  # the SDK retries 429 by itself
    assert e2b_standin.requests["POST /v2/sandboxes"] == 3

    e2b_standin.fail_control_plane("unauthorized")
    with pytest.raises(AuthenticationException):
        Sandbox.create()
    e2b_standin.fail_control_plane("unavailable")
    with pytest.raises(Exception, match="503"):
        Sandbox.create()
    e2b_standin.clear_faults()

    e2b_standin.set_quota(1)
    with pytest.raises(RateLimitException, match="maximum number of concurrent E2B sandboxes"):
        Sandbox.create()
    e2b_standin.clear_faults()

    e2b_standin.control_plane_down()
    with pytest.raises(httpx.ConnectError):
        Sandbox.create()
    e2b_standin.control_plane_up()
    assert Sandbox.create(timeout=60).sandbox_id in e2b_standin.sandboxes


def test_envd_dying_or_the_sandbox_being_killed_mid_command_ends_the_stream(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    for fault, expected in (
        (e2b_standin.kill_envd, SandboxUnreachableException),
        (e2b_standin.kill_sandbox, SandboxNotRunningException),
    ):
        sandbox = Sandbox.create(timeout=60)

        def on_stdout(
            text: str, sandbox_id: str = sandbox.sandbox_id, act: Callable[[str], object] = fault
        ) -> None:
            threading.Thread(target=act, args=(sandbox_id,)).start()

        started = time.monotonic()
        with pytest.raises(expected):
            sandbox.commands.run("echo up; sleep 30", on_stdout=on_stdout, timeout=30)
        assert time.monotonic() - started < 5


def test_envd_refuses_a_request_without_the_sandbox_access_token(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    sandbox = Sandbox.create(timeout=60)

    def get(path: str, sandbox_id: str) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(e2b_standin.sandbox_url.removeprefix("http://"))
        try:
            connection.request("GET", path, headers={"E2b-Sandbox-Id": sandbox_id})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    assert get("/health", sandbox.sandbox_id)[0] == 204
    assert get("/files?path=/home/user/x", sandbox.sandbox_id)[0] == 401
    status, body = get("/health", "gone")
    assert status == 502
    assert b"was not found" in body


def test_all_of_e2b_unreachable_mid_command_fails_the_call_and_the_sandbox_outlives_it(
    e2b_standin: E2BStandin,  # noqa: F811
) -> None:
    sandbox = Sandbox.create(timeout=60)
    sandbox.files.write("kept.txt", "still here")

    going_down = threading.Thread(target=e2b_standin.down)

    with pytest.raises(SandboxUnreachableException):
        sandbox.commands.run(
            "echo up; sleep 30", on_stdout=lambda text: going_down.start(), timeout=30
        )
    going_down.join(timeout=10)
    for url in (e2b_standin.api_url, e2b_standin.sandbox_url):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5)

    e2b_standin.up()
    assert sandbox.files.read("kept.txt") == "still here"
    assert [s.sandbox_id for s in Sandbox.list().next_items()] == [sandbox.sandbox_id]


def test_envd_faults_hit_only_the_route_asked_for(e2b_standin: E2BStandin) -> None:  # noqa: F811
    sandbox = Sandbox.create(timeout=60)
    e2b_standin.fail_envd(507, "not enough disk space", route="POST /files", times=1)

    with pytest.raises(NotEnoughSpaceException):
        sandbox.files.write("big.bin", b"x")
    assert sandbox.commands.run("echo fine").stdout == "fine\n"
    sandbox.files.write("big.bin", b"x")

    e2b_standin.fail_envd(route="/process.Process/Start")
    with pytest.raises(SandboxUnreachableException):
        sandbox.commands.run("echo never")
