"""Backup and restore of a SQLite node: a consistent online copy of the database (sqlite3's
backup API, safe while floom serves) and the data dir's files, restored into a fresh data dir.

PostgreSQL stores are backed up with pg_dump (docs/how-to/operations.md): floom cannot
copy them more consistently than the server's own tool.

Blobs kept in object storage (FLOOM_BLOB_STORE=s3) are copied into the backup's objects/,
each checked against its sha256, so a backup stands alone; a restore puts them back into the
node's bucket, or into the database when the node has none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
from contextlib import closing
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import SQLModel

from floom import __version__
from floom.config import Settings
from floom.errors import (
    BackupInvalid,
    BlobUnreadable,
    Conflict,
    InvalidRequest,
    NotFound,
    RestoreNotWritten,
    SecretUndecryptable,
)
from floom.hints import act, told
from floom.services.access.secrets import SecretBox
from floom.store.blobs.base import largest_blob_bytes, sha256_of, vouched_sha256
from floom.store.blobs.configured import s3_store
from floom.store.blobs.database import DatabaseBlobStore
from floom.store.db import make_engine
from floom.store.migrate import VERSION_TABLE, migrate

MANIFEST = "floom-backup.json"
DATABASE = "floom.db"
OBJECTS = "objects"
FORMAT = 1
# The files SQLite keeps beside a database: a rollback journal, a write-ahead log and its
# index. A hot journal or a log beside a database is played into it when it is next opened,
# so one a backup carried would change the restored database after every check of it.
_SIDE_FILES = ("-journal", "-wal", "-shm")
# Left out of a backup: the database (copied through the backup API instead), its side
# files, this host's node id (a restored node is a new node), the running node's lock on its
# work root (floom.engine.work_root: a lock of this process, meaningless in a copy), and caches
# floom rebuilds: run work dirs and extracted versions.
_NOT_COPIED = {
    DATABASE,
    *(f"{DATABASE}{suffix}" for suffix in _SIDE_FILES),
    "node.id",
    "node.lock",
    "runs",
    "versions",
}
# The tables whose row counts a backup records, so a restore can be checked against them.
_COUNTED = (
    "workers",
    "versions",
    "runs",
    "run_events",
    "run_logs",
    "artifacts",
    "blobs",
    "secrets",
)
_PAGES_PER_STEP = 1024
# A manifest larger than this is not one floom wrote (one names each file and object once).
MANIFEST_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class BackupSummary:
    """What a backup holds (also written to its manifest) or what a restore put back."""

    path: str
    schema_revision: str
    counts: dict[str, int]
    files: list[str]
    # The secrets in the backup need this key; when it comes from FLOOM_SECRET_KEY it is not
    # in the backup and must be kept with it.
    secret_key_in_backup: bool
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite database URL; None for any other database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    if not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _database_files(data_dir: Path, db_path: Path) -> frozenset[str]:
    """The database's own file and its side files, as names under `data_dir` (none when the
    database lives elsewhere): never copied as data files, never restored as one."""
    try:
        rel = db_path.absolute().relative_to(data_dir.absolute()).as_posix()
    except ValueError:
        return frozenset()
    return frozenset({rel, *(f"{rel}{suffix}" for suffix in _SIDE_FILES)})


def _require_sqlite(settings: Settings, *, doing: str) -> Path:
    path = sqlite_path(settings.resolved_database_url)
    if path is None:
        raise InvalidRequest(
            f"{doing} works on a SQLite store; this node's FLOOM_DATABASE_URL is not SQLite",
            hint=told(
                "back up PostgreSQL with pg_dump (docs/how-to/operations.md), or move a "
                "SQLite store to PostgreSQL with ",
                act("migrate-store"),
            ),
        )
    return path


def create_backup(*, settings: Settings, dest: Path) -> BackupSummary:
    """Copy the node's SQLite database and data dir files into the new directory `dest`.

    The database is copied with sqlite3's online backup API, so floom may keep serving
    meanwhile and the copy is one consistent snapshot. `dest` must not exist (or be an empty
    directory); the backup is written beside it and renamed into place, so a failed backup
    never looks like a finished one.
    """
    db_path = _require_sqlite(settings, doing="floom backup")
    if not db_path.is_file():
        raise NotFound(
            f"no floom database at {db_path}",
            hint="check FLOOM_DATA_DIR (or FLOOM_DATABASE_URL): it names the node to back up",
        )
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise Conflict(
            f"{dest} already exists and is not an empty directory",
            hint="name a new directory for the backup, e.g. one per date",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial-{os.urandom(4).hex()}")
    partial.mkdir(mode=0o700)
    try:
        _copy_database(db_path, partial / DATABASE)
        files = _copy_data_files(
            settings.data_dir, partial, skip=_database_files(settings.data_dir, db_path)
        )
        files += _copy_objects(settings, partial)
        summary = BackupSummary(
            path=str(dest),
            schema_revision=_schema_revision(partial / DATABASE),
            counts=_counts(partial / DATABASE),
            files=sorted(files),
            secret_key_in_backup=not settings.secret_key,
            warnings=[]
            if not settings.secret_key
            else [
                "the secret key comes from FLOOM_SECRET_KEY and is not in the backup: keep "
                "it with the backup, the stored secrets cannot be read without it"
            ],
        )
        checksums = {name: _sha256(partial / name) for name in [DATABASE, *summary.files]}
        manifest = {
            "format": FORMAT,
            "floom_version": __version__,
            "created_at": datetime.now(UTC).isoformat(),
            "summary": summary.to_dict(),
            "sha256": checksums,
        }
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        if dest.exists():
            dest.rmdir()  # empty, checked above
        partial.rename(dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return summary


def restore_backup(*, settings: Settings, source: Path, force: bool = False) -> BackupSummary:
    """Put the backup in `source` back as this node's data dir and database, then bring the
    database to the current schema.

    The data dir must be empty or absent: restoring over a live node would mix two
    histories. With `force`, the database and the files the backup holds are replaced (stop
    floom first). All or nothing: every file is copied beside its place and checked against
    the backup's checksums, the database is brought to the current schema and checked (its
    row counts against the manifest's, its secrets against the key this node will read them
    with, its objects against their digests) before anything takes its place, by renames.
    A damaged backup raises BackupInvalid naming what was wrong, and changes nothing.
    """
    db_path = _require_sqlite(settings, doing="floom restore")
    data_dir = settings.data_dir
    manifest = _read_manifest(source, database=_database_files(data_dir, db_path))
    occupied = data_dir.is_dir() and any(data_dir.iterdir())
    if (occupied or db_path.exists()) and not force:
        raise Conflict(
            f"the data dir {data_dir} is not empty",
            hint="restore into a fresh data dir (FLOOM_DATA_DIR), or pass --force to replace "
            "its database and files (stop floom on it first)",
        )
    files = manifest["summary"]["files"]
    objects = [name for name in files if name.startswith(f"{OBJECTS}/")]
    files = [name for name in files if name not in objects]
    # With --force the data dir holds what its node left, run dirs (what workers left) among
    # them: a file is never written through a link there, checked before anything is written.
    for name in files:
        _check_target(data_dir, name)
    tag = os.urandom(4).hex()
    made: list[Path] = []  # directories this restore created, undone on failure
    staged: list[tuple[Path, Path]] = []  # (copy beside its place, its place)
    writing = data_dir
    try:
        try:
            _make_dirs(db_path.parent, made)
            _make_dirs(data_dir, made)
            os.chmod(data_dir, 0o700)
            staged_db = db_path.with_name(f".{db_path.name}.restore-{tag}")
            staged.append((staged_db, db_path))
            writing = db_path
            _copy_checked(source, DATABASE, staged_db, manifest["sha256"][DATABASE])
            for name in files:
                writing = target = data_dir / name
                _make_dirs(target.parent, made)
                staged.append((target.with_name(f".{target.name}.restore-{tag}"), target))
                _copy_checked(source, name, staged[-1][0], manifest["sha256"][name])
        except OSError as exc:
            # A full disk (ENOSPC, EDQUOT), a file size limit (EFBIG), a read-only mount:
            # one line naming the file, not a stack trace; the copies are removed below.
            raise RestoreNotWritten(
                f"could not write {writing}: {exc.strerror or exc}; nothing was restored",
                hint="free space on the disk holding FLOOM_DATA_DIR (or choose another), "
                "then restore again",
            ) from None
        _prepare_database(settings, staged_db, source, manifest, files, objects)
    except BaseException:
        _undo(staged, made)
        raise
    # Everything is checked: the copies take their places (floom is stopped: nothing races).
    # (A journal or log the replaced node left would be played into the restored database.)
    for suffix in _SIDE_FILES:
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    for copy, target in staged:
        os.replace(copy, target)
    recorded = manifest["summary"]
    return BackupSummary(
        path=str(data_dir),
        schema_revision=_schema_revision(db_path),
        counts=_counts(db_path),
        files=sorted(files),
        secret_key_in_backup=bool(recorded.get("secret_key_in_backup")),
        warnings=list(recorded.get("warnings", [])),
    )


def _undo(staged: list[tuple[Path, Path]], made: list[Path]) -> None:
    """Remove a failed restore's copies and the directories it created."""
    for copy, _ in staged:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{copy}{suffix}").unlink(missing_ok=True)
    for directory in reversed(made):
        shutil.rmtree(directory, ignore_errors=True)


