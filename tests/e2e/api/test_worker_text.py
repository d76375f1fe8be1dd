"""Text a run writes that no store or answer can carry as it is: NUL bytes (PostgreSQL's text
refuses them), lone UTF-16 surrogates (a file name of invalid UTF-8 as Python reads it, a JSON
escape without its pair: no encoding holds one), control characters in names (no header or
link holds them). The run ends as it should and says what it wrote, on both stores; through
real bubblewrap runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from floom import jsonvalues
from floom.services.runs import rules
from tests.standins.anthropic_api import reply, text, tool_use
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.rigs.agents import agent_rig, agent_worker, log_lines, start_run, wait_status
from tests.support.web import signed_in_client

WRITER_YML = """\
name: writer
inputs: {attack: {type: string, required: true}}
limits: {timeout_seconds: 20}
"""
WRITER_PY = r"""
import json, os, sys
attack = json.load(open("inputs.json"))["attack"]
out = os.environ["FLOOM_OUTPUT_DIR"].encode()
if attack == "names":
    json.dump({"outputs": {}}, open("result.json", "w"))
    open(out + b"/kept.txt", "w").write("kept")
    os.mkfifo(out + b"/fifo\xff\n\x1b[31mRED")
    os.symlink("/etc/hostname", out + b"/link\xfc")
    os.mkdir(out + b"/dir\xfe")
    open(out + b"/dir\xfe/file.txt", "w").write("x")
elif attack == "nul-output":
    sys.stdout.buffer.write(b"before\x00after\n")
    sys.stdout.flush()
    sys.stderr.buffer.write(b"boom\x00\xff\n")
    sys.exit(3)
elif attack == "nul-error":
    open("result.json", "w").write('{"error": "bad \\u0000 end", "retryable": false}')
elif attack == "surrogate-output":
    open("result.json", "w").write('{"outputs": {"k": "v\\udfff"}}')
elif attack == "surrogate-key":
    open("result.json", "w").write('{"outputs": {"k\\ud800": 1}}')
elif attack == "surrogate-error":
    open("result.json", "w").write('{"error": "bad \\udcff"}')
elif attack == "huge-error":
    json.dump({"error": "E" * 900_000 + " the end", "retryable": False}, open("result.json", "w"))
elif attack == "artifact-names":
    json.dump({"outputs": {}}, open("result.json", "w"))
    for name in ["日本.txt", "é.txt", 'q"uote.txt', "a\nb.txt", "esc\x1b[31m.txt", "del\x7f.txt",
                 "invoice_\u202efdp.exe", "iso\u2067late.txt", "عربي.txt",
                 "rep\u200bort.pdf", "mark\u200f.txt"]:
        open(out + b"/" + name.encode(), "w").write("x")
