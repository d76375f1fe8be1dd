"""The test session's name-lookup guard reaches the floom servers tests start as processes:
a name /etc/hosts does not hold is not asked of the machine's name server there either."""

from __future__ import annotations

import base64
from pathlib import Path

from tests.support.guarded_site.sitecustomize import REFUSED
from tests.support.processes.server_process import ServerProcess

KEY = "whsec_" + base64.b64encode(b"k" * 32).decode()


def test_a_server_process_s_lookup_of_a_name_outside_etc_hosts_fails_at_once(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "d", "")
    try:
        server.start()
        with server.client() as api:
            assert api.put("/api/v1/secrets/HOOK_KEY", json={"value": KEY}).status_code == 200
            # Saving a webhook channel resolves its host (the egress guard), in the server.
            config = {"url": "https://hooks.example.com/floom", "secret": "HOOK_KEY"}
            resp = api.post(
                "/api/v1/alerts/channels", json={"name": "ops", "kind": "webhook", "config": config}
            )
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["code"] == "alert_channel_invalid"
        assert f"cannot resolve hooks.example.com: {REFUSED}" in error["message"], error
    finally:
        server.stop()
