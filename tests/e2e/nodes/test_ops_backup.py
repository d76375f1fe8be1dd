"""`floom backup` and `floom restore`: an online copy of a SQLite node, restored into a fresh
data dir, gives back every run with its logs, outputs and artifacts."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from floom.config import Settings
from floom.errors import BackupInvalid, Conflict, InvalidRequest
from floom.services.access.principal import SYSTEM
from floom.services.access.secrets import set_secret
from floom.services.context import Context
from floom.services.ops.backup import MANIFEST, create_backup, restore_backup
from tests.support.harness import (
    REPO,
    deploy_folder,
    fast_settings,
    live_server,
    make_worker,
    wait_for_run,
)

MANIFEST_YML = """\
name: keeper
inputs:
  word: {type: string, required: true}
outputs:
  echoed: {type: string}
secrets: [KEEPER_TOKEN]
"""
RUN_PY = """\
import json, os
from pathlib import Path
inputs = json.load(open("inputs.json"))
print("saying", inputs["word"], flush=True)
ok = os.environ["KEEPER_TOKEN"] == "tok-1234"
Path(os.environ["FLOOM_OUTPUT_DIR"], "note.txt").write_text("note " + inputs["word"])
Path("result.json").write_text(json.dumps({"outputs": {"echoed": inputs["word"] + str(ok)}}))
"""


def _sqlite_node(data_dir: Path, **overrides: Any) -> Settings:
    """A node's settings, its SQLite database in its data dir."""
    return fast_settings(data_dir, f"sqlite:///{data_dir / 'floom.db'}", **overrides)


def _new_node(data_dir: Path) -> Settings:
    """A node's settings, its data dir and database made (opened once and closed)."""
    settings = _sqlite_node(data_dir)
    Context.open(settings).engine.dispose()
    return settings


def _everything(api: httpx.Client) -> dict[str, Any]:
    """Every run as the API shows it: the run, its log lines and its artifacts' bytes."""
    runs = api.get("/api/v1/runs", params={"limit": 100}).json()["items"]
    seen = {}
    for run in runs:
        rid = run["id"]
        detail = api.get(f"/api/v1/runs/{rid}").json()
        logs = api.get(f"/api/v1/runs/{rid}/logs").json()["items"]
        files = {
            a["name"]: api.get(f"/api/v1/runs/{rid}/artifacts/{a['name']}").content
            for a in api.get(f"/api/v1/runs/{rid}/artifacts").json()["items"]
        }
        seen[rid] = {
            "status": detail["status"],
            "outputs": detail["outputs"],
            "logs": [(e["seq"], e["stream"], e["line"]) for e in logs],
            "artifacts": files,
        }
    return seen


def test_a_backup_taken_while_serving_restores_every_run_into_a_fresh_data_dir(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'a' / 'floom.db'}"
    with live_server(tmp_path / "a", url) as node, node.client() as api:
        api.put("/api/v1/secrets/KEEPER_TOKEN", json={"value": "tok-1234"}).raise_for_status()
        deploy_folder(api, make_worker(tmp_path / "w", MANIFEST_YML, {"run.py": RUN_PY}))
        for word in ("one", "two"):
            run = api.post("/api/v1/workers/keeper/runs", json={"inputs": {"word": word}})
            wait_for_run(api, run.json()["id"])
        before = _everything(api)
        summary = create_backup(settings=node.ctx.settings, dest=tmp_path / "backup")

    assert summary.counts["runs"] == 2
    assert summary.counts["secrets"] == 1
    assert (tmp_path / "backup" / MANIFEST).is_file()
    # The serving node's lock on its data dir is a fact of that process, not of the data.
    assert (tmp_path / "a" / "node.lock").exists()
    assert "node.lock" not in summary.files
    assert not (tmp_path / "backup" / "node.lock").exists()
    fresh = tmp_path / "b"
    restored = restore_backup(
        settings=_sqlite_node(fresh),
        source=tmp_path / "backup",
    )
    assert restored.counts == summary.counts
    with live_server(fresh, f"sqlite:///{fresh / 'floom.db'}") as node, node.client() as api:
        after = _everything(api)
        assert after == before
        assert {r["outputs"]["echoed"] for r in after.values()} == {"oneTrue", "twoTrue"}
        assert all(r["artifacts"] for r in after.values())
        # The stored secret is readable with the restored key: a run that uses it works.
        again = api.post("/api/v1/workers/keeper/runs", json={"inputs": {"word": "x"}})
        assert wait_for_run(api, again.json()["id"])["outputs"] == {"echoed": "xTrue"}