def _make_dirs(path: Path, made: list[Path]) -> None:
    """mkdir -p, remembering each directory it created."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o700)
        made.append(directory)


def _copy_checked(source: Path, name: str, dest: Path, sha256: str) -> None:
    """Copy the backup's file `name` to `dest` (a new file, never through a link) in steps,
    checking the bytes copied against the manifest's checksum: a file that changed since
    the manifest was read is refused, naming it."""
    digest = hashlib.sha256()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out, (source / name).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise BackupInvalid(
            f"{name} in {source} does not match its checksum; nothing was restored",
            hint="the backup is damaged or changed while it was read; use another one",
        )


def _prepare_database(
    settings: Settings,
    db: Path,
    source: Path,
    manifest: dict[str, Any],
    files: list[str],
    objects: list[str],
) -> None:
    """Check the backup's database copied to `db` and bring it to the current schema, its
    objects put back; BackupInvalid, naming what was wrong, when it cannot be."""

    def damaged(what: str, exc: BaseException | None = None) -> BackupInvalid:
        why = f": {str(exc).splitlines()[0][:200]}" if exc is not None and str(exc) else ""
        return BackupInvalid(
            f"{DATABASE} in {source} {what}{why}; nothing was restored",
            hint="the backup is damaged or was not written by floom backup; use another one",
        )

    recorded = manifest["summary"].get("counts")
    try:
        counts = _counts(db)
    except sqlite3.Error as exc:
        raise damaged("is not a floom database", exc) from None
    if not isinstance(recorded, dict) or any(
        recorded.get(t) != n for t, n in counts.items() if t in recorded
    ):
        raise damaged(f"holds other row counts than its manifest records ({counts})")
    # A trigger or view would run inside floom once restored (a trigger on floom's own
    # writes could copy secrets where a read key lists them): refused before the migration
    # writes to the database, and every other object floom does not define after it.
    if foreign := _foreign_objects(db, kinds=("trigger", "view")):
        raise damaged(f"holds the {foreign}, which floom does not define")
    engine = make_engine(f"sqlite:///{db}")
    try:
        try:
            migrate(engine)
        except (sqlite3.Error, SQLAlchemyError) as exc:
            raise damaged("cannot be brought to this floom's schema", exc) from None
        with _readonly(db) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if lacking := sorted(set(SQLModel.metadata.tables) - tables):
            raise damaged(f"lacks the table(s) {', '.join(lacking[:5])}")
        if foreign := _foreign_objects(db, kinds=("table", "index", "trigger", "view")):
            raise damaged(f"holds the {foreign}, which floom does not define")
        if reshaped := _reshaped_object(db):
            raise damaged(reshaped)
        _check_secrets(settings, db, source, files)
        _restore_objects(settings, engine, source, objects)
    finally:
        engine.dispose()
    with closing(sqlite3.connect(db)) as conn:
        # One file again, like the backup's: it takes its place by a rename.
        conn.execute("PRAGMA journal_mode=DELETE")


def _reshaped_object(db: Path) -> str | None:
    """What the first of floom's tables and indexes is in `db` when it lacks it or holds it
    other than floom defines it, or None. Same-named is not enough: a table remade without
    its unique keys (the ones that refuse a replayed webhook delivery or a cron fire made
    twice), a virtual table, a generated column, an index remade partial would each pass a
    check of names."""
    with _readonly(db) as conn:
        held = _shapes(conn)
    # Tables first: a table remade drops its indexes with it.
    for key, shape in sorted(_floom_shapes().items(), key=lambda k: (k[0][0] != "table", k)):
        kind, name = key
        if key not in held:
            return f"lacks the {kind} {name!r}"
        if held[key] != shape:
            return f"holds the {kind} {name!r}, which is not as floom defines it"
    return None


@cache
def _floom_shapes() -> dict[tuple[str, str], tuple[Any, ...]]:
    """_shapes of a database made from the models, as a new node's is."""
    engine = create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            SQLModel.metadata.create_all(conn)
            conn.exec_driver_sql(
                f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
                f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))"
            )
            return _shapes(conn.connection.dbapi_connection)  # type: ignore[arg-type]
    finally:
        engine.dispose()


