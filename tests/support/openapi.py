"""The seeded server the OpenAPI contract tests send their requests to."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path

import httpx
from standardwebhooks import Webhook

from floom.services.alerts import incidents
from floom.store.db import session_scope
from floom.vocabulary import DeliveryPurpose, DeliveryStatus
from tests.support.harness import EXAMPLES, LiveServer, deploy_folder, make_worker, wait_until

HOOK_SECRET = "whsec_" + base64.b64encode(b"contract-hook-secret-0123456789").decode()
GATED = """\
name: gated
title: Gated
description: Waits for a person to approve its outputs.
inputs:
  who: {type: string, default: world}
  event: object
outputs:
  greeting: string
approvals: {required: true}
triggers:
  - schedule: {cron: "0 9 * * 1", timezone: Europe/Berlin}
  - webhook: {secret: CONTRACT_HOOK}
"""
GATED_RUN = """\
import json, pathlib
pathlib.Path("result.json").write_text(json.dumps({"outputs": {"greeting": "hi"}}))
"""


def seed_contract(server: LiveServer, api: httpx.Client, tmp: Path) -> dict[str, str]:
    """A script run with an artifact, a gated run awaiting approval, two versions, triggers,
    a webhook delivery, a secret, a key, a role, an agent and a handoff job."""
    api.put("/api/v1/secrets/CONTRACT_HOOK", json={"value": HOOK_SECRET}).raise_for_status()
    deploy_folder(api, EXAMPLES / "hello")
    gated = tmp / "gated"
    make_worker(gated, GATED, {"run.py": GATED_RUN})
    first = deploy_folder(api, gated)
    make_worker(gated, GATED.replace("Gated", "Gated worker"), {"run.py": GATED_RUN})
    deploy_folder(api, gated)

    hello_run = api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "x"}}).json()
    body = b'{"who": "hook"}'
    at = datetime.now(UTC)
    signed = {
        "webhook-id": "msg_contract",
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(HOOK_SECRET).sign("msg_contract", at, body.decode()),
        "content-type": "application/json",
    }
    delivery = httpx.post(f"{server.base_url}/hooks/gated", content=body, headers=signed)
    assert delivery.status_code == 202, delivery.text
    gated_run = api.post("/api/v1/workers/gated/runs", json={}).json()

    def ended(run_id: str, statuses: set[str]) -> bool:
        return api.get(f"/api/v1/runs/{run_id}").json()["status"] in statuses

    wait_until(lambda: ended(hello_run["id"], {"succeeded"}), timeout=60)
    wait_until(lambda: ended(gated_run["id"], {"awaiting_approval"}), timeout=60)
    approval = api.get("/api/v1/approvals", params={"run_id": gated_run["id"]}).json()
    key = api.post("/api/v1/keys", json={"scopes": ["read"], "name": "contract"}).json()
    api.post("/api/v1/roles", json={"name": "reviewer"}).raise_for_status()
    agent = api.post("/api/v1/agents", json={"label": "contract-agent", "roles": ["reviewer"]})
    job = api.post("/api/v1/handoffs/jobs", json={"summary": "check it", "role": "reviewer"})
    # An alert delivery to a channel that no longer exists: listed, read, re-sent; never sent.
    with session_scope(server.ctx.engine, write=True) as s:
        alert = incidents.enqueue(
            server.ctx, s, purpose=DeliveryPurpose.TEST, body={"type": "test", "summary": "seeded"}
        )
        alert.status, alert.channel_name = DeliveryStatus.FAILED, "gone"
    return {
        "name": "gated",
        "version_id": first["version"]["id"],
        "run_id": hello_run["id"],
        "approval_id": approval["items"][0]["id"],
        "delivery_id": delivery.json()["delivery_id"],
        # No eval exists here (evals need agent runs): its documented 404 is checked.
        "eval_id": "evl_none",
        "key_id": key["id"],
        "role": "reviewer",
        "agent": agent.json()["id"],
        "job_id": job.json()["id"],
        "alert_delivery_id": alert.id,
    }
