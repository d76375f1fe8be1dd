"""The scheduler, driven by an injected clock: cron and timezones, DST, overlap and catch-up
policies, pause, restarts, redeploys, and two schedulers racing on one database."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy.exc import OperationalError
from sqlmodel import select

from floom.engine.loops.scheduler import Scheduler
from floom.engine.runtime import NodeRuntime
from floom.errors import StoreUnavailable, WorkerPaused
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs import lifecycle as runs
from floom.services.runs import rules as run_rules
from floom.services.triggers import registry as triggers
from floom.services.workers import versions as workers
from floom.store.db import session_scope, store_unavailable
from floom.store.models import Run
from floom.store.triggers import Trigger, TriggerFire
from floom.views import triggers as trigger_answers
from floom.vocabulary import RunStatus, RunTrigger
from tests.support.harness import deploy_in_store, fast_settings, make_worker, wait_until

MONDAY = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)
SCRIPT = {"run.py": "print('tick')\n"}


def deploy(ctx: Context, folder: Path, schedules: list[str], *, name: str = "tick") -> None:
    lines = "".join(f"  - schedule: {s}\n" for s in schedules)
    manifest = f"name: {name}\n" + (f"triggers:\n{lines}" if schedules else "")
    deploy_in_store(ctx, make_worker(folder, manifest, SCRIPT))


def as_if_deployed_at(ctx: Context, when: datetime, *, name: str = "tick") -> None:
    """Move the worker's schedules' start to `when`, as if deployed then."""
    with session_scope(ctx.engine, write=True) as s:
        for t in s.exec(select(Trigger).where(Trigger.worker_name == name)).all():
            t.last_fire_at = when
            s.add(t)


def schedule_runs(ctx: Context, name: str = "tick") -> list[Run]:
    rows, _ = runs.list_runs(ctx, caller=SYSTEM, worker=name, trigger="schedule", limit=500)
    return sorted(rows, key=lambda r: (r.scheduled_for or r.created_at, r.id))


def summary(ctx: Context, name: str = "tick") -> list[tuple[str, str, str | None]]:
    return [
        (r.scheduled_for.isoformat() if r.scheduled_for else "-", r.status, r.error_code)
        for r in schedule_runs(ctx, name)
    ]


def finish(ctx: Context, run_id: str, status: RunStatus = run_rules.SUCCEEDED) -> None:
    with session_scope(ctx.engine, write=True) as s:
        run = s.get(Run, run_id)
        assert run is not None
        run.status = status
        s.add(run)


def drive(scheduler: Scheduler, start: datetime, end: datetime, step: timedelta) -> None:
    now = start
    while now <= end:
        scheduler.tick(now)
        now += step


def test_a_schedule_fires_once_per_tick_at_its_cron_times(ctx: Context, tmp_path: Path) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "*/15 * * * *", overlap: allow}'])
    as_if_deployed_at(ctx, MONDAY)
    scheduler = Scheduler(ctx)

    assert scheduler.tick(MONDAY + timedelta(minutes=14)) == MONDAY + timedelta(minutes=15)
    assert schedule_runs(ctx) == []
    for _ in range(3):  # ticking again at the same time makes nothing new
        scheduler.tick(MONDAY + timedelta(minutes=15))
    scheduler.tick(MONDAY + timedelta(minutes=30, seconds=2))

    assert summary(ctx) == [
        ("2025-01-06T08:15:00+00:00", "queued", None),
        ("2025-01-06T08:30:00+00:00", "queued", None),
    ]
    run = schedule_runs(ctx)[0]
    assert run.trigger == "schedule"
    assert run.trigger_id is not None


def test_a_schedule_fires_at_wall_clock_times_of_its_timezone(ctx: Context, tmp_path: Path) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "0 9 * * 0", timezone: America/New_York}'])
    as_if_deployed_at(ctx, datetime(2025, 1, 4, tzinfo=UTC))
    scheduler = Scheduler(ctx)
    sunday = datetime(2025, 1, 5, 13, tzinfo=UTC)
    drive(scheduler, sunday, sunday + timedelta(hours=2), timedelta(minutes=10))

    # Sunday 09:00 in New York (UTC-5 in January) is 14:00 UTC.
    assert summary(ctx) == [("2025-01-05T14:00:00+00:00", "queued", None)]


def test_through_dst_changes_a_daily_schedule_fires_once_a_day(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "30 2 * * *", timezone: Europe/Berlin, overlap: allow}'])
    scheduler = Scheduler(ctx)
    as_if_deployed_at(ctx, datetime(2024, 3, 30, 12, tzinfo=UTC))
    spring = datetime(2024, 3, 30, 23, tzinfo=UTC)
    drive(scheduler, spring, spring + timedelta(hours=4), timedelta(minutes=5))
    # The night 02:30 does not exist, the run comes at the first valid time, 03:00+02:00.
    assert summary(ctx) == [("2024-03-31T01:00:00+00:00", "queued", None)]

    as_if_deployed_at(ctx, datetime(2024, 10, 26, 12, tzinfo=UTC))
    autumn = datetime(2024, 10, 26, 22, tzinfo=UTC)
    drive(scheduler, autumn, autumn + timedelta(hours=5), timedelta(minutes=5))
    # 02:30 happens twice that night; only the first (02:30+02:00) fires.
    assert summary(ctx)[1:] == [("2024-10-27T00:30:00+00:00", "queued", None)]


def test_overlap_skip_records_a_skipped_run_while_the_previous_one_is_active(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "0 * * * *"}'])  # overlap: skip is the default
    as_if_deployed_at(ctx, MONDAY)
    scheduler = Scheduler(ctx)
    scheduler.tick(MONDAY + timedelta(hours=1))
    scheduler.tick(MONDAY + timedelta(hours=2))
    first = schedule_runs(ctx)[0]
    finish(ctx, first.id)
    scheduler.tick(MONDAY + timedelta(hours=3))

    assert summary(ctx) == [
        ("2025-01-06T09:00:00+00:00", "succeeded", None),
        ("2025-01-06T10:00:00+00:00", "skipped", "overlap_skip"),
        ("2025-01-06T11:00:00+00:00", "queued", None),
    ]
    skipped = schedule_runs(ctx)[1]
    assert skipped.error_message is not None
    assert first.id in skipped.error_message
    listed, _ = runs.list_runs(ctx, caller=SYSTEM, worker="tick", status="skipped")
    assert [r.id for r in listed] == [skipped.id]


def test_overlap_queue_allow_and_cancel_running(ctx: Context, tmp_path: Path) -> None:
    for policy in ("queue", "allow", "cancel_running"):
        name = policy.replace("_", "-")
        deploy(ctx, tmp_path / name, [f'{{cron: "0 * * * *", overlap: {policy}}}'], name=name)
        as_if_deployed_at(ctx, MONDAY, name=name)
    scheduler = Scheduler(ctx)
    scheduler.tick(MONDAY + timedelta(hours=1))
    for name in ("queue", "allow", "cancel-running"):
        finish(ctx, schedule_runs(ctx, name)[0].id, run_rules.RUNNING)
    scheduler.tick(MONDAY + timedelta(hours=2))

    queued = schedule_runs(ctx, "queue")
    assert [r.status for r in queued] == ["running", "queued"]
    assert queued[1].concurrency == 1  # it starts once the running one has ended
    assert [r.status for r in schedule_runs(ctx, "allow")] == ["running", "queued"]
    assert schedule_runs(ctx, "allow")[1].concurrency is None
    cancelled = schedule_runs(ctx, "cancel-running")
    assert [r.status for r in cancelled] == ["running", "queued"]
    assert runs.get_run(ctx, caller=SYSTEM, run_id=cancelled[0].id).cancel_requested


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("none", ["missed", "missed", "missed"]),
        ("latest", ["missed", "missed", None]),
        ("all", [None, None, None]),
    ],
)
def test_catch_up_after_downtime_follows_the_policy(
    ctx: Context, tmp_path: Path, policy: str, expected: list[str | None]
) -> None:
    deploy(ctx, tmp_path / "w", [f'{{cron: "0 * * * *", overlap: allow, catch_up: {policy}}}'])
    as_if_deployed_at(ctx, MONDAY)
    # The scheduler was down from 08:00 to 11:30: 09:00, 10:00 and 11:00 were due meanwhile.
    Scheduler(ctx).tick(MONDAY + timedelta(hours=3, minutes=30))

    rows = schedule_runs(ctx)
    assert [r.scheduled_for.hour for r in rows if r.scheduled_for] == [9, 10, 11]
    assert [r.error_code for r in rows] == expected
    assert all((r.status == "skipped") == (r.error_code is not None) for r in rows)


def test_catch_up_is_bounded_by_the_window_and_a_tick_on_time_still_fires(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "0 * * * *", catch_up: all, catch_up_window: 2h}'])
    as_if_deployed_at(ctx, MONDAY)
    # Down for two days: only the ticks of the last two hours are caught up; one record
    # stands for everything older.
    Scheduler(ctx).tick(MONDAY + timedelta(days=2, seconds=30))

    rows = summary(ctx)
    assert rows[0] == ("2025-01-06T09:00:00+00:00", "skipped", "missed")
    assert "catch_up_window is 2h" in (schedule_runs(ctx)[0].error_message or "")
    assert rows[1:] == [
        ("2025-01-08T07:00:00+00:00", "queued", None),
        ("2025-01-08T08:00:00+00:00", "skipped", "overlap_skip"),
    ]

    deploy(ctx, tmp_path / "n", ['{cron: "0 * * * *", catch_up: none}'], name="none")
    as_if_deployed_at(ctx, MONDAY, name="none")
    Scheduler(ctx).tick(MONDAY + timedelta(hours=1, seconds=40))  # 40 s late is on time
    assert summary(ctx, "none") == [("2025-01-06T09:00:00+00:00", "queued", None)]


def test_a_new_scheduler_resumes_from_the_stored_last_fire(ctx: Context, tmp_path: Path) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "*/10 * * * *", overlap: allow, catch_up: all}'])
    as_if_deployed_at(ctx, MONDAY)
    first = Scheduler(ctx)
    drive(first, MONDAY, MONDAY + timedelta(minutes=25), timedelta(minutes=5))
    # The process stops here; another one, with its own engine, starts 30 minutes later.
    other = Context.open(ctx.settings.model_copy(update={"node_id": "second-node"}))
    try:
        later = MONDAY + timedelta(minutes=55)
        drive(Scheduler(other), later, later + timedelta(minutes=5), timedelta(minutes=5))
    finally:
        other.engine.dispose()

    times = [r.scheduled_for.strftime("%H:%M") for r in schedule_runs(ctx) if r.scheduled_for]
    assert times == ["08:10", "08:20", "08:30", "08:40", "08:50", "09:00"]
    assert all(r.status == "queued" for r in schedule_runs(ctx))


def test_two_schedulers_racing_make_exactly_one_run_per_tick(ctx: Context, tmp_path: Path) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "* * * * *", overlap: allow}'])
    deploy(ctx, tmp_path / "v", ['{cron: "*/2 * * * *", overlap: skip}'], name="tock")
    as_if_deployed_at(ctx, MONDAY)
    as_if_deployed_at(ctx, MONDAY, name="tock")
    contexts = [
        Context.open(fast_settings(ctx.settings.data_dir, ctx.settings.database_url, node_id=n))
        for n in ("node-a", "node-b")
    ]
    rounds = 12
    barrier = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def race(context: Context) -> None:
        scheduler = Scheduler(context)
        try:
            for minute in range(1, rounds + 1):
                barrier.wait()
                scheduler.tick(MONDAY + timedelta(minutes=minute, seconds=1))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=race, args=(c,)) for c in contexts]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        for c in contexts:
            c.engine.dispose()
    assert not errors, errors

    ticks = [r.scheduled_for for r in schedule_runs(ctx)]
    assert len(ticks) == rounds
    assert len(set(ticks)) == rounds
    assert all(r.status == "queued" for r in schedule_runs(ctx))
    tock = summary(ctx, "tock")
    assert len(tock) == rounds // 2
    assert len({t for t, _, _ in tock}) == rounds // 2
    assert [code for _, _, code in tock] == [None] + ["overlap_skip"] * (rounds // 2 - 1)
    with session_scope(ctx.engine) as s:
        fires = s.exec(select(TriggerFire)).all()
    assert len(fires) == rounds + rounds // 2


def test_a_paused_worker_records_each_tick_as_skipped_and_resumes_without_backfill(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "0 * * * *", overlap: allow}'])
    as_if_deployed_at(ctx, MONDAY)
    scheduler = Scheduler(ctx)
    triggers.set_paused(ctx, caller=SYSTEM, worker_name="tick", paused=True)
    drive(scheduler, MONDAY, MONDAY + timedelta(hours=2), timedelta(minutes=30))

    with pytest.raises(WorkerPaused) as refused:
        runs.create_run(ctx, caller=SYSTEM, worker_name="tick", trigger=RunTrigger.MANUAL)
    assert "--force" in (refused.value.hint or "")
    forced = runs.create_run(
        ctx, caller=SYSTEM, worker_name="tick", trigger=RunTrigger.MANUAL, force=True
    )
    assert forced.status == "queued"

    triggers.set_paused(ctx, caller=SYSTEM, worker_name="tick", paused=False)
    drive(scheduler, MONDAY + timedelta(hours=2), MONDAY + timedelta(hours=3), timedelta(hours=1))
    assert summary(ctx) == [
        ("2025-01-06T09:00:00+00:00", "skipped", "paused"),
        ("2025-01-06T10:00:00+00:00", "skipped", "paused"),
        ("2025-01-06T11:00:00+00:00", "queued", None),
    ]

    _, (trigger,) = triggers.list_triggers(ctx, caller=SYSTEM, worker_name="tick")
    triggers.set_paused(ctx, caller=SYSTEM, worker_name="tick", paused=True, trigger_id=trigger.id)
    scheduler.tick(MONDAY + timedelta(hours=4))
    assert summary(ctx)[-1] == ("2025-01-06T12:00:00+00:00", "skipped", "paused")
    assert "this trigger is paused" in (schedule_runs(ctx)[-1].error_message or "")


def test_redeploys_keep_unchanged_triggers_and_stop_removed_ones(
    ctx: Context, tmp_path: Path
) -> None:
    folder = tmp_path / "w"
    deploy(ctx, folder, ['{cron: "0 * * * *", overlap: allow}'])
    as_if_deployed_at(ctx, MONDAY)
    _, (before,) = triggers.list_triggers(ctx, caller=SYSTEM, worker_name="tick")
    v1 = workers.get_worker(ctx, caller=SYSTEM, name="tick").active_version_id
    scheduler = Scheduler(ctx)

    # 09:00 is due; a redeploy with a changed script and policy lands before the tick.
    (folder / "run.py").write_text("print('tock')\n")
    deploy(ctx, folder, ['{cron: "0 * * * *", overlap: queue}'])
    _, (kept,) = triggers.list_triggers(ctx, caller=SYSTEM, worker_name="tick")
    assert (kept.id, kept.last_fire_at) == (before.id, MONDAY)
    scheduler.tick(MONDAY + timedelta(hours=1, seconds=5))
    deploy(ctx, folder, ['{cron: "0 * * * *", overlap: queue}'])
    scheduler.tick(MONDAY + timedelta(hours=1, seconds=10))
    assert summary(ctx) == [("2025-01-06T09:00:00+00:00", "queued", None)]

    deploy(ctx, folder, [])  # the schedule is removed: it stops
    assert triggers.list_triggers(ctx, caller=SYSTEM, worker_name="tick")[1] == []
    scheduler.tick(MONDAY + timedelta(hours=5))
    assert len(schedule_runs(ctx)) == 1

    # Rolling back brings the schedule back from now on, without back-filling the gap.
    workers.rollback(ctx, caller=SYSTEM, name="tick", version_id=v1)
    _, (back,) = triggers.list_triggers(ctx, caller=SYSTEM, worker_name="tick")
    assert back.id == before.id
    assert back.last_fire_at is not None
    assert back.last_fire_at > MONDAY + timedelta(days=1)  # the real "now" of the rollback
    scheduler.tick(MONDAY + timedelta(hours=6))
    assert len(schedule_runs(ctx)) == 1


def test_a_new_schedule_starts_from_now_without_backfill(ctx: Context, tmp_path: Path) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "* * * * *", catch_up: all}'])
    now = datetime.now(UTC)
    Scheduler(ctx).tick(now)
    assert schedule_runs(ctx) == []
    _, (trigger,) = triggers.list_triggers(ctx, caller=SYSTEM, worker_name="tick")
    listed = trigger_answers.trigger_public(
        ctx, trigger, worker=workers.get_worker(ctx, caller=SYSTEM, name="tick")
    )
    assert listed.timezone == "UTC"
    assert len(listed.next_fires) == 3
    assert listed.next_fires[0].endswith("+00:00")


def test_the_scheduler_thread_sleeps_until_the_tick_and_fires_it_on_time(
    ctx: Context, tmp_path: Path
) -> None:
    deploy(ctx, tmp_path / "w", ['{cron: "* * * * *"}'])
    as_if_deployed_at(ctx, MONDAY)
    tick = MONDAY + timedelta(minutes=1)
    offset = tick - timedelta(seconds=0.5) - datetime.now(UTC)
    runtime = NodeRuntime.of(ctx)
    scheduler = Scheduler(ctx, clock=lambda: datetime.now(UTC) + offset)
    scheduler.start()
    try:
        (run,) = wait_until(lambda: schedule_runs(ctx), timeout=10)
    finally:
        scheduler.stop()
    assert run.scheduled_for == tick
    assert runtime.queued.is_set()  # a local executor is woken at once
    assert timedelta(0) <= run.created_at + offset - tick < timedelta(seconds=1)


def test_a_day_of_missed_minutes_is_recorded_in_a_few_transactions(
    ctx: Context, tmp_path: Path
) -> None:
    # An every-minute schedule after a day down: 1,439 ticks become skipped runs. One
    # transaction each held the scheduler, and every other schedule of the node, for seconds.
    deploy(ctx, tmp_path / "w", ['{cron: "* * * * *", overlap: allow}'])
    as_if_deployed_at(ctx, MONDAY)
    commits: list[object] = []

    def count(connection: object) -> None:
        commits.append(connection)

    sqlalchemy.event.listen(ctx.engine, "commit", count)
    try:
        Scheduler(ctx).tick(MONDAY + timedelta(days=1, seconds=30))
    finally:
        sqlalchemy.event.remove(ctx.engine, "commit", count)
    with session_scope(ctx.engine) as s:
        rows = s.exec(select(Run.status, Run.error_code).where(Run.worker_name == "tick")).all()
    assert len(rows) == 1440
    assert sorted(set(rows)) == [("queued", None), ("skipped", "missed")]
    assert rows.count(("queued", None)) == 1
    assert len(commits) < 20  # the run's own, and a few batches of skipped ticks


def test_a_tick_whose_run_cannot_be_queued_while_the_store_is_away_fires_at_the_next_pass(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails the run's queueing (a database restarting, a lock held past its
    timeout) and is back a moment later: the tick is tried again at the next pass, not
    written off as a skipped run that could not start."""
    deploy(ctx, tmp_path / "w", ['{cron: "*/15 * * * *", catch_up: none}'])
    as_if_deployed_at(ctx, MONDAY)
    create_run = runs.create_run
    failures = [store_unavailable(OperationalError("INSERT", {}, Exception("server closed")))]

    def queue_unless_away(*args: Any, **kwargs: Any) -> Run:
        if failures:
            raise failures.pop()
        return create_run(*args, **kwargs)

    monkeypatch.setattr(runs, "create_run", queue_unless_away)
    scheduler = Scheduler(ctx)
    with pytest.raises(StoreUnavailable):  # the loop tries the pass again a second later
        scheduler.tick(MONDAY + timedelta(minutes=15))
    assert failures == []
    scheduler.tick(MONDAY + timedelta(minutes=15, seconds=1))

    assert summary(ctx) == [("2025-01-06T08:15:00+00:00", "queued", None)]