def _floom_schema() -> frozenset[tuple[str, str]]:
    """The (type, name) of every table and index floom's schema defines (it defines no
    trigger or view)."""
    return frozenset(_floom_shapes())


def _shapes(conn: sqlite3.Connection) -> dict[tuple[str, str], tuple[Any, ...]]:
    """Each table and named index by (type, name), with what decides what it holds and
    refuses: a table's kind (plain or virtual), its columns (name, not null, key, generated;
    not the declared type, which SQLite does not enforce) and its UNIQUE and PRIMARY KEY
    constraints (SQLite's autoindexes, by what they hold rather than their numbered names);
    an index's table, uniqueness, partialness and key columns."""

    def index(table: str, name: str) -> tuple[Any, ...]:
        listed = conn.execute(
            'SELECT "unique", origin, partial FROM pragma_index_list(?) WHERE name = ?',
            (table, name),
        ).fetchone()
        keys = conn.execute(
            'SELECT cid, name, "desc", coll FROM pragma_index_xinfo(?) WHERE key ORDER BY seqno',
            (name,),
        ).fetchall()
        return (listed, tuple(keys))

    shapes: dict[tuple[str, str], tuple[Any, ...]] = {}
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE type IN ('table', 'index')"
    ).fetchall()
    for kind, name, table, sql in rows:
        if kind == "index" and sql is None:
            continue  # a table's constraint: part of its table's shape
        if kind == "index":
            shapes[kind, name] = (table, index(table, name))
            continue
        columns = conn.execute(
            'SELECT name, "notnull", pk, hidden FROM pragma_table_xinfo(?)', (name,)
        ).fetchall()
        constraints = [
            index(name, auto)
            for (auto,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NULL "
                "AND tbl_name = ?",
                (name,),
            )
        ]
        virtual = (sql or "").lstrip().upper().startswith("CREATE VIRTUAL")
        shapes[kind, name] = (virtual, tuple(sorted(columns)), tuple(sorted(constraints)))
    return shapes


