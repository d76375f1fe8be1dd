"""The trigger commands of `floom`, run as a subprocess against a live server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from floom.triggers.signatures import sign_floom
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run

SECRET = "cli-hook-secret-789"
MANIFEST = """name: hooked
inputs: {event: object}
triggers:
  - schedule: {cron: "0 9 * * 0", timezone: Asia/Tokyo}
  - webhook: {signature: hmac-sha256, secret: CLI_HOOK_SECRET}
"""
SCRIPT = 'import json\njson.dump({"outputs": {}}, open("result.json", "w"))\n'


def floom(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "floom.cli", *args],
        env=server.cli_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_triggers_pause_resume_run_force_and_deliveries_from_the_command_line(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "hooked", MANIFEST, {"run.py": SCRIPT}))
    api.put("/api/v1/secrets/CLI_HOOK_SECRET", json={"value": SECRET})

    listing = floom(server, "triggers", "hooked")
    assert listing.returncode == 0, listing.stderr
    assert "0 9 * * 0" in listing.stdout
    assert "(Asia/Tokyo)" in listing.stdout
    assert listing.stdout.count("T09:00:00+09:00") == 3
    assert f"POST {server.base_url}/hooks/hooked" in listing.stdout

    assert floom(server, "pause", "hooked").returncode == 0
    refused = floom(server, "run", "hooked", "--input-json", "{}")
    assert refused.returncode == 1
    assert "is paused" in refused.stderr
    assert "--force" in refused.stderr
    forced = floom(server, "run", "hooked", "--input-json", "{}", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["trigger"] == "manual"
    assert floom(server, "resume", "hooked").returncode == 0

    schedule_id = api.get("/api/v1/workers/hooked/triggers").json()["items"][0]["id"]
    one = floom(server, "pause", "hooked", "--trigger", schedule_id)
    assert one.returncode == 0
    assert f"trigger {schedule_id} of hooked paused" in one.stdout
    assert "paused" in floom(server, "triggers", "hooked").stdout

    body = b'{"alert": "disk"}'
    headers = sign_floom(secret=SECRET, body=body, timestamp=int(time.time()))
    headers["X-Floom-Delivery"] = "alert-1"
    sent = httpx.post(f"{server.base_url}/hooks/hooked", content=body, headers=headers)
    assert sent.status_code == 202, sent.text
    wait_for_run(api, sent.json()["run_id"])

    deliveries = floom(server, "deliveries", "hooked")
    assert deliveries.returncode == 0
    assert sent.json()["delivery_id"] in deliveries.stdout
    assert "alert-1" in deliveries.stdout
    replayed = floom(server, "replay-delivery", sent.json()["delivery_id"], "--wait")
    assert replayed.returncode == 0, replayed.stderr
    assert "succeeded" in replayed.stdout