def test_after_the_clock_steps_back_from_a_day_ahead_the_ticks_fire_when_they_come(
    ctx: Context, tmp_path: Path
) -> None:
    """A node's clock ran a day ahead for a moment (a bad clock source, corrected by NTP):
    that pass judged a day of ticks that had not come yet (missed, one run early) and moved
    the schedule's last fire a day ahead, so after the correction nothing fired for a day.
    Ticks judged before they came are judged again when they come; one that already became
    a run does not run twice."""
    deploy(ctx, tmp_path / "w", ['{cron: "*/15 * * * *", overlap: allow}'])
    as_if_deployed_at(ctx, MONDAY)
    scheduler = Scheduler(ctx)
    scheduler.tick(MONDAY + timedelta(minutes=15))
    ahead = MONDAY + timedelta(days=1, minutes=15)
    scheduler.tick(ahead)  # the clock a day ahead
    early = [r.id for r in schedule_runs(ctx) if r.scheduled_for == ahead]

    drive(
        scheduler, MONDAY + timedelta(minutes=16), MONDAY + timedelta(hours=1), timedelta(minutes=1)
    )

    came = [row for row in summary(ctx) if row[0] <= "2025-01-06T09:00:00+00:00"]
    assert came == [
        ("2025-01-06T08:15:00+00:00", "queued", None),
        ("2025-01-06T08:30:00+00:00", "queued", None),
        ("2025-01-06T08:45:00+00:00", "queued", None),
        ("2025-01-06T09:00:00+00:00", "queued", None),
    ]
    # Of what that pass wrote for times still to come, only the run it started is left.
    later = [
        r
        for r in schedule_runs(ctx)
        if r.scheduled_for and r.scheduled_for > MONDAY + timedelta(hours=1)
    ]
    assert [r.id for r in later] == early
    with session_scope(ctx.engine) as s:
        fires = s.exec(select(TriggerFire.scheduled_for)).all()
    assert len(fires) == 5