def _foreign_objects(db: Path, *, kinds: tuple[str, ...]) -> str | None:
    """The first schema object of `kinds` in `db` that floom does not define, as "trigger
    'name'", or None. SQLite's own objects (a constraint's index, sqlite_sequence and the
    sqlite_stat tables) are its own, not the backup's."""
    marks = ", ".join("?" * len(kinds))
    with _readonly(db) as conn:
        rows = conn.execute(
            f"SELECT type, name, sql FROM sqlite_master WHERE type IN ({marks}) ORDER BY rowid",
            kinds,
        ).fetchall()
    for kind, name, sql in rows:
        own = (kind == "index" and sql is None) or (
            kind == "table" and (name == "sqlite_sequence" or name.startswith("sqlite_stat"))
        )
        if not own and (kind, name) not in _floom_schema():
            return f"{kind} {str(name)[:100]!r}"
    return None


# Secrets a restore tries to decrypt with the node's key; one that decrypts is enough.
SECRETS_TRIED = 20


def _check_secrets(settings: Settings, db: Path, source: Path, files: list[str]) -> None:
    """Refuse a backup whose stored secrets the restored node's key cannot decrypt: the key
    is FLOOM_SECRET_KEY when set, else the backup's secret.key, else the data dir's."""
    with _readonly(db) as conn:
        tokens = [
            bytes(row[0])
            for row in conn.execute("SELECT ciphertext FROM secrets LIMIT ?", (SECRETS_TRIED,))
        ]
    if not tokens:
        return
    key_file = settings.secret_key_file
    material: bytes | None = None
    if settings.secret_key:
        material, key = settings.secret_key.encode(), "FLOOM_SECRET_KEY"
    elif key_file.name in files and key_file.parent == settings.data_dir:
        material, key = (
            (source / key_file.name).read_bytes().strip(),
            f"the backup's {key_file.name}",
        )
    elif key_file.is_file():
        material, key = key_file.read_bytes().strip(), str(key_file)
    else:
        key = f"none: FLOOM_SECRET_KEY is unset and the backup holds no {key_file.name}"
    if material:
        box = SecretBox(material)
        for token in tokens:
            try:
                box.decrypt(token)
                return
            except SecretUndecryptable:
                continue
    raise BackupInvalid(
        f"the backup's stored secrets cannot be decrypted with this node's key ({key}): it was "
        "taken from a node with another secret key; nothing was restored",
        hint="set FLOOM_SECRET_KEY to the key of the node the backup was taken from (kept "
        "with the backup), then restore again",
    )


