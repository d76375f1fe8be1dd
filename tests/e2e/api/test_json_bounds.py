"""One set of bounds for every JSON value floom takes in (floom/jsonvalues.py): a value over
one is refused naming the bound wherever it comes from (a result.json, run inputs, an
approval edit, a handoff payload, a webhook body, an agent's tool input), and a value that
trips a parser's own limit (a YAML or JSON integer past Python's 4,300 digits, a JSON body
nested past the parser's recursion) is a 4xx naming where, never a 500."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from floom import jsonvalues
from floom.errors import InputInvalid, InvalidRequest
from floom.manifest.load import check_manifest
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.handoffs import rules
from floom.services.runs import approvals
from floom.services.triggers.webhooks import parse_body
from tests.e2e.api.test_limits_parsers import archive
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.web import csrf_of, signed_in_client

BIG = "9" * 5000
DEEP_LIST = "[" * 5000 + "]" * 5000


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("manifest", "path"),
    [
        (f"name: big\nlimits:\n  timeout_seconds: {BIG}\n", "limits.timeout_seconds"),
        (f"name: big\ninputs:\n  n: {{type: integer, default: {BIG}}}\n", "inputs.n.default"),
        (f"name: big\ntitle: {BIG}\n", "title"),
        ("name: big\ndescription: 2024-13-45\n", "description"),
    ],
    ids=["limit", "default", "title", "impossible-date"],
)
def test_a_yaml_value_its_parser_cannot_build_is_a_4xx_naming_the_field_on_validate_and_deploy(
    api: httpx.Client, manifest: str, path: str
) -> None:
    headers = {"Content-Type": "application/gzip"}
    checked = api.post("/api/v1/workers/validate", content=archive(manifest), headers=headers)
    assert checked.status_code == 200, checked.text[:300]  # validate answers problems as data
    assert checked.json()["valid"] is False
    assert checked.json()["problems"][0]["path"] == path
    response = api.post("/api/v1/workers", content=archive(manifest), headers=headers)
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["code"] == "manifest_invalid", error
    assert error["details"][0]["path"] == path, error
    assert path in error["message"]
    assert api.get("/api/v1/workers").json()["items"] == []


def test_a_yaml_integer_over_the_digit_limit_is_reported_by_the_local_check() -> None:
    manifest, problems = check_manifest(f"name: big\nlimits: {{memory_mb: {BIG}}}\n", ["run.py"])
    assert manifest is None
    assert problems[0].path == "limits.memory_mb"
    assert "4300 digits" in problems[0].message


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('{"inputs": {"n": ' + BIG + "}}", "4300 digits"),
        ('{"inputs": ' + DEEP_LIST + "}", "nests too deep"),
    ],
    ids=["huge-integer", "deep"],
)
def test_a_json_body_the_parser_gives_up_on_is_a_400_saying_why(
    api: httpx.Client, body: str, said: str
) -> None:
    response = api.post(
        "/api/v1/workers/any/runs", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text[:300]
    assert said in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "bound"),
    [
        ('{"inputs": {"n": NaN}}', "number"),
        ('{"inputs": {"n": 1e400}}', "number"),
        ('{"inputs": {"n": ' + json.dumps(_nested(70)) + "}}", "depth"),
        ('{"inputs": {"n": ' + json.dumps({f"k{i}": i for i in range(10_001)}) + "}}", "keys"),
    ],
    ids=["nan", "overflow", "depth", "keys"],
)
def test_inputs_over_a_bound_are_refused_naming_it(
    api: httpx.Client, body: str, bound: str
) -> None:
    response = api.post(
        "/api/v1/workers/any/runs", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "input_invalid"
    assert error["details"][0]["limit"] == bound
    assert error["details"][0]["path"].startswith("inputs")


def test_a_string_over_the_bound_is_refused_naming_it() -> None:
    found = jsonvalues.breach_of({"s": "x" * (jsonvalues.MAX_STRING_CHARS + 1)}, where="inputs")
    assert found is not None
    assert (found.path, found.limit) == ("inputs.s", "string")


def test_a_script_whose_result_json_is_5000_brackets_ends_result_invalid(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "w",
        "name: brackets\n",
        {"run.py": "open('result.json', 'w').write('[' * 5000)\n"},
    )
    deploy_folder(api, folder)
    run = api.post("/api/v1/workers/brackets/runs", json={}).json()
    ended = wait_for_run(api, run["id"], timeout=60)
    assert ended["status"] == "failed"
    assert ended["error"]["code"] == "result_invalid", ended["error"]
    assert "64 levels" in ended["error"]["message"]


def test_an_approval_edit_over_a_bound_is_refused_before_anything_is_read(ctx: Context) -> None:
    with pytest.raises(InvalidRequest) as caught:
        approvals.decide_approval(
            ctx,
            approval_id="apr_none",
            decision="approve",
            edited={"title": _nested(70)},
            caller=SYSTEM,
        )
    assert caught.value.details[0]["limit"] == "depth"


def test_a_handoff_payload_over_a_bound_is_refused(api: httpx.Client) -> None:
    api.post("/api/v1/roles", json={"name": "reviewer"}).raise_for_status()
    response = api.post(
        "/api/v1/handoffs/jobs",
        json={"summary": "deep", "role": "reviewer", "context": {"x": _nested(70)}},
    )
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["details"][0]["limit"] == "depth"
    with pytest.raises(InvalidRequest):
        rules.encode_json({"x": float("nan")}, what="result")


@pytest.mark.parametrize(
    "body", [DEEP_LIST, '{"x": NaN}', '{"x": ' + BIG + "}"], ids=["deep", "nan", "huge-integer"]
)
def test_a_webhook_body_over_a_bound_is_refused_as_input_invalid(body: str) -> None:
    with pytest.raises(InputInvalid) as caught:
        parse_body(body.encode(), "application/json")
    assert "bound" in caught.value.message


def test_a_webhook_body_that_is_not_json_is_kept_as_text() -> None:
    assert parse_body(b'{"x": ', "application/json") == '{"x": '


def test_a_stored_value_is_shown_within_the_bounds_or_as_a_marker() -> None:
    assert jsonvalues.stored('{"a": [1, 2.5, "x"]}', expect=dict) == {"a": [1, 2.5, "x"]}
    assert jsonvalues.stored('{"a": NaN, "b": 1e400}') == {"a": "NaN", "b": "1e400"}
    for text in ("[" * 300 + "]" * 300, DEEP_LIST, '{"x": ' + BIG + "}", "{", "5"):
        shown = jsonvalues.stored(text, expect=dict)
        assert list(shown) == [jsonvalues.UNREADABLE], text[:20]
    assert jsonvalues.stored("5", expect=list) == [
        {jsonvalues.UNREADABLE: "a int was stored where a list belongs"}
    ]
    assert jsonvalues.stored_list('["a", 1]', items=str)[0] == "a"
    assert jsonvalues.stored_list('["a", 1]', items=str)[1].startswith("(floom_unreadable")


def test_a_value_written_over_a_bound_is_stored_as_a_marker() -> None:
    stored = json.loads(jsonvalues.dumps({"x": _nested(70)}, where="outputs"))
    assert list(stored) == [jsonvalues.UNREADABLE]
    assert json.loads(jsonvalues.dumps({"x": 1}, where="outputs")) == {"x": 1}


def test_an_edit_in_the_web_ui_that_trips_the_json_parser_is_a_400(
    server: LiveServer,
) -> None:
    page = signed_in_client(server, server.admin_key)
    try:
        csrf = csrf_of(page.get("/approvals").text)
        for text in (DEEP_LIST, '{"x": ' + BIG + "}"):
            # The inbox is shown again with a 400 (the message sits by a listed approval).
            form = {"csrf": csrf, "edited": text}
            response = page.post("/approvals/apr_none/approve", data=form)
            assert response.status_code == 400, response.text[-500:]
    finally:
        page.close()


@pytest.mark.parametrize(
    "args",
    [
        ["run", "any", "--input-json", DEEP_LIST],
        ["run", "any", "--input-json", '{"x": ' + BIG + "}"],
        ["approve", "apr_none", "--edit", DEEP_LIST],
        ["handoffs", "create", "s", "--role", "r", "--context", DEEP_LIST],
    ],
    ids=["run-deep", "run-huge-integer", "approve-deep", "handoff-deep"],
)
def test_a_cli_json_option_that_trips_the_parser_says_why_without_a_traceback(
    tmp_path: Path, args: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env |= {"FLOOM_BASE_URL": "http://127.0.0.1:9", "FLOOM_API_KEY": "flm_x"}
    env["FLOOM_DATA_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "floom.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode in (1, 2), (done.returncode, done.stderr[-500:])
    assert "levels" in done.stderr or "digits" in done.stderr, done.stderr[-800:]


TYPED = "name: typed\ninputs:\n  n: integer\n  x: number\n  doc: object\n"


@pytest.mark.parametrize(
    ("field", "text", "said"),
    [
        ("n", BIG, "4300 digits"),
        ("x", "1e999", "finite"),
        ("doc", DEEP_LIST, "64 levels"),
        ("doc", '{"a": ' + BIG + "}", "4300 digits"),
    ],
    ids=["huge-integer", "overflowing-number", "deep-object", "object-huge-integer"],
)
def test_a_run_form_value_that_trips_a_parser_is_a_4xx_naming_the_input(
    server: LiveServer, api: httpx.Client, tmp_path: Path, field: str, text: str, said: str
) -> None:
    deploy_folder(api, make_worker(tmp_path / "typed", TYPED, {"run.py": "print(1)\n"}))
    page = signed_in_client(server, server.admin_key)
    try:
        csrf = csrf_of(page.get("/workers/typed").text)
        response = page.post("/workers/typed/runs", data={"csrf": csrf, field: text})
        assert response.status_code == 422, response.text[-500:]
        assert said in response.text
    finally:
        page.close()
    assert api.get("/api/v1/runs").json()["items"] == []


@pytest.mark.parametrize(
    ("raw", "line", "said"),
    [
        (b"name: big\ndescription: a\x00b\n", 2, "not valid YAML at line 2: "),
        ("name: big\n".encode("utf-16"), 1, "not UTF-8 text (byte 0xff at line 1)"),
        (b"name: big\n\x1b[31m: red\n", 2, "not valid YAML at line 2: "),
    ],
    ids=["nul", "utf-16", "escape"],
)
def test_a_worker_yml_holding_a_character_yaml_refuses_is_a_problem_naming_its_line(
    api: httpx.Client, raw: bytes, line: int, said: str
) -> None:
    # PyYAML checks the characters as its loader is made, before the document is read: that
    # answered 500 to any read key's validate, and to a deploy.
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, content in (("worker.yml", raw), ("run.py", b"print(1)\n")):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    headers = {"Content-Type": "application/gzip"}
    checked = api.post("/api/v1/workers/validate", content=data.getvalue(), headers=headers)
    assert checked.status_code == 200, checked.text[:300]
    problem = checked.json()["problems"][0]
    # A file that is not UTF-8 is refused before YAML reads it (the bytes are never replaced).
    assert problem["message"].startswith(f"worker.yml is {said}"), problem
    assert f"line {line}" in problem["message"], problem
    assert problem["hint"].startswith("save worker.yml as UTF-8")
    response = api.post("/api/v1/workers", content=data.getvalue(), headers=headers)
    assert response.status_code == 400, (response.status_code, response.text[:300])
    assert response.json()["error"]["code"] == "manifest_invalid"
    assert api.get("/api/v1/workers").json()["items"] == []


NUMBERS_YML = """\
name: numbers
inputs:
  n: {type: number, default: 1}
  count: {type: integer, default: 1}