@pytest.mark.parametrize("change", ["pause", "remove"])
def test_a_trigger_paused_or_removed_after_the_pass_read_it_makes_no_run_of_the_tick(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The pass read the schedule; a pause of that trigger (or a redeploy removing it)
    commits before the tick's run is queued: the queueing transaction sees it."""
    deploy(ctx, tmp_path / "w", ['{cron: "*/15 * * * *"}'])
    as_if_deployed_at(ctx, MONDAY)
    with session_scope(ctx.engine) as s:
        (trigger_id,) = s.exec(select(Trigger.id).where(Trigger.worker_name == "tick")).all()
    create_run = runs.create_run

    def changed_first(*args: Any, **kwargs: Any) -> Run:
        if change == "pause":
            triggers.set_paused(
                ctx, worker_name="tick", paused=True, trigger_id=trigger_id, caller=SYSTEM
            )
        else:
            deploy(ctx, tmp_path / "w", ['{cron: "*/20 * * * *"}'])
        return create_run(*args, **kwargs)

    monkeypatch.setattr(runs, "create_run", changed_first)
    Scheduler(ctx).tick(MONDAY + timedelta(minutes=15))

    expected = [("2025-01-06T08:15:00+00:00", "skipped", "paused")] if change == "pause" else []
    assert summary(ctx) == expected


@pytest.mark.parametrize("held", ["trigger", "worker"])
def test_a_node_frozen_inside_a_schedule_s_transaction_holds_up_only_that_schedule(
    ctx: Context, tmp_path: Path, held: str
) -> None:
    # Another node froze (SIGSTOP, a paused VM) inside a transaction on schedule "stuck": as
    # it fired its tick (the trigger's row), or as an operator set its worker's state (the
    # worker's row). Its locks stay while it is frozen, however long. This scheduler gives
    # up on that schedule for the pass, fires the others' ticks and goes on; the stuck tick
    # fires once the locks are let go (the node died, or thawed and finished).
    if ctx.engine.dialect.name != "postgresql":
        pytest.skip("row locks of one node held against another: PostgreSQL")
    deploy(ctx, tmp_path / "stuck", ['{cron: "*/15 * * * *"}'], name="stuck")
    deploy(ctx, tmp_path / "free", ['{cron: "*/15 * * * *"}'], name="free")
    as_if_deployed_at(ctx, MONDAY, name="stuck")
    as_if_deployed_at(ctx, MONDAY, name="free")
    tick = MONDAY + timedelta(minutes=15)
    scheduler = Scheduler(ctx)
    frozen = ctx.engine.connect()
    frozen.begin()
    if held == "trigger":
        frozen.execute(
            sqlalchemy.text("SELECT id FROM triggers WHERE worker_name = 'stuck' FOR UPDATE")
        )
    else:
        frozen.execute(sqlalchemy.text("SELECT name FROM workers WHERE name = 'stuck' FOR UPDATE"))
    passes: list[datetime | None] = []
    thread = threading.Thread(target=lambda: passes.append(scheduler.tick(tick)), daemon=True)
    try:
        thread.start()
        wait_until(lambda: passes, timeout=30)
        assert summary(ctx, "free") == [(tick.isoformat(), "queued", None)]
        assert summary(ctx, "stuck") == []
    finally:
        frozen.rollback()
        frozen.close()
        thread.join(timeout=60)
    scheduler.tick(tick + timedelta(seconds=30))
    assert summary(ctx, "stuck") == [(tick.isoformat(), "queued", None)]
    assert summary(ctx, "free") == [(tick.isoformat(), "queued", None)]