def _read_manifest(source: Path, *, database: frozenset[str]) -> dict[str, Any]:
    """The backup's manifest, every file it names checked: `database` names the restored
    database's own files under the data dir, which no backup file may take the place of."""
    path = source / MANIFEST
    if not path.is_file():
        raise BackupInvalid(
            f"{source} is not a floom backup (no {MANIFEST})",
            hint=told("name the directory that ", act("backup"), " wrote"),
        )
    unreadable = BackupInvalid(
        f"{path} cannot be read: it is not a manifest floom backup writes",
        hint="the backup is damaged or was not written by floom backup; use another one",
    )
    if path.stat().st_size > MANIFEST_MAX_BYTES:
        raise unreadable
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
        checksums: dict[str, str] = manifest["sha256"]
        summary = manifest["summary"]
        files = summary["files"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise unreadable from None
    # Every part a restore reads, of the type floom writes: else a restore could stop on it
    # with a stack trace, even after its files took their places.
    if not (
        isinstance(checksums, dict)
        and all(isinstance(v, str) for v in checksums.values())
        and isinstance(summary.get("counts"), dict)
        and isinstance(summary.get("warnings", []), list)
        and all(isinstance(w, str) for w in summary.get("warnings", []))
        and isinstance(summary.get("secret_key_in_backup", False), bool)
    ):
        raise unreadable
    if manifest.get("format") != FORMAT:
        raise BackupInvalid(
            f"{source} has backup format {manifest.get('format')!r}; this floom reads {FORMAT}",
            hint="restore it with the floom version that wrote it",
        )
    if not isinstance(files, list):
        raise unreadable
    if len(set(map(str, files))) != len(files):
        raise BackupInvalid(
            f"{path} names a file twice; nothing was restored",
            hint="the backup is damaged or was not written by floom backup; use another one",
        )
    for i, name in enumerate([DATABASE, *files]):
        target = (source / name).resolve() if isinstance(name, str) else source
        # A backup's files never include the database (restored on its own) or its side
        # files, a node's own files or its run dirs (what workers left).
        kept = i == 0 or (
            isinstance(name, str) and name.split("/")[0] not in _NOT_COPIED and name not in database
        )
        if (
            not kept
            or not _plain(name)
            or not target.is_relative_to(source.resolve())
            or name not in checksums
        ):
            raise BackupInvalid(
                f"the backup names an unexpected file {str(name)[:200]!r}",
                hint="a backup names its files by plain relative paths (no '.', '..', empty or "
                "absolute parts) and its objects as objects/<digest>; use another backup",
            )
        if not target.is_file() or _sha256(target) != checksums[name]:
            raise BackupInvalid(
                f"{name} in {source} is missing or does not match its checksum",
                hint="the backup is damaged or incomplete; use another one",
            )
    return dict(manifest)


def _check_target(data_dir: Path, name: str) -> None:
    """Refuse (BackupInvalid) a file of the backup that would be written through a link, or
    over something other than a regular file, in the data dir."""
    here = data_dir
    parts = name.split("/")
    for i, part in enumerate(parts):
        here = here / part
        last = i == len(parts) - 1
        if here.is_symlink() or (here.exists() and not (here.is_file() if last else here.is_dir())):
            raise BackupInvalid(
                f"the data dir holds {here.relative_to(data_dir)} as a link or another kind of "
                f"file, where the backup puts {name}; nothing was written",
                hint="restore into a fresh data dir (FLOOM_DATA_DIR), or remove it first",
            )


def _plain(name: object) -> bool:
    """Whether a backup's file name is one floom writes: a relative path of plain parts,
    the same file under the backup and under the data dir (a '..' can be one inside the
    backup and another outside the data dir), and an object's a single digest (it becomes
    an object store key)."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        return False
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return False
    if parts[0] == OBJECTS:
        return len(parts) == 2 and re.fullmatch(r"[0-9A-Za-z_-]{1,128}", parts[1]) is not None
    return True


def _copy_database(source: Path, dest: Path) -> None:
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(dest)
    try:
        # Copied in steps: floom's writers get the database between them.
        src.backup(dst, pages=_PAGES_PER_STEP)
        # The copy stands alone: one file, no write-ahead log beside it.
        dst.execute("PRAGMA journal_mode=DELETE")
    finally:
        dst.close()
        src.close()
    os.chmod(dest, 0o600)


def _copy_data_files(data_dir: Path, dest: Path, *, skip: frozenset[str]) -> list[str]:
    copied: list[str] = []
    if not data_dir.is_dir():
        return copied
    # Links are not followed: a backup holds the data dir's own files, nothing they point at.
    for root, dirs, names in os.walk(data_dir, followlinks=False):
        here = Path(root)
        if here == data_dir:
            dirs[:] = [d for d in dirs if d not in _NOT_COPIED]
        for name in names:
            path = here / name
            rel = path.relative_to(data_dir)
            if (
                rel.as_posix() in _NOT_COPIED
                or rel.as_posix() in skip
                or path.is_symlink()
                or not path.is_file()
            ):
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / rel)
            os.chmod(dest / rel, 0o600)
            copied.append(rel.as_posix())
    return copied


def _copy_objects(settings: Settings, dest: Path) -> list[str]:
    """The bytes of the blobs the backed-up database says a bucket holds, each read back
    checked against its sha256 (a damaged or missing one fails the backup, naming it)."""
    with _readonly(dest / DATABASE) as conn:
        held = conn.execute(
            "SELECT digest, sha256, size FROM blobs WHERE location <> 'database' ORDER BY digest"
        ).fetchall()
    if not held:
        return []
    store = s3_store(settings)
    (dest / OBJECTS).mkdir(mode=0o700)
    copied = []
    for digest, sha256, size in held:
        name = f"{OBJECTS}/{digest}"
        what = f"blob {digest} (for the backup)"
        data = store.get(digest, sha256=sha256, what=what, size=size)
        (dest / name).write_bytes(data)
        os.chmod(dest / name, 0o600)
        copied.append(name)
    return copied


def _restore_objects(settings: Settings, engine: Any, source: Path, names: list[str]) -> None:
    """Put the backup's objects back: into this node's bucket when it has one, else into
    the database (the blobs rows then hold their bytes again). Each must be the object of a
    blob the database holds, of its size and sha256, and every blob the database says a
    bucket holds must be among them: else BackupInvalid, naming it, before any is put."""
    with _readonly(Path(engine.url.database)) as conn:
        rows = {
            digest: (size, sha256, location)
            for digest, size, sha256, location in conn.execute(
                "SELECT digest, size, sha256, location FROM blobs"
            )
        }
    held = {name.removeprefix(f"{OBJECTS}/") for name in names}
    checksums: dict[str, str] = {}  # each object's sha256, checked
    for digest, (_, _, location) in sorted(rows.items()):
        if location != "database" and digest not in held:
            raise BackupInvalid(
                f"the backup lacks {OBJECTS}/{digest}, the bytes of a blob its database keeps "
                f"in object storage; nothing was restored",
                hint="the backup is incomplete; use another one",
            )
    for digest in sorted(held):
        name = f"{OBJECTS}/{digest}"
        row = rows.get(digest)
        # Its length first: a file far larger than its blob is never read.
        if row is None or row[2] == "database" or (source / name).stat().st_size != row[0]:
            raise BackupInvalid(
                f"{name} in {source} is not the object of a blob its database keeps in object "
                f"storage, or not of its size; nothing was restored",
                hint="the backup is damaged or was not written by floom backup; use another one",
            )
        data = (source / name).read_bytes()
        if row[1] is None:
            # A blob stored before floom kept checksums: its digest answers for its bytes.
            try:
                checksums[digest] = vouched_sha256(
                    data,
                    digest=digest,
                    max_bytes=largest_blob_bytes(settings),
                    what=f"blob {digest}",
                    where=f"{name} in {source}",
                )
            except BlobUnreadable as exc:
                raise BackupInvalid(
                    f"{exc.message}; nothing was restored",
                    hint="the backup is damaged or was not written by floom backup; use "
                    "another one",
                ) from None
        elif sha256_of(data) != row[1]:
            raise BackupInvalid(
                f"{name} in {source} does not match its blob's sha256; nothing was restored",
                hint="the backup is damaged or was not written by floom backup; use another one",
            )
        else:
            checksums[digest] = row[1]
    if not names:
        return
    store = (
        s3_store(settings)
        if settings.s3_bucket
        else DatabaseBlobStore(engine, max_unsized_bytes=largest_blob_bytes(settings))
    )
    for digest in sorted(held):
        data = (source / f"{OBJECTS}/{digest}").read_bytes()
        store.put(digest, data, sha256=checksums[digest])
    if store.inline:
        return
    with closing(sqlite3.connect(engine.url.database)) as conn, conn:
        # The bucket's bytes answer for these rows now (even if the backup's node had
        # another bucket: this node reads its own).
        conn.executemany(
            "UPDATE blobs SET location = ?, data = X'' WHERE digest = ?",
            [(store.name, digest) for digest in sorted(held)],
        )


def _schema_revision(db: Path) -> str:
    with _readonly(db) as conn:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    return str(row[0]) if row else ""


def _counts(db: Path) -> dict[str, int]:
    with _readonly(db) as conn:
        return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in _COUNTED}


def _readonly(db: Path) -> closing[sqlite3.Connection]:
    return closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
