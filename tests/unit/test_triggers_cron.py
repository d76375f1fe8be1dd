"""Cron fire times in a timezone, DST rules, and how worker.yml's triggers are checked."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from floom.hints.cli import written
from floom.manifest.load import check_manifest
from floom.services.triggers.schedules import NextFireCache
from floom.store.triggers import Trigger
from floom.triggers import cron
from floom.triggers.spec import ScheduleSpec, WebhookSpec, parse_duration, trigger_key
from floom.vocabulary import TriggerKind

BERLIN = cron.zone("Europe/Berlin")


def fires(expr: str, tz: str, after: datetime, count: int) -> list[str]:
    zone = cron.zone(tz)
    times = cron.next_fire_times(cron.normalise(expr), zone, after=after, count=count)
    return [t.astimezone(zone).isoformat() for t in times]


def test_sunday_is_both_0_and_7_and_names_ranges_and_steps_work() -> None:
    after = datetime(2024, 3, 1, tzinfo=UTC)  # a Friday
    sunday = ["2024-03-03T09:00:00+00:00"]
    assert fires("0 9 * * 0", "UTC", after, 1) == sunday
    assert fires("0 9 * * 7", "UTC", after, 1) == sunday
    assert fires("0 9 * * sun", "UTC", after, 1) == sunday
    assert fires("0 9 * * mon-fri", "UTC", after, 3) == [
        "2024-03-01T09:00:00+00:00",
        "2024-03-04T09:00:00+00:00",
        "2024-03-05T09:00:00+00:00",
    ]
    assert fires("*/20 9-10 * * *", "UTC", after, 4) == [
        "2024-03-01T09:00:00+00:00",
        "2024-03-01T09:20:00+00:00",
        "2024-03-01T09:40:00+00:00",
        "2024-03-01T10:00:00+00:00",
    ]
    assert fires("0 0 L * *", "UTC", after, 2) == [
        "2024-03-31T00:00:00+00:00",
        "2024-04-30T00:00:00+00:00",
    ]
    assert fires("@daily", "UTC", after, 1) == ["2024-03-02T00:00:00+00:00"]


def test_weekday_numbers_are_cron_s_not_apscheduler_s() -> None:
    # APScheduler 3's from_crontab reads 0 as Monday: floom translates before handing over.
    after = datetime(2024, 3, 1, tzinfo=UTC)  # a Friday
    assert fires("0 9 * * 1", "UTC", after, 1) == ["2024-03-04T09:00:00+00:00"]  # a Monday
    assert fires("0 9 * * 6", "UTC", after, 1) == ["2024-03-02T09:00:00+00:00"]  # a Saturday
    assert fires("0 9 * * 5-7", "UTC", after, 3) == [
        "2024-03-01T09:00:00+00:00",
        "2024-03-02T09:00:00+00:00",
        "2024-03-03T09:00:00+00:00",
    ]
    assert fires("0 9 * * */3", "UTC", after, 3) == [  # Sunday, Wednesday, Saturday
        "2024-03-02T09:00:00+00:00",
        "2024-03-03T09:00:00+00:00",
        "2024-03-06T09:00:00+00:00",
    ]
    assert fires("0 9 * * 5L", "UTC", after, 1) == ["2024-03-29T09:00:00+00:00"]
    assert fires("0 9 * * 0#2", "UTC", after, 1) == ["2024-03-10T09:00:00+00:00"]


def test_a_day_matches_either_day_field_when_both_are_restricted_as_in_vixie_cron() -> None:
    after = datetime(2024, 3, 1, tzinfo=UTC)  # a Friday
    # The 13th or any Friday.
    assert fires("0 0 13 * 5", "UTC", after, 3) == [
        "2024-03-08T00:00:00+00:00",
        "2024-03-13T00:00:00+00:00",
        "2024-03-15T00:00:00+00:00",
    ]
    # A field starting with * is not a restriction: every odd day that is a Monday.
    assert fires("0 0 */2 * 1", "UTC", after, 2) == [
        "2024-03-11T00:00:00+00:00",
        "2024-03-25T00:00:00+00:00",
    ]


def test_an_expression_that_never_fires_is_known_at_once() -> None:
    after = datetime(2024, 3, 1, tzinfo=UTC)
    assert fires("0 0 30 2 *", "UTC", after, 1) == []
    assert fires("0 0 29 2 *", "UTC", after, 2) == [
        "2028-02-29T00:00:00+00:00",
        "2032-02-29T00:00:00+00:00",
    ]


def test_fire_times_are_wall_clock_times_of_the_trigger_timezone() -> None:
    after = datetime(2024, 3, 29, tzinfo=UTC)
    times = cron.next_fire_times("0 9 * * *", BERLIN, after=after, count=4)
    # 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC from March 31st (summer time).
    assert [t.isoformat() for t in times] == [
        "2024-03-29T08:00:00+00:00",
        "2024-03-30T08:00:00+00:00",
        "2024-03-31T07:00:00+00:00",
        "2024-04-01T07:00:00+00:00",
    ]


def test_a_time_in_the_spring_forward_gap_fires_once_at_the_next_valid_time() -> None:
    after = datetime(2024, 3, 29, 12, tzinfo=UTC)
    assert fires("30 2 * * *", "Europe/Berlin", after, 3) == [
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:00:00+02:00",  # 02:30 does not exist that night
        "2024-04-01T02:30:00+02:00",
    ]
    # Every quarter hour: the four times inside the gap collapse into one fire at 03:00.
    night = datetime(2024, 3, 31, 0, 30, tzinfo=UTC)
    assert fires("*/15 * * * *", "Europe/Berlin", night, 4) == [
        "2024-03-31T01:45:00+01:00",
        "2024-03-31T03:00:00+02:00",
        "2024-03-31T03:15:00+02:00",
        "2024-03-31T03:30:00+02:00",
    ]


def test_a_time_in_the_repeated_autumn_hour_fires_once() -> None:
    after = datetime(2024, 10, 25, 12, tzinfo=UTC)
    assert fires("30 2 * * *", "Europe/Berlin", after, 3) == [
        "2024-10-26T02:30:00+02:00",
        "2024-10-27T02:30:00+02:00",  # not again at 02:30+01:00
        "2024-10-28T02:30:00+01:00",
    ]
    night = datetime(2024, 10, 26, 23, 0, tzinfo=UTC)
    assert fires("*/30 * * * *", "Europe/Berlin", night, 6) == [
        "2024-10-27T01:30:00+02:00",
        "2024-10-27T02:00:00+02:00",
        "2024-10-27T02:30:00+02:00",
        "2024-10-27T03:00:00+01:00",
        "2024-10-27T03:30:00+01:00",
        "2024-10-27T04:00:00+01:00",
    ]
    # Asked from inside the second pass of the hour, the next fire is after it.
    inside = datetime(2024, 10, 27, 1, 10, tzinfo=UTC)  # 02:10+01:00
    assert fires("*/30 * * * *", "Europe/Berlin", inside, 1) == ["2024-10-27T03:00:00+01:00"]


@pytest.mark.parametrize(
    "expr",
    [
        "* * * * * *",
        "R * * * *",
        "H * * * *",
        "60 * * * *",
        "0 9 * * funday",
        "@reboot",
        "0 9 15W * *",
        "0 9 * * 5-1",
    ],
)
def test_expressions_that_are_not_standard_5_field_cron_are_refused(expr: str) -> None:
    with pytest.raises(cron.CronError):
        cron.normalise(expr)


def test_a_trigger_keeps_its_key_when_only_its_policies_change() -> None:
    a = ScheduleSpec(cron="0 9 * * *", timezone="UTC", overlap="skip")
    b = ScheduleSpec(cron="0 9 * * *", timezone="UTC", overlap="queue", catch_up="all")
    c = ScheduleSpec(cron="0 10 * * *", timezone="UTC")
    assert trigger_key(a) == trigger_key(b) != trigger_key(c)
    assert trigger_key(WebhookSpec(secret="A")) == trigger_key(WebhookSpec(secret="B"))
    assert parse_duration("24h") == 86400
    assert parse_duration("30m") == 1800
    assert parse_duration(90) == 90


def problems_of(text: str) -> dict[str, str]:
    manifest, problems = check_manifest(text, ["run.py"])
    assert manifest is None
    return {p.path: p.message + " | " + written(p.hint or "") for p in problems}


def test_every_trigger_setting_is_checked_with_a_hint() -> None:
    problems = problems_of(
        """
