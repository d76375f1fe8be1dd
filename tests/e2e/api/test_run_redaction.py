"""Secrets a worker writes into artifact names, text artifacts and long log lines are redacted
before anything is stored; a run's log is bounded in bytes. On SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import httpx

from floom.engine.runlog import RunLog
from floom.services.access.secrets import Redactor
from tests.support.harness import deploy_folder, live_server, make_worker, wait_for_run
from tests.support.rigs.agents import log_lines

TOKEN = "Zq9sEcReT-4f1d-bb27-token-value"  # 30 characters, nothing like the padding


def _run(api: httpx.Client, tmp_path: Path, script: str) -> dict[str, object]:
    folder = make_worker(
        tmp_path / "leaky", "name: leaky\nsecrets: [LEAK_TOKEN]\n", {"run.py": script}
    )
    deploy_folder(api, folder)
    assert api.put("/api/v1/secrets/LEAK_TOKEN", json={"value": TOKEN}).status_code == 200
    run_id = api.post("/api/v1/workers/leaky/runs", json={}).json()["id"]
    run = wait_for_run(api, run_id)
    assert run["status"] == "succeeded", run
    return run


ARTIFACTS_PY = """\
import os
tok, out = os.environ["LEAK_TOKEN"], os.environ["FLOOM_OUTPUT_DIR"]
open(f"{out}/report-{tok}.txt", "w").write(f"token={tok}\\n")
open(f"{out}/blob.bin", "wb").write(b"\\0\\1" + tok.encode())
"""


def test_a_secret_in_an_artifacts_name_or_text_is_redacted_and_in_a_binary_one_masked_in_place(
    api: httpx.Client, tmp_path: Path
) -> None:
    run = _run(api, tmp_path, ARTIFACTS_PY)

    names = [a["name"] for a in cast(list[dict[str, Any]], run["artifacts"])]
    assert names == ["blob.bin", "report-***.txt"]
    listed = api.get(f"/api/v1/runs/{run['id']}/artifacts").text
    shown = api.get(f"/api/v1/runs/{run['id']}").text
    assert TOKEN not in listed
    assert TOKEN not in shown
    text = api.get(f"/api/v1/runs/{run['id']}/artifacts/report-***.txt")
    assert text.status_code == 200
    assert text.text == "token=***\n"
    binary = api.get(f"/api/v1/runs/{run['id']}/artifacts/blob.bin").content
    assert binary == b"\0\1" + b"*" * len(TOKEN)


def test_a_secret_straddling_the_16_kib_cut_of_a_log_line_leaves_no_part_of_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    script = (
        "import os\n"
        "print('x' * (16 * 1024 - 6) + os.environ['LEAK_TOKEN'] + ' and more', flush=True)\n"
    )
    run = _run(api, tmp_path, script)

    lines = log_lines(api, str(run["id"]))
    (long_line,) = [line for line in lines if line.startswith("xxxx")]
    assert TOKEN[:6] not in long_line
    assert long_line.startswith("x" * (16 * 1024 - 6) + "***")
    assert long_line.endswith(" [line truncated at 16384 characters]")


def test_a_secret_cut_by_the_sandboxs_line_limit_is_masked_once_the_line_shrinks(
    api: httpx.Client, tmp_path: Path
) -> None:
    # 10 + 2300 * 30 characters: the sandbox cuts this line inside a copy of the secret;
    # redacted, the rest is short enough to keep whole, with the cut copy's start at its end.
    script = "import os\nprint('a' * 10 + os.environ['LEAK_TOKEN'] * 2300, flush=True)\n"
    run = _run(api, tmp_path, script)

    lines = log_lines(api, str(run["id"]))
    (long_line,) = [line for line in lines if line.startswith("aaaa")]
    assert TOKEN[:4] not in long_line
    assert long_line.startswith("a" * 10 + "***")


def test_a_runs_log_stops_at_its_byte_quota_with_one_line_saying_so(
    tmp_path: Path, database_url: str
) -> None:
    script = "for i in range(1000):\n    print(f'{i:04} ' + 'y' * 95)\n"
    with (
        live_server(tmp_path / "data", database_url, max_log_bytes_per_run=20_000) as srv,
        srv.client() as api,
    ):
        deploy_folder(api, make_worker(tmp_path / "chatty", "name: chatty\n", {"run.py": script}))
        run = wait_for_run(api, api.post("/api/v1/workers/chatty/runs", json={}).json()["id"])
        events = api.get(f"/api/v1/runs/{run['id']}/logs", params={"limit": 1000}).json()

    assert run["status"] == "succeeded", run
    items = events["items"]
    printed = [e["line"] for e in items if e["stream"] == "stdout"]
    assert 150 <= len(printed) < 200
    assert sum(len(line) + 1 for line in printed) <= 20_000
    notes = [e["line"] for e in items if "log limit of 20000 bytes reached" in e["line"]]
    assert notes == [
        "log limit of 20000 bytes reached; dropping further lines (FLOOM_MAX_LOG_BYTES_PER_RUN)"
    ]


def test_a_runs_log_stops_at_its_line_quota_with_one_line_naming_the_setting() -> None:
    run_log = RunLog(
        run_id="run_x", attempt=1, redactor=Redactor([]), max_lines=3, max_bytes=10_000
    )
    for i in range(10):
        run_log.add("stdout", f"line {i}")

    kept = [(stream, line) for stream, line, _ in run_log.drain()]
    assert kept == [
        ("stdout", "line 0"),
        ("stdout", "line 1"),
        ("stdout", "line 2"),
        (
            "system",
            "log limit of 3 lines reached; dropping further lines (FLOOM_MAX_LOG_LINES_PER_RUN)",
        ),
    ]
