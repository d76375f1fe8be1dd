"""Alert rules as worker.yml and the REST API write them: checked against the event catalogue,
each problem at its path; families and * match as documented."""

from __future__ import annotations

from floom.manifest.alerts import EVENTS, check_alerts, matches
from floom.manifest.schema import Problem


def test_a_worker_rule_is_kept_as_written_with_recovery_on_by_default() -> None:
    out: list[Problem] = []
    clean = check_alerts(
        [{"events": ["run.failed", "schedule.*"], "channels": ["ops"]}], "alerts", out
    )
    assert out == []
    assert clean == [
        {"events": ["run.failed", "schedule.*"], "channels": ["ops"], "recovery": True}
    ]


def test_every_problem_of_a_rule_is_named_at_its_path() -> None:
    out: list[Problem] = []
    raw = [{"events": ["run.fialed", "node.lost"], "channels": ["Ops", "ops"], "extra": 1}]
    assert check_alerts(raw, "alerts", out) is None
    found = {p.path: p for p in out}
    assert found["alerts[0].events[0]"].hint == "did you mean 'run.failed'?"
    assert "not about a worker" in found["alerts[0].events[1]"].message
    assert "alerts[0].channels[0]" in found
    assert "alerts[0].extra" in found


def test_a_rule_without_events_or_channels_or_as_a_mapping_is_refused() -> None:
    for raw, path in (
        ([{"channels": ["ops"]}], "alerts[0].events"),
        ([{"events": ["run.failed"], "channels": []}], "alerts[0].channels"),
        ({"events": ["run.failed"]}, "alerts"),
        (
            [{"events": ["run.failed"], "channels": ["ops"], "recovery": "yes"}],
            "alerts[0].recovery",
        ),
    ):
        out: list[Problem] = []
        assert check_alerts(raw, "alerts", out) is None
        assert path in {p.path for p in out}, (raw, out)


def test_patterns_match_an_event_its_family_or_everything() -> None:
    assert matches("run.failed", "run.failed")
    assert not matches("run.failed", "run.timed_out")
    assert matches("run.*", "run.timed_out")
    assert not matches("run.*", "schedule.missed")
    assert all(matches("*", kind) for kind in EVENTS)