outputs:
  big: {type: number}
limits: {timeout_seconds: 30}
"""
# A number of 400 digits: JSON holds it, Python reads it as an int, and no float holds it.
BIG_NUMBER = "9" * 400


def test_a_number_no_float_holds_is_refused_as_input_and_as_output_never_a_500(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    """math.isfinite raised OverflowError on it: run inputs answered 500, and a worker whose
    result.json held one failed as floom's own error (executor_error)."""
    wrote = f"open('result.json', 'w').write('{{\"outputs\": {{\"big\": {BIG_NUMBER}}}}}')\n"
    deploy_folder(api, make_worker(tmp_path / "w", NUMBERS_YML, {"run.py": wrote}))
    url = "/api/v1/workers/numbers/runs"
    headers = {"Content-Type": "application/json"}
    refused = api.post(url, content=f'{{"inputs": {{"n": {BIG_NUMBER}}}}}', headers=headers)
    assert refused.status_code == 422, refused.text[:300]
    assert refused.json()["error"]["code"] == "input_invalid"
    assert "input 'n': expected number" in refused.json()["error"]["message"]
    # An integer input has no such bound (it is never a float); nor a number a float holds.
    body = f'{{"inputs": {{"count": {BIG_NUMBER}, "n": 1e300}}}}'
    run = server.client().post(url, content=body, headers=headers)
    assert run.status_code == 202, run.text[:300]
    ended = wait_for_run(api, run.json()["id"], timeout=60)
    assert ended["status"] == "failed"
    assert ended["error"]["code"] == "outputs_invalid", ended["error"]
    assert "outputs.big: expected number" in ended["error"]["message"]


def test_an_eval_compares_an_output_no_float_holds_exactly_never_raising() -> None:
    from floom.services.replays.diff import output_equal

    huge = int(BIG_NUMBER)
    tolerance = {"tolerance": 0.5}
    assert output_equal(tolerance, huge, huge)
    assert not output_equal(tolerance, huge, huge - 1)
    assert not output_equal(tolerance, huge, 1.5)
    assert output_equal(tolerance, 1, 1.25)