name: w
inputs:
  topic: {type: string, required: true}
triggers:
  - schedule: {cron: "0 9 * * mon-fry", timezone: Europe/Berlim, overlap: skipp}
  - schedule: {cron: "0 0 30 2 *", inputs: {topic: x}, catch_up_window: 30d}
  - schedule: {cron: "0 9 * * *"}
  - webhook: {signature: gitlab, secret: hook-secret}
  - composio: {filters: {repo: acme/api}}
"""
    )
    assert "triggers[0].schedule.cron" in problems
    assert "did you mean 'Europe/Berlin'?" in problems["triggers[0].schedule.timezone"]
    assert "did you mean 'skip'?" in problems["triggers[0].schedule.overlap"]
    assert "never fires" in problems["triggers[1].schedule.cron"]
    assert "triggers[1].schedule.catch_up_window" in problems
    assert "topic" in problems["triggers[2].schedule.inputs"]
    assert "triggers[3].webhook.signature" in problems
    assert "not a secret name" in problems["triggers[3].webhook.secret"]
    assert "triggers[4].composio.event" in problems


def test_a_webhook_needs_an_event_input_or_mapped_inputs() -> None:
    nowhere = problems_of("name: w\ntriggers:\n  - webhook: {secret: HOOK}\n")
    assert "declare an 'event' input" in nowhere["triggers[0].webhook"]
    bad_type = problems_of("name: w\ninputs: {event: integer}\ntriggers:\n  - webhook: {secret: H}")
    assert "object or string" in bad_type["inputs.event"]
    unmapped = problems_of(
        "name: w\ninputs: {event: object, repo: {type: string, required: true}}\n"
        "triggers:\n  - webhook: {secret: HOOK, inputs: {nope: a.b}}\n"
    )
    assert "not a declared input" in unmapped["triggers[0].webhook.inputs.nope"]
    assert "'repo' gets no value" in unmapped["triggers[0].webhook.inputs"]
    twice = problems_of(
        "name: w\ninputs: {event: object}\n"
        "triggers:\n  - webhook: {secret: A}\n  - webhook: {secret: B}\n"
    )
    assert "one webhook" in twice["triggers[1].webhook"]
    manifest, problems = check_manifest(
        "name: w\ninputs: {repo: string}\n"
        "triggers:\n  - webhook: {secret: HOOK, inputs: {repo: repository.full_name}}\n",
        ["run.py"],
    )
    assert problems == []
    assert manifest is not None


def test_a_stored_schedule_this_floom_cannot_compute_never_fires_and_holds_up_nothing() -> None:
    stored = Trigger(
        id="trg_old",
        worker_name="w",
        kind=TriggerKind.SCHEDULE,
        key="k",
        config_json="{}",
        created_at=datetime(2024, 3, 1, tzinfo=UTC),
    )
    spec = ScheduleSpec(cron="0 9 15W * *", timezone="UTC")  # accepted by an older floom
    assert NextFireCache().next_after(stored, spec, datetime(2024, 3, 1, tzinfo=UTC)) is None


@pytest.mark.parametrize(
    "name", ["localtime", "posixrules", "right/Europe/Berlin", "posix/Europe/Berlin"]
)
def test_a_timezone_that_is_not_the_same_zone_on_every_node_is_refused(name: str) -> None:
    """`localtime` is each host's own zone (a link to /etc/localtime): two scheduler nodes set
    to different zones would fire one tick at two instants, twice. `right/` zones count leap
    seconds (fire times 27 s off), `posix/` ones are copies that not every host ships."""
    with pytest.raises(cron.CronError) as refused:
        cron.zone(name)
    assert refused.value.hint
    problems = problems_of(
        f'name: w\ntriggers:\n  - schedule: {{cron: "0 9 * * *", timezone: {name}}}\n'
    )
    assert list(problems) == ["triggers[0].schedule.timezone"]
    assert "Europe/Berlin" in problems["triggers[0].schedule.timezone"]


def test_an_expression_too_long_for_any_cron_line_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(cron.CronError) as refused:
        cron.normalise("0," * 5_000 + "0 * * * *")
    assert "10009 characters long; at most 512" in refused.value.message
    assert len(refused.value.message) < 200
    assert refused.value.hint


def test_a_weekday_position_listed_again_adds_no_work_for_the_scheduler() -> None:
    # Each distinct position is a trigger the scheduler asks at every fire time: listed 120
    # times, `1#1` made 120 of them (and a catch-up pass 120 times slower).
    text = cron.normalise("0 9 * * " + ",".join(["1#1", "mon#1", "1L", "1l"] * 30))
    matches = cron.trigger(text)
    assert len(getattr(matches, "triggers", [matches])) == 2
    assert fires(text, "UTC", datetime(2025, 1, 1, tzinfo=UTC), 3) == [
        "2025-01-06T09:00:00+00:00",
        "2025-01-27T09:00:00+00:00",
        "2025-02-03T09:00:00+00:00",
    ]


@pytest.mark.parametrize("expr", ["0 9 * * mon\x1b[31m", "0\u202e 9 * * *", "0 9 * * m\u00f6n"])
def test_a_refused_expression_is_quoted_with_its_control_characters_escaped(expr: str) -> None:
    with pytest.raises(cron.CronError) as refused:
        cron.normalise(expr)
    assert refused.value.message.isprintable()