"""


def _write(api: httpx.Client, tmp_path: Path, attack: str) -> dict[str, Any]:
    if api.get("/api/v1/workers/writer").status_code == 404:
        deploy_folder(api, make_worker(tmp_path / "writer", WRITER_YML, {"run.py": WRITER_PY}))
    resp = api.post("/api/v1/workers/writer/runs", json={"inputs": {"attack": attack}})
    assert resp.status_code == 202, resp.text
    return wait_for_run(api, resp.json()["id"], timeout=60)


def test_names_of_invalid_utf8_and_control_characters_left_by_a_run_are_said_escaped(
    api: httpx.Client, tmp_path: Path
) -> None:
    # Such a name in a note of the run's log failed the record of the run's end on both
    # stores (a lone surrogate): the run ended "executor lost" with its log and outputs gone.
    run = _write(api, tmp_path, "names")

    assert run["status"] == "succeeded", run
    assert [a["name"] for a in run["artifacts"]] == ["kept.txt"]
    lines = log_lines(api, run["id"])
    assert "fifo\\xff\\x0a\\x1b[31mRED is a FIFO (named pipe); floom keeps only regular files" in (
        lines
    )
    assert "link\\xfc is a symlink; floom keeps only regular files" in lines
    assert "artifact dir\\xfe/file.txt was not kept: its name is not UTF-8" in lines


def test_nul_bytes_a_run_writes_are_kept_as_replacement_characters(
    api: httpx.Client, tmp_path: Path
) -> None:
    # On PostgreSQL, whose text refuses NUL, such a line failed every write of the run's log
    # and the record of its end.
    run = _write(api, tmp_path, "nul-output")

    assert run["status"] == "failed", run
    assert run["error"]["code"] == "exit_code"
    assert run["error"]["message"] == "the script exited with code 3: boom\ufffd\ufffd"
    assert "before\ufffdafter" in log_lines(api, run["id"])

    run = _write(api, tmp_path, "nul-error")

    assert run["error"] == {"code": "worker_error", "message": "bad \ufffd end"}, run


def test_a_lone_surrogate_in_result_json_fails_the_run_naming_where(
    api: httpx.Client, tmp_path: Path
) -> None:
    # Kept, an output holding one made every read of the run answer 500.
    for attack, where in [
        ("surrogate-output", "result.json.outputs.k"),
        ("surrogate-key", "result.json.outputs"),
        ("surrogate-error", "result.json.error"),
    ]:
        run = _write(api, tmp_path, attack)

        assert run["status"] == "failed", run
        assert run["error"]["code"] == "result_invalid"
        message = run["error"]["message"]
        assert "lone UTF-16 surrogate" in message, run
        assert f" at {where}" in message, run
        assert api.get(f"/api/v1/runs/{run['id']}").status_code == 200


def test_an_error_a_run_reports_is_kept_to_a_bound_in_its_record_its_log_and_lists(
    api: httpx.Client, tmp_path: Path
) -> None:
    # Kept whole, a 900 KB error was in the run, in every page listing it and in one log
    # line of its own (a line of its output is cut at 16 KiB).
    run = _write(api, tmp_path, "huge-error")

    assert run["status"] == "failed", run
    message = run["error"]["message"]
    assert len(message) == rules.MAX_ERROR_CHARS
    assert message.startswith("E" * 1000)
    assert message.endswith(rules.ERROR_CUT_MARKER)
    listed = api.get("/api/v1/runs", params={"worker": "writer"}).json()["items"]
    assert [r["error"]["message"] for r in listed if r["id"] == run["id"]] == [message]
    assert f"failed: {message}" in log_lines(api, run["id"])


def test_inputs_holding_a_lone_surrogate_are_refused_naming_where(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "writer", WRITER_YML, {"run.py": WRITER_PY}))
    for body, where in [
        ('{"inputs": {"attack": "a\\ud800"}}', "inputs.attack"),
        ('{"inputs": {"attack": "a", "x\\udfff": 1}}', "inputs"),
    ]:
        resp = api.post(
            "/api/v1/workers/writer/runs",
            content=body,
            headers={"Content-Type": "application/json"},
        )

        # Refused as the body is read, before any route (tests/e2e/api/test_lone_surrogates.py).
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "invalid_request"
        assert f"lone UTF-16 surrogate at body.{where}" in error["message"], error
    assert api.get("/api/v1/runs").json()["items"] == []


def test_an_artifact_of_any_printable_name_downloads_and_one_with_a_control_character_is_not_kept(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    # A name of CJK characters answered 500 at download (a header holds latin-1); one with an
    # escape or DEL got no answer at all; one with a newline could not be asked for.
    run = _write(api, tmp_path, "artifact-names")

    assert run["status"] == "succeeded", run
    assert sorted(a["name"] for a in run["artifacts"]) == sorted(
        ["日本.txt", "é.txt", 'q"uote.txt', "عربي.txt"]
    )
    web = signed_in_client(server, server.admin_key)
    for name in ["日本.txt", "é.txt", 'q"uote.txt']:
        for client, path in [
            (api, f"/api/v1/runs/{run['id']}/artifacts/{quote(name)}"),
            (web, f"/runs/{run['id']}/files/{quote(name)}"),
        ]:
            resp = client.get(path)
            assert resp.status_code == 200, (path, resp.text)
            assert resp.content == b"x"
            disposition = resp.headers["content-disposition"]
            assert disposition.endswith(f"filename*=UTF-8''{quote(name, safe='')}"), disposition
            # Opened by a browser anyway, on either surface: no sniffing, no script, no origin.
            assert resp.headers["x-content-type-options"] == "nosniff"
            assert resp.headers["content-security-policy"].startswith("sandbox; default-src 'none'")
    lines = log_lines(api, run["id"])
    for shown in ["a\\x0ab.txt", "esc\\x1b[31m.txt", "del\\x7f.txt"]:
        assert f"artifact {shown} was not kept: its name holds a control character" in "\n".join(
            lines
        ), lines
    # A bidi override or isolate shows a name as another (invoice_exe.pdf): not kept either.
    for shown in ["invoice_\\u202efdp.exe", "iso\\u2067late.txt", "mark\\u200f.txt"]:
        assert f"artifact {shown} was not kept: its name holds a bidi override" in "\n".join(
            lines
        ), lines
    # So does a zero-width space ("report.pdf").
    assert (
        "artifact rep\\u200bort.pdf was not kept: its name holds a zero-width character"
        in "\n".join(lines)
    ), lines


def test_a_stored_value_holding_a_lone_surrogate_is_read_with_replacement_characters() -> None:
    from floom.store.statements.text import storable

    # Written by an older floom: every reader must still be able to show it.
    assert jsonvalues.stored('{"k\\ud800": ["v\\udfff", "\\ud83d\\ude00"]}') == {
        "k\ufffd": ["v\ufffd", "\U0001f600"]
    }
    assert storable("a\0b\udcffc\U0001f600") == "a\ufffdb\ufffdc\U0001f600"


def test_an_agent_meets_names_of_invalid_utf8_and_nul_paths_and_its_run_goes_on(
    tmp_path: Path, database_url: str
) -> None:
    # A file of invalid UTF-8 in the workspace, listed, put a lone surrogate into the next
    # request to the model, which could not be sent: the run failed "floom could not run this
    # attempt: UnicodeEncodeError". A path holding NUL was an internal error of the tool.
    tools = "[{builtin: run_command}, {builtin: list_files}, {builtin: read_file}]"
    command = "touch \"$(printf 'bad\\377name')\" \"$(printf 'nl\\nname')\" && echo made"
    with agent_rig(tmp_path / "data", database_url) as rig:
        rig.deploy(agent_worker(tmp_path / "lister", f"name: lister\ntools: {tools}\n"))
        rig.model.script(
            reply(tool_use("run_command", {"command": command})),
            reply(text("thinking \ud800 aloud"), tool_use("list_files", {})),
            reply(tool_use("read_file", {"path": "a\u0000b"})),
            reply(tool_use("finish", {"outputs": {}})),
        )

        run = wait_status(rig.api, start_run(rig.api, "lister"), timeout=60)

    assert run["status"] == "succeeded", run
    made, listed, read, _ = run["tool_calls"]
    assert made["result"] == "exit code 0\nmade", made
    assert "\nbad\\xffname (0 bytes)\n" in listed["result"], listed
    assert "\nnl\\x0aname (0 bytes)\n" in listed["result"], listed
    assert "is not a path inside the run's directory" in read["error"], read