def test_restore_refuses_a_data_dir_that_is_not_empty_and_changes_nothing(
    tmp_path: Path,
) -> None:
    source = _new_node(tmp_path / "a")
    create_backup(settings=source, dest=tmp_path / "backup")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    target = _sqlite_node(busy)
    with pytest.raises(Conflict) as refused:
        restore_backup(settings=target, source=tmp_path / "backup")
    assert "--force" in (refused.value.hint or "")
    assert sorted(p.name for p in busy.iterdir()) == ["keep.txt"]
    restore_backup(settings=target, source=tmp_path / "backup", force=True)
    assert (busy / "floom.db").is_file()


def test_a_damaged_backup_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    source = _new_node(tmp_path / "a")
    create_backup(settings=source, dest=tmp_path / "backup")
    with (tmp_path / "backup" / "floom.db").open("r+b") as f:
        f.seek(200)
        f.write(b"\x00garbage")
    fresh = tmp_path / "fresh"
    with pytest.raises(BackupInvalid):
        restore_backup(
            settings=_sqlite_node(fresh),
            source=tmp_path / "backup",
        )
    assert not fresh.exists()
    with pytest.raises(BackupInvalid):
        restore_backup(settings=_sqlite_node(fresh), source=tmp_path)
    with pytest.raises(Conflict):
        create_backup(settings=source, dest=tmp_path / "backup")


def test_a_backup_naming_a_file_or_object_outside_its_place_is_refused_writing_nothing(
    tmp_path: Path,
) -> None:
    # A backup is an archive like any other: a name whose ".." stays inside the backup yet
    # lands outside the data dir, or an object whose name would be another key of the
    # bucket, is refused before anything is written.
    source = _new_node(tmp_path / "a")
    backup = tmp_path / "backup"
    create_backup(settings=source, dest=backup)
    (backup / "evil").write_text("planted")
    (backup / "x").mkdir()
    (backup / "objects").mkdir(exist_ok=True)
    (backup / "objects" / "evil").write_text("planted")
    original = json.loads((backup / MANIFEST).read_text())
    fresh = tmp_path / "fresh"
    for name in (
        f"x/../../{backup.name}/evil",  # inside the backup, outside the data dir
        "objects/../objects/evil",
        "objects/evil/..",
        "./evil",
        "",
    ):
        manifest = json.loads(json.dumps(original))
        manifest["summary"]["files"].append(name)
        path = (backup / name).resolve()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "0"
        manifest["sha256"][name] = digest
        (backup / MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(BackupInvalid) as refused:
            restore_backup(settings=_sqlite_node(fresh), source=backup)
        assert "unexpected file" in refused.value.message, name
        assert not fresh.exists(), name
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "backup"], name


def test_backup_of_a_postgresql_store_points_to_pg_dump(tmp_path: Path) -> None:
    settings = fast_settings(tmp_path, "postgresql+psycopg://postgres@127.0.0.1:5432/none")
    with pytest.raises(InvalidRequest) as refused:
        create_backup(settings=settings, dest=tmp_path / "backup")
    assert "pg_dump" in (refused.value.hint or "")


