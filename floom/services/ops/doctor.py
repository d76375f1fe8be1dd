"""`floom doctor`: what a node needs, checked one by one, each with the fix when it fails.

It only looks: it creates no key, runs no migration and starts no sandbox process beyond
what the backends' own cheap checks do.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, select

from floom.config import Settings, mask_password
from floom.errors import FloomError
from floom.hints import Told, act, told
from floom.hints import cli as cli_hints
from floom.sandbox import get_sandbox
from floom.services.access.secrets import SecretBox
from floom.services.ops import held_logs, nodes
from floom.services.ops.backup import sqlite_path
from floom.store.blobs.configured import s3_store
from floom.store.db import driver_reason, make_engine
from floom.store.migrate import alembic_config
from floom.store.models import Secret

OK, WARN, FAIL = "ok", "warn", "fail"
# Free space below which the data dir's disk is a failure, and below which it is a warning.
MIN_FREE_BYTES = 512 * 1024 * 1024
LOW_FREE_BYTES = 5 * 1024 * 1024 * 1024
# Stored secrets tried against the key: one that decrypts shows the key is the right one.
SECRETS_TRIED = 20
# Held-back run logs the check names, at most.
NAMED_HELD_BACK = 5


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn or fail
    detail: str
    # Text and actions (floom.hints), rendered where the check is shown.
    fix: Told = ""

    def to_dict(self) -> dict[str, Any]:
        """As `floom doctor --json` prints it: the fix as the CLI writes it."""
        return {**asdict(self), "fix": cli_hints.written(self.fix)}


def run_checks(settings: Settings) -> list[Check]:
    """Every check, in the order a person would fix them."""
    checks: list[Callable[[Settings], Check]] = [
        check_bubblewrap,
        check_user_namespaces,
        check_sandbox,
        check_database,
        check_executors,
        check_secret_key,
        check_executors,
        check_disk_space,
    ]
    found = []
    for check in checks:
        try:
            found.append(check(settings))
        except Exception as exc:  # a check that breaks is reported, the others still run
            found.append(Check(check.__name__.removeprefix("check_"), FAIL, repr(exc)[:300]))
    try:
        found.extend(check_blob_store(settings))
    except Exception as exc:  # as above
        found.append(Check("blob store", FAIL, repr(exc)[:300]))
    return found


def check_blob_store(settings: Settings) -> list[Check]:
    """Where blobs go, and for a bucket: reachable, writable (a probe object written, read
    back, deleted), and whether versioning with expiring old versions protects it. A bucket
    is checked whenever one is configured, even while new blobs go to the database."""
    if settings.blob_store == "database" and not settings.s3_bucket:
        return [Check("blob store", OK, "the database (FLOOM_BLOB_STORE=database)")]
    try:
        store = s3_store(settings)
    except FloomError as exc:
        return [Check("blob store", FAIL, exc.message, exc.advice or "")]
    found = [Check(f.name, f.status, f.detail, f.fix) for f in store.check()]
    found.append(check_held_back_logs(settings))
    if settings.blob_store == "database":
        found.insert(
            0,
            Check(
                "blob store",
                OK,
                "the database (FLOOM_BLOB_STORE=database); the bucket below holds what an "
                "earlier FLOOM_BLOB_STORE=s3 put there",
            ),
        )
    return found


def check_held_back_logs(settings: Settings) -> Check:
    """Ended runs whose later lines cannot be merged with their earlier log, missing or
    damaged in the bucket: their logs stay in the database (every node's upkeep passes them
    over) until the object is restored or the earlier log given up. Counted as the upkeep's
    passes marked them (services/ops/held_logs.py): the bucket is not read."""
    name = "held-back run logs"
    url = settings.resolved_database_url
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return Check(name, OK, "no database yet")
    engine = make_engine(url)
    try:
        count = held_logs.held_back_count(engine)
        named = held_logs.held_back_logs(engine, limit=NAMED_HELD_BACK)
    except SQLAlchemyError as exc:
        return Check(name, WARN, f"runs not readable: {driver_reason(exc, url)}")
    finally:
        engine.dispose()
    if not count:
        return Check(name, OK, "no ended run's log is held back (as the upkeep last found)")
    more = f" (and {count - len(named)} more)" if count > len(named) else ""
    listed = "; ".join(f"run {h.run_id} ({h.problem})" for h in named)
    return Check(
        name,
        WARN,
        f"{count} ended run(s)' logs stay in the database, their earlier log object missing "
        f"or damaged: {listed}{more}",
        told(
            "restore each object from a backup or the bucket's versioning (the next upkeep "
            "sweep moves the log, or ",
            act("blobs held-back", retry=True),
            " now), or give the lost lines up with ",
            act("blobs give-up", all=True),
        ),
    )


def check_bubblewrap(settings: Settings) -> Check:
    path = shutil.which("bwrap")
    if path:
        return Check("bubblewrap", OK, path)
    status = FAIL if settings.sandbox == "local" else WARN
    return Check(
        "bubblewrap",
        status,
        "bwrap is not installed: local sandboxes cannot start",
        "apt-get install bubblewrap (Debian/Ubuntu), or run scripts with FLOOM_SANDBOX=e2b",
    )


def check_user_namespaces(settings: Settings) -> Check:
    limit = _read_int(Path("/proc/sys/user/max_user_namespaces"))
    debian_switch = _read_int(Path("/proc/sys/kernel/unprivileged_userns_clone"))
    if limit == 0 or (debian_switch == 0 and os.geteuid() != 0):
        return Check(
            "user namespaces",
            FAIL if settings.sandbox == "local" else WARN,
            "the kernel refuses new user namespaces",
            "sysctl -w user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1 "
            "(and persist it in /etc/sysctl.d/)",
        )
    return Check("user namespaces", OK, f"max_user_namespaces={limit}")


def check_sandbox(settings: Settings) -> Check:
    """The configured backend can start, and which protections its runs get."""
    try:
        sandbox = get_sandbox(settings.sandbox, settings)
        sandbox.check()
        protections = sandbox.protections()
    except FloomError as exc:
        return Check(f"sandbox {settings.sandbox}", FAIL, exc.message, exc.advice or "")
    off = [name for name, value in protections.items() if value is False]
    detail = ", ".join(f"{k}={v}" for k, v in protections.items()) or "no protections reported"
    if off:
        return Check(
            f"sandbox {settings.sandbox}",
            WARN,
            f"not enforced: {', '.join(off)} ({detail})",
            "see docs/explanation/security-model.md: cgroup controllers memory, pids and cpu, "
            "seccomp (libseccomp), and passt or slirp4netns for user-mode networking",
        )
    return Check(f"sandbox {settings.sandbox}", OK, detail)


def check_database(settings: Settings) -> Check:
    url = settings.resolved_database_url
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return Check(
            "database", WARN, f"no database yet at {path}", told(act("serve"), " creates it")
        )
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            tables = set(inspect(conn).get_table_names())
    except SQLAlchemyError as exc:
        return Check(
            "database",
            FAIL,
            f"cannot open {mask_password(url)}: {driver_reason(exc, url)}",
            "check FLOOM_DATABASE_URL and that the database server is running and reachable",
        )
    finally:
        engine.dispose()
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    where = mask_password(url)
    if current is None and not tables:
        return Check(
            "database", WARN, f"{where} is empty", told(act("serve"), " creates the schema")
        )
    if current != head:
        return Check(
            "database",
            FAIL,
            f"{where} is at migration {current}, this floom needs {head}",
            told("start ", act("serve"), " once (it migrates at start-up), after a backup"),
        )
    return Check("database", OK, f"{where} at migration {head}")


def check_executors(settings: Settings) -> Check:
    """Whether a node runs runs, this one or a live one of the store: without one (docker
    compose without a profile starts none), runs are queued and never start."""
    if "executor" in settings.role_set:
        return Check("executors", OK, "this node runs queued runs (the executor role)")
    url = settings.resolved_database_url
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return Check("executors", WARN, "no database yet", told(act("serve"), " creates it"))
    engine = make_engine(url)
    try:
        live = nodes.live_nodes(engine)
    except SQLAlchemyError as exc:
        return Check("executors", WARN, f"nodes not readable: {driver_reason(exc, url)}")
    finally:
        engine.dispose()
    running = [n.id for n in live if nodes.runs_runs(n)]
    if running:
        detail = f"{len(running)} live executor node(s): {', '.join(running)}"
        return Check("executors", OK, detail)
    if not live:
        detail = f"{nodes.NO_EXECUTOR}: no floom node is running on this database"
        return Check("executors", WARN, detail, nodes.START_EXECUTOR)
    others = ", ".join(f"{n.id} ({n.roles})" for n in live)
    return Check(
        "executors",
        FAIL,
        f"{nodes.NO_EXECUTOR} ({others}): runs are queued and never start",
        nodes.START_EXECUTOR,
    )


def check_secret_key(settings: Settings) -> Check:
    """The node's key decrypts the stored secrets (every node of a cluster needs the same)."""
    if not settings.secret_key and not settings.secret_key_file.exists():
        material = None
    else:
        material = (
            settings.secret_key.encode()
            if settings.secret_key
            else settings.secret_key_file.read_bytes().strip()
        )
    path = sqlite_path(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    try:
        if path is not None and not path.exists():
            raise FileNotFoundError(path)
        with Session(engine) as s:
            tokens = list(s.exec(select(Secret.ciphertext).limit(SECRETS_TRIED)).all())
    except (SQLAlchemyError, FileNotFoundError):
        tokens = []  # the database check reports why
    finally:
        engine.dispose()
    source = "FLOOM_SECRET_KEY" if settings.secret_key else str(settings.secret_key_file)
    if material is None:
        if tokens:
            return Check(
                "secret key",
                FAIL,
                "no secret key, but the store holds secrets",
                "set FLOOM_SECRET_KEY (or restore secret.key) to the key that stored them",
            )
        return Check(
            "secret key", WARN, "none yet", told(act("serve"), " creates one in the data dir")
        )
    box = SecretBox(material)
    if tokens and not any(_decrypts(box, t) for t in tokens):
        return Check(
            "secret key",
            FAIL,
            f"the key from {source} decrypts none of the stored secrets",
            "start every node with the key that stored them (FLOOM_SECRET_KEY or the data "
            "dir's secret.key), or set the secrets again",
        )
    return Check("secret key", OK, f"{source}; {len(tokens)} stored secret(s) checked")


def check_disk_space(settings: Settings) -> Check:
    place = settings.data_dir
    while not place.exists() and place != place.parent:
        place = place.parent
    usage = shutil.disk_usage(place)
    detail = f"{usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB at {place}"
    fix = "free space, or move FLOOM_DATA_DIR to a larger disk; set FLOOM_RETENTION_DAYS"
    if usage.free < MIN_FREE_BYTES:
        return Check("disk space", FAIL, detail, fix)
    if usage.free < LOW_FREE_BYTES:
        return Check("disk space", WARN, detail, fix)
    return Check("disk space", OK, detail)


def _decrypts(box: SecretBox, token: bytes) -> bool:
    try:
        box.decrypt(token)
    except FloomError:
        return False
    return True


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
