"""Bidi overrides and isolates a worker writes (worker.yml's title and description, its
result's error, its log lines) reach the web UI's pages in a visible form (`\\u202e`): a raw
one reorders the text after it, and in a worker's title showed the worker's name reversed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.web import signed_in_client

YML = """\
name: spoof
title: "Deploy \\u202e"
description: "Ships \\u2067it\\u2069 and more"
"""
PY = r"""
import json
print("log \u202eenil")
print("hid\u200bden \u200fmark")
json.dump({"error": "bad \u202dthing", "retryable": False}, open("result.json", "w"))
"""
RAW = (
    *("\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"),
    *("\u200b", "\u200f", "\u2060", "\ufeff"),
)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_bidi_controls_a_worker_writes_show_escaped_on_every_page(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "spoof", YML, {"run.py": PY}))
    run_id = api.post("/api/v1/workers/spoof/runs", json={}).json()["id"]
    assert wait_for_run(api, run_id)["status"] == "failed"
    web = signed_in_client(server, server.admin_key)
    shown = {}
    for path in ["/workers/spoof", "/", f"/runs/{run_id}", "/runs"]:
        resp = web.get(path)
        assert resp.status_code == 200, (path, resp.text)
        for char in RAW:
            assert char not in resp.text, (path, hex(ord(char)))
        shown[path] = resp.text
    assert "Deploy \\u202e" in shown["/workers/spoof"]
    assert "Ships \\u2067it\\u2069 and more" in shown["/workers/spoof"]
    assert "bad \\u202dthing" in shown[f"/runs/{run_id}"]
    assert "log \\u202eenil" in shown[f"/runs/{run_id}"]
    assert "hid\\u200bden \\u200fmark" in shown[f"/runs/{run_id}"]
