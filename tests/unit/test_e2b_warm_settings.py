"""FLOOM_E2B_WARM* settings: bounded, refused with the setting's name, and what the E2B
backend is built with (nothing is created until a run asks)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from floom.cli.command import exit_on_error
from floom.config import Settings
from floom.sandbox import get_sandbox
from floom.sandbox.e2b.backend import E2BSandbox


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FLOOM_E2B_WARM", "-1"),
        ("FLOOM_E2B_WARM", "65"),
        ("FLOOM_E2B_WARM", "many"),
        ("FLOOM_E2B_WARM_IDLE_SECONDS", "5"),
        ("FLOOM_E2B_WARM_IDLE_SECONDS", "3600"),
        ("FLOOM_E2B_WARM_BUDGET", "0"),
    ],
)
def test_a_bad_e2b_warm_setting_is_refused_naming_it_without_a_traceback(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    with pytest.raises(SystemExit) as ended:
        exit_on_error(refused.value)
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert f"invalid setting {name}" in " ".join(err.split())
    assert "Traceback" not in err


def test_e2b_warm_starts_are_off_by_default_and_built_from_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    default = get_sandbox("e2b", Settings(e2b_api_key="k"))
    assert isinstance(default, E2BSandbox)
    assert default.warm is None
    assert default.warm_stats() is None
    warm = get_sandbox(
        "e2b",
        Settings(e2b_api_key="k", e2b_warm=3, e2b_warm_idle_seconds=60, e2b_warm_budget=5),
    )
    assert isinstance(warm, E2BSandbox)
    assert warm.warm is not None
    stats = warm.warm_stats()
    assert stats is not None
    assert (stats["count"], stats["idle_seconds"], stats["budget"], stats["pools"]) == (
        3,
        60.0,
        5,
        [],
    )
    # Without a key there is no E2B to keep sandboxes in.
    keyless = get_sandbox("e2b", Settings(e2b_warm=3))
    assert isinstance(keyless, E2BSandbox)
    assert keyless.warm is None
