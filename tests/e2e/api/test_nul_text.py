"""A NUL character (U+0000) that a worker prints or a caller sends is stored as U+FFFD on
both databases: PostgreSQL refuses text holding one, which lost the run of a worker that
printed one and answered 500 to a caller that sent one in an id or a filter. A name holding
one is refused (test_caller_names)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run

PRINTS_NUL = """\
import json, sys
sys.stdout.write("before\\x00after\\n")
sys.stdout.flush()
json.dump({"outputs": {"said": "a\\x00b"}, "error": "bad\\x00thing"}, open("result.json", "w"))
sys.exit(1)
"""


def test_a_worker_printing_nul_ends_with_its_own_error_and_its_log_kept(
    api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "w", "name: nul\n", {"run.py": PRINTS_NUL}))
    run = wait_for_run(api, api.post("/api/v1/workers/nul/runs", json={}).json()["id"])
    assert run["status"] == "failed", run
    assert run["error"]["code"] == "worker_error", run["error"]
    assert "bad\ufffdthing" in run["error"]["message"], run["error"]
    lines = [e["line"] for e in api.get(f"/api/v1/runs/{run['id']}/logs").json()["items"]]
    assert "before\ufffdafter" in lines, lines


def test_a_nul_in_a_caller_s_name_id_or_filter_is_never_a_500(
    server: LiveServer, api: httpx.Client
) -> None:
    # A name is refused (test_caller_names), not kept in another form than the answer says.
    made = api.post("/api/v1/keys", json={"scopes": ["read"], "name": "a\x00b"})
    assert made.status_code == 400, made.text
    for path in (
        "/api/v1/runs/a%00b",
        "/api/v1/workers/a%00b",
        "/api/v1/workers/a%00b/versions",
        "/api/v1/handoffs/jobs/a%00b",
        "/api/v1/approvals/a%00b",
        "/api/v1/deliveries/a%00b",
    ):
        assert api.get(path).status_code == 404, path
    for path, params in (
        ("/api/v1/runs", {"worker": "a\x00b"}),
        ("/api/v1/runs", {"cursor": "a\x00b"}),
        ("/api/v1/audit", {"cursor": "a\x00b"}),
        ("/api/v1/audit", {"actor": "a\x00b"}),
        ("/api/v1/approvals", {"worker": "a\x00b"}),
        ("/api/v1/handoffs/jobs", {"cursor": "a\x00b"}),
    ):
        resp = api.get(path, params=params)
        assert resp.status_code < 500, (path, params, resp.status_code, resp.text[:200])
