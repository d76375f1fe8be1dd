"""An executor node's sandbox uid range must hold the uids its slots' runs take at once (a
networked run holds two: its own and its network helper's; a warm run its own and its warm
process's): a smaller FLOOM_SANDBOX_UID_COUNT is refused at start, naming the count needed,
not when the slots fill up."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from floom.cli.command import exit_on_error
from floom.config import Settings


@pytest.mark.parametrize(("slots", "count"), [(4, 7), (1, 1), (16, 31)])
def test_a_uid_range_smaller_than_two_uids_a_slot_is_refused_naming_the_count_needed(
    slots: int,
    count: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FLOOM_EXECUTOR_SLOTS", str(slots))
    monkeypatch.setenv("FLOOM_SANDBOX_UID_COUNT", str(count))
    monkeypatch.setenv("FLOOM_DATABASE_URL", "postgresql://u:hunter2-password@db/floom")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert "hunter2" not in str(refused.value)
    with pytest.raises(SystemExit) as ended:
        exit_on_error(refused.value)
    assert ended.value.code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "invalid settings: FLOOM_SANDBOX_UID_COUNT is too small" in err
    assert f"needs at least {slots * 2};" in err
    assert "FLOOM_EXECUTOR_SLOTS" in err
    assert "hunter2" not in err
    assert "Traceback" not in err


def test_a_uid_range_of_two_uids_a_slot_is_enough() -> None:
    assert Settings(executor_slots=4, sandbox_uid_count=8).sandbox_uid_count == 8


def test_a_node_that_runs_nothing_needs_no_uids() -> None:
    settings = Settings(roles="api,scheduler", executor_slots=4, sandbox_uid_count=1)
    assert settings.sandbox_uid_count == 1
