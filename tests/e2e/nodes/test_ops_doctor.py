"""`floom doctor` checks a node and says how to fix what fails: a healthy node passes, a
secret key that does not match the stored secrets fails with its fix and exit code 1."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from floom.config import Settings
from floom.hints.cli import written
from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.ops.doctor import FAIL, OK, check_database, check_secret_key, run_checks
from tests.support.harness import REPO, fast_settings
from tests.support.ports import free_port


def test_a_healthy_node_passes_every_check(tmp_path: Path, database_url: str) -> None:
    settings = fast_settings(tmp_path / "data", database_url)
    ctx = Context.open(settings)
    secrets.set_secret(ctx, caller=SYSTEM, name="TOKEN", value="value-1234")
    ctx.engine.dispose()
    checks = {c.name: c for c in run_checks(settings)}
    assert checks["database"].status == OK
    assert checks["secret key"].status == OK
    assert checks["bubblewrap"].status == OK
    assert checks["sandbox local"].status in {OK, "warn"}
    assert all(c.status != FAIL for c in checks.values()), checks


def test_a_secret_key_that_cannot_read_the_stored_secrets_fails_with_its_fix(
    tmp_path: Path, database_url: str
) -> None:
    ctx = Context.open(fast_settings(tmp_path / "data", database_url))
    secrets.set_secret(ctx, caller=SYSTEM, name="TOKEN", value="value-1234")
    ctx.engine.dispose()
    wrong = fast_settings(tmp_path / "data", database_url, secret_key="another-key")
    check = check_secret_key(wrong)
    assert check.status == FAIL
    assert "FLOOM_SECRET_KEY" in written(check.fix)


def test_an_unmigrated_database_fails_the_database_check(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('0001')")
    check = check_database(Settings(data_dir=tmp_path, database_url=f"sqlite:///{db}"))
    assert check.status == FAIL
    assert "floom serve" in written(check.fix)


def test_the_cli_prints_each_check_and_exits_1_when_one_fails(tmp_path: Path) -> None:
    ctx = Context.open(fast_settings(tmp_path / "data", f"sqlite:///{tmp_path / 'data/floom.db'}"))
    secrets.set_secret(ctx, caller=SYSTEM, name="TOKEN", value="value-1234")
    ctx.engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env.update(
        PYTHONPATH=str(REPO), FLOOM_DATA_DIR=str(tmp_path / "data"), FLOOM_SECRET_KEY="wrong"
    )
    done = subprocess.run(
        [sys.executable, "-m", "floom.cli", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL secret key" in done.stdout
    assert "fix:" in done.stdout
    assert "ok   database" in done.stdout


def test_a_database_that_cannot_be_opened_fails_with_the_drivers_reason_and_no_password(
    tmp_path: Path,
) -> None:
    url = f"postgresql+psycopg://floom:s3cret-pw@127.0.0.1:{free_port()}/floom"
    check = check_database(Settings(data_dir=tmp_path, database_url=url))
    assert check.status == FAIL
    assert "OperationalError: " in check.detail, check.detail
    assert "refused" in check.detail, check.detail
    assert "s3cret-pw" not in check.detail
    assert "floom:***@" in check.detail
