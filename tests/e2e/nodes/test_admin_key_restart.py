"""The admin key across restarts: revoking it (bootstrap or generated) never stops the next
start, and a revoked key never comes back to life."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from floom.api.app import create_app
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from tests.support.harness import fast_settings

BOOTSTRAP = "flm_bootstrap-token-for-restart-tests-0123456789"


def _start(data_dir: Path, database_url: str, **overrides: object) -> tuple[Context, TestClient]:
    # API role only: these tests are about start-up, not about running workers.
    settings = fast_settings(data_dir, database_url, roles="api", **overrides)
    ctx = Context.open(settings)
    return ctx, TestClient(create_app(ctx=ctx))


def _whoami_status(client: TestClient, token: str) -> int:
    return client.get("/api/v1/workers", headers={"Authorization": f"Bearer {token}"}).status_code


def test_a_revoked_bootstrap_key_stays_revoked_and_the_next_start_writes_a_fresh_admin_key(
    tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    ctx, client = _start(data, database_url, bootstrap_api_key=BOOTSTRAP)
    with client:
        assert _whoami_status(client, BOOTSTRAP) == 200
        (bootstrap_key,) = [k for k in keys.list_keys(ctx, caller=SYSTEM) if k.name == "bootstrap"]
        revoked = client.delete(
            f"/api/v1/keys/{bootstrap_key.id}",
            headers={"Authorization": f"Bearer {BOOTSTRAP}"},
        )
        assert revoked.status_code == 200, revoked.text
    ctx.engine.dispose()
    assert not (data / "admin.key").exists()

    with caplog.at_level(logging.WARNING, logger="floom.keys"):
        ctx, client = _start(data, database_url, bootstrap_api_key=BOOTSTRAP)
        with client:
            fresh = (data / "admin.key").read_text().strip()
            assert _whoami_status(client, BOOTSTRAP) == 401
            assert _whoami_status(client, fresh) == 200
    ctx.engine.dispose()
    assert "FLOOM_BOOTSTRAP_API_KEY is a revoked API key" in caplog.text
    assert BOOTSTRAP not in caplog.text
    assert fresh not in caplog.text
    assert (data / "admin.key").stat().st_mode & 0o777 == 0o600


def test_a_revoked_generated_admin_key_is_replaced_at_the_next_start_and_stays_revoked(
    tmp_path: Path, database_url: str
) -> None:
    data = tmp_path / "data"
    ctx, client = _start(data, database_url)
    with client:
        first = (data / "admin.key").read_text().strip()
        (generated,) = keys.list_keys(ctx, caller=SYSTEM)
        keys.revoke_key(ctx, caller=SYSTEM, key_id=generated.id)
    ctx.engine.dispose()

    ctx, client = _start(data, database_url)
    with client:
        second = (data / "admin.key").read_text().strip()
        assert second != first
        assert _whoami_status(client, first) == 401
        assert _whoami_status(client, second) == 200
    ctx.engine.dispose()

    # A third start with a live admin key changes nothing.
    ctx, client = _start(data, database_url)
    with client:
        assert (data / "admin.key").read_text().strip() == second
        assert len(keys.list_keys(ctx, caller=SYSTEM)) == 2
    ctx.engine.dispose()