def test_the_cli_backs_up_one_node_and_restores_it_into_another_data_dir(
    tmp_path: Path,
) -> None:
    Context.open(Settings(data_dir=tmp_path / "a", deploy_examples=False)).engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env["PYTHONPATH"] = str(REPO)

    def floom(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "floom.cli", *args],
            env={**env, "FLOOM_DATA_DIR": str(data_dir)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    made = floom(tmp_path / "a", "backup", str(tmp_path / "bk"), "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["secret_key_in_backup"] is True
    back = floom(tmp_path / "b", "restore", str(tmp_path / "bk"))
    assert back.returncode == 0, back.stderr
    assert (tmp_path / "b" / "secret.key").read_bytes() == (
        tmp_path / "a" / "secret.key"
    ).read_bytes()
    assert not (tmp_path / "b" / "node.id").exists()


def test_a_forced_restore_never_writes_through_a_link_the_data_dir_holds(tmp_path: Path) -> None:
    # A forced restore goes into a data dir that holds what its node left (run dirs, what
    # workers left, among them): a link there where the backup puts a file is refused before
    # anything is written, not followed out of the data dir.
    source = _new_node(tmp_path / "a")
    (tmp_path / "a" / "extra").mkdir()
    (tmp_path / "a" / "extra" / "notes.txt").write_text("from the backup")
    (tmp_path / "a" / "top.txt").write_text("from the backup")
    create_backup(settings=source, dest=tmp_path / "backup")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "top.txt").write_text("outside")
    for link, points_to in (("extra", outside), ("top.txt", outside / "top.txt")):
        busy = tmp_path / f"busy-{link}"
        busy.mkdir()
        (busy / link).symlink_to(points_to)
        target = _sqlite_node(busy)
        with pytest.raises(BackupInvalid) as refused:
            restore_backup(settings=target, source=tmp_path / "backup", force=True)
        assert "as a link" in refused.value.message
        assert sorted(p.name for p in busy.iterdir()) == [link]
        assert sorted(p.name for p in outside.iterdir()) == ["top.txt"]
        assert (outside / "top.txt").read_text() == "outside"


def test_a_backup_naming_the_database_a_node_file_or_a_run_dir_is_refused(tmp_path: Path) -> None:
    source = _new_node(tmp_path / "a")
    backup = tmp_path / "backup"
    create_backup(settings=source, dest=backup)
    (backup / "runs" / "run_x").mkdir(parents=True)
    (backup / "runs" / "run_x" / "f").write_text("planted")
    (backup / "node.id").write_text("planted")
    original = json.loads((backup / MANIFEST).read_text())
    fresh = tmp_path / "fresh"
    for name in ("floom.db", "node.id", "runs/run_x/f"):
        manifest = json.loads(json.dumps(original))
        manifest["summary"]["files"].append(name)
        manifest["sha256"][name] = hashlib.sha256((backup / name).read_bytes()).hexdigest()
        (backup / MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(BackupInvalid) as refused:
            restore_backup(settings=_sqlite_node(fresh), source=backup)
        assert "unexpected file" in refused.value.message, name
        assert not fresh.exists(), name


def _rechecked(backup: Path) -> None:
    """Make the backup's manifest agree with its files again (as a crafted backup would)."""
    manifest = json.loads((backup / MANIFEST).read_text())
    for name in ["floom.db", *manifest["summary"]["files"]]:
        manifest["sha256"][name] = hashlib.sha256((backup / name).read_bytes()).hexdigest()
    (backup / MANIFEST).write_text(json.dumps(manifest))


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _executing(*statements: str) -> Callable[[Path], None]:
    """A damage to a backup: `statements` run in its database and committed."""

    def damage(db: Path) -> None:
        with closing(sqlite3.connect(db)) as conn, conn:
            for statement in statements:
                conn.execute(statement)

    return damage


def test_a_backup_whose_database_cannot_be_restored_changes_nothing(tmp_path: Path) -> None:
    # All or nothing: a backup whose files match their checksums but whose database is not
    # floom's (not a database, a table missing, row counts other than its manifest's) is
    # refused with one clear line naming it, and the data dir is left as it was: absent for
    # a fresh restore, every byte the same for a forced one.
    source = _new_node(tmp_path / "a")
    (tmp_path / "a" / "extra").mkdir()
    (tmp_path / "a" / "extra" / "notes.txt").write_text("from the backup")
    good = tmp_path / "good"
    create_backup(settings=source, dest=good)
    busy = tmp_path / "busy"
    _new_node(busy)
    (busy / "mine.txt").write_text("mine")
    before = _tree(busy)

    def not_a_database(db: Path) -> None:
        db.write_bytes(b"not a database" * 100)

    def a_table_without_its_unique_keys(db: Path) -> None:
        # The same name and columns, without the unique keys that refuse a replayed webhook
        # delivery: the restored node would start a run for every replay.
        with closing(sqlite3.connect(db)) as conn, conn:
            (sql,) = conn.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'webhook_deliveries'"
            ).fetchone()
            loose = re.sub(r",\s*UNIQUE \([^)]*\)", "", sql)
            assert "UNIQUE" not in loose
            conn.execute("ALTER TABLE webhook_deliveries RENAME TO old_deliveries")
            conn.execute(loose)
            conn.execute("INSERT INTO webhook_deliveries SELECT * FROM old_deliveries")
            conn.execute("DROP TABLE old_deliveries")
            conn.execute(
                "CREATE INDEX ix_webhook_deliveries_worker ON webhook_deliveries (worker_name, id)"
            )

    # Each damage done to a copy of the good backup, and what the refusal says of it.
    damages: dict[str, tuple[Callable[[Path], None], str]] = {
        "a_table_without_its_unique_keys": (
            a_table_without_its_unique_keys,
            "table 'webhook_deliveries', which is not as floom defines it",
        ),
        "an_index_redefined": (
            _executing(
                "DROP INDEX ix_runs_queue",
                "CREATE INDEX ix_runs_queue ON runs (status, not_before) WHERE 0",
            ),
            "index 'ix_runs_queue', which is not as floom defines it",
        ),
        "an_index_dropped": (
            _executing("DROP INDEX ix_runs_lease"),
            "lacks the index 'ix_runs_lease'",
        ),
        "a_generated_column": (
            _executing(
                "ALTER TABLE secrets ADD COLUMN shown TEXT GENERATED ALWAYS AS (hex(ciphertext))"
            ),
            "table 'secrets', which is not as floom defines it",
        ),
        "not_a_database": (not_a_database, "is not a floom database"),
        "a_table_missing": (_executing("DROP TABLE runs"), "no such table"),
        "counts_lie": (
            _executing(
                "INSERT INTO secrets (name, ciphertext, created_at, updated_at) "
                "VALUES ('PLANTED', x'00', '2026-01-01', '2026-01-01')"
            ),
            "other row counts",
        ),
        # Once restored it would run on floom's own writes: a secret set copied elsewhere.
        "a_trigger": (
            _executing(
                "CREATE TRIGGER leak AFTER INSERT ON secrets "
                "BEGIN UPDATE secrets SET name = name WHERE 0; END"
            ),
            "holds the trigger 'leak', which floom does not define",
        ),
        "a_view": (
            _executing("CREATE VIEW peek AS SELECT name, ciphertext FROM secrets"),
            "holds the view 'peek'",
        ),
        "a_table_and_index": (
            _executing("CREATE TABLE loot (x TEXT)", "CREATE INDEX ix_loot_x ON loot (x)"),
            "holds the table 'loot'",
        ),
        "an_index": (
            _executing("CREATE INDEX ix_planted ON runs (id, status)"),
            "holds the index 'ix_planted'",
        ),
    }
    for name, (damage, said) in damages.items():
        backup = tmp_path / name
        shutil.copytree(good, backup)
        damage(backup / "floom.db")
        _rechecked(backup)
        fresh = tmp_path / f"fresh-{name}"
        for target, force in ((fresh, False), (busy, True)):
            with pytest.raises(BackupInvalid) as refused:
                restore_backup(
                    settings=_sqlite_node(target),
                    source=backup,
                    force=force,
                )
            assert said in refused.value.message, name
            assert "nothing was restored" in refused.value.message
        assert not fresh.exists(), name
        assert _tree(busy) == before, name


def test_a_backup_whose_secrets_the_node_s_key_cannot_read_is_refused(tmp_path: Path) -> None:
    # The secrets stay encrypted in the backup; restored under another key they could never
    # be read again, so such a restore is refused (naming the key) before anything is written.
    source = _sqlite_node(tmp_path / "a")
    ctx = Context.open(source)
    set_secret(ctx, name="KEEPER_TOKEN", value="tok-plain-1234", caller=SYSTEM)
    ctx.engine.dispose()
    create_backup(settings=source, dest=tmp_path / "backup")
    assert all(b"tok-plain-1234" not in data for data in _tree(tmp_path / "backup").values())
    fresh = tmp_path / "fresh"
    with pytest.raises(BackupInvalid) as refused:
        restore_backup(
            settings=_sqlite_node(fresh, secret_key="other"),
            source=tmp_path / "backup",
        )
    assert "FLOOM_SECRET_KEY" in refused.value.message
    assert "FLOOM_SECRET_KEY" in (refused.value.hint or "")
    assert not fresh.exists()
    # With the key it was taken under, it restores.
    restore_backup(
        settings=_sqlite_node(fresh),
        source=tmp_path / "backup",
    )
    assert (fresh / "floom.db").is_file()


def test_a_restore_that_cannot_write_its_copies_says_which_file_and_changes_nothing(
    tmp_path: Path,
) -> None:
    # A full disk (ENOSPC) or a quota (EDQUOT) fails the copies' writes as a file size limit
    # does (EFBIG, simulated here with RLIMIT_FSIZE in the restoring process): one line
    # naming the file and why, no stack trace, the data dir left as it was.
    source = Settings(data_dir=tmp_path / "a", deploy_examples=False)
    Context.open(source).engine.dispose()
    create_backup(settings=source, dest=tmp_path / "bk")
    assert (tmp_path / "bk" / "floom.db").stat().st_size > 64 * 1024
    busy = tmp_path / "busy"
    Context.open(Settings(data_dir=busy, deploy_examples=False)).engine.dispose()
    before = _tree(busy)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONDONTWRITEBYTECODE"] = "1"

    def small_files() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    for target, force in ((tmp_path / "fresh", []), (busy, ["--force"])):
        done = subprocess.run(
            [sys.executable, "-m", "floom.cli", "restore", str(tmp_path / "bk"), *force],
            env={**env, "FLOOM_DATA_DIR": str(target)},
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=small_files,
        )
        assert done.returncode == 1, done.stderr
        assert f"could not write {target / 'floom.db'}: File too large" in done.stderr
        assert "nothing was restored" in done.stderr
        assert "unexpected" not in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "fresh").exists()
    assert _tree(busy) == before


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounts a tmpfs: needs root"
)
def test_a_restore_onto_a_full_disk_says_so_and_leaves_the_disk_as_it_was(tmp_path: Path) -> None:
    # A real full disk (ENOSPC): a 64 KiB tmpfs mounted in the restore's own mount namespace.
    source = Settings(data_dir=tmp_path / "a", deploy_examples=False)
    Context.open(source).engine.dispose()
    create_backup(settings=source, dest=tmp_path / "bk")
    disk = tmp_path / "disk"
    disk.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", FLOOM_DATA_DIR=f"{disk}/data")
    script = (
        'mount -t tmpfs -o size=64k tmpfs "$1" || exit 99; '
        '"$2" -m floom.cli restore "$3"; echo "restore exited $?"; ls -A "$1"'
    )
    done = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            script,
            "sh",
            str(disk),
            sys.executable,
            str(tmp_path / "bk"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"could not write {disk / 'data' / 'floom.db'}: No space left on device" in done.stderr
    assert "unexpected" not in done.stderr
    # Nothing left on the disk: the copy and the directories the restore made are gone.
    assert done.stdout == "restore exited 1\n"


def _hot_journal(db: Path, journal: Path) -> None:
    """Write to `journal` a hot rollback journal that, played into `db` when it is next
    opened, adds the trigger `leak`: the journal SQLite writes while that trigger is dropped
    from a copy of `db` holding it, taken before the drop commits."""
    evil = db.with_name("evil.db")
    shutil.copyfile(db, evil)
    with closing(sqlite3.connect(evil)) as conn, conn:
        conn.execute(
            "CREATE TRIGGER leak AFTER INSERT ON secrets "
            "BEGIN UPDATE secrets SET name = name WHERE 0; END"
        )
    with closing(sqlite3.connect(evil, isolation_level=None)) as conn:
        conn.execute("PRAGMA synchronous=OFF")  # the journal's record count left to its size
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("BEGIN")
        conn.execute("DROP TRIGGER leak")
        shutil.copyfile(f"{evil}-journal", journal)
        conn.execute("COMMIT")
    shutil.copyfile(evil, db)
    evil.unlink()


def _triggers(db: Path) -> list[str]:
    # Opened writable, as floom opens it: a hot journal beside it is played in.
    with closing(sqlite3.connect(db)) as conn:
        return [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")
        ]


def test_a_journal_beside_the_database_never_changes_what_a_restore_checked(
    tmp_path: Path,
) -> None:
    # The checks above read the backup's database alone; a rollback journal beside the
    # restored database is played into it when floom next opens it, so a backup carrying
    # floom.db-journal (or a replaced node's journal left in place) could add the trigger
    # they refuse. Such a file is refused as a backup's, and removed from a forced data dir.
    source = _new_node(tmp_path / "a")
    clean = tmp_path / "clean"
    create_backup(settings=source, dest=clean)

    carried = tmp_path / "carried"
    shutil.copytree(clean, carried)
    _hot_journal(carried / "floom.db", carried / "floom.db-journal")
    manifest = json.loads((carried / MANIFEST).read_text())
    manifest["summary"]["files"].append("floom.db-journal")
    (carried / MANIFEST).write_text(json.dumps(manifest))
    _rechecked(carried)
    fresh = tmp_path / "fresh"
    with pytest.raises(BackupInvalid) as refused:
        restore_backup(settings=_sqlite_node(fresh), source=carried)
    assert "unexpected file 'floom.db-journal'" in refused.value.message
    assert not fresh.exists()

    # A database under another name in the data dir: its journal is refused the same way.
    named = tmp_path / "named"
    manifest["summary"]["files"][-1] = "store.sqlite-journal"
    shutil.copyfile(carried / "floom.db-journal", carried / "store.sqlite-journal")
    (carried / MANIFEST).write_text(json.dumps(manifest))
    _rechecked(carried)
    with pytest.raises(BackupInvalid) as refused:
        restore_backup(
            settings=fast_settings(named, f"sqlite:///{named / 'store.sqlite'}"), source=carried
        )
    assert "unexpected file 'store.sqlite-journal'" in refused.value.message
    assert not named.exists()

    # A forced restore over a node that left a hot journal: the journal goes with it.
    busy = tmp_path / "busy"
    _new_node(busy)
    shutil.copyfile(clean / "floom.db", tmp_path / "old.db")
    _hot_journal(tmp_path / "old.db", busy / "floom.db-journal")
    restore_backup(settings=_sqlite_node(busy), source=clean, force=True)
    assert not (busy / "floom.db-journal").exists()
    assert _triggers(busy / "floom.db") == []


def test_a_manifest_of_other_shapes_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each part a restore reads is checked for the type floom writes: a checksum table that
    # is a string or a list, warnings that are not a list (read after the files took their
    # places: the restore finished with a stack trace), a file named twice, a manifest not
    # UTF-8 or larger than any floom writes. Each is one clear line, nothing written.
    source = _new_node(tmp_path / "a")
    good = tmp_path / "good"
    create_backup(settings=source, dest=good)
    (good / "x.txt").write_text("x")
    original = json.loads((good / MANIFEST).read_text())
    original["summary"]["files"].append("x.txt")
    original["sha256"]["x.txt"] = hashlib.sha256(b"x").hexdigest()
    monkeypatch.setattr("floom.services.ops.backup.MANIFEST_MAX_BYTES", 1 << 20)

    def shaped(change: Any) -> bytes:
        manifest = json.loads(json.dumps(original))
        change(manifest)
        return json.dumps(manifest).encode()

    cases: dict[str, tuple[bytes, str]] = {
        "checksums_a_string": (
            shaped(lambda m: m.update(sha256="floom.db x.txt")),
            "cannot be read",
        ),
        "checksums_a_list": (shaped(lambda m: m.update(sha256=["floom.db"])), "cannot be read"),
        "warnings_a_number": (shaped(lambda m: m["summary"].update(warnings=5)), "cannot be read"),
        "key_flag_a_string": (
            shaped(lambda m: m["summary"].update(secret_key_in_backup="no")),
            "cannot be read",
        ),
        "a_file_twice": (
            shaped(lambda m: m["summary"]["files"].append("x.txt")),
            "names a file twice",
        ),
        "not_utf8": (b"\xff\xfe" + json.dumps(original).encode(), "cannot be read"),
        "too_large": (json.dumps(original).encode() + b" " * (1 << 20), "cannot be read"),
    }
    for case, (text, said) in cases.items():
        backup = tmp_path / case
        shutil.copytree(good, backup)
        (backup / MANIFEST).write_bytes(text)
        fresh = tmp_path / f"fresh-{case}"
        with pytest.raises(BackupInvalid) as refused:
            restore_backup(settings=_sqlite_node(fresh), source=backup)
        assert said in refused.value.message, case
        assert not fresh.exists(), case
