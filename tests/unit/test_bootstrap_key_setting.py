"""FLOOM_BOOTSTRAP_API_KEY becomes an admin key that anyone reaching the port can guess at:
a short one (a placeholder, a word) is refused at start, without echoing it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from floom.config import Settings


@pytest.mark.parametrize("key", ["admin", "changeme", "flm_secret", "flm_" + "x" * 27])
def test_a_short_bootstrap_key_is_refused_without_echoing_it(key: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(bootstrap_api_key=key)
    message = refused.value.errors()[0]["msg"]
    assert "openssl rand" in message
    assert key not in message
    # Nor in the error as a whole, as a log line or a trace would print it (pydantic adds
    # the refused value to it unless told not to).
    assert key not in str(refused.value)


@pytest.mark.parametrize("key", ["", "flm_" + "a1" * 14, "flm_bootstrap-token-for-restart-tests"])
def test_no_bootstrap_key_or_a_long_one_is_kept(key: str) -> None:
    assert Settings(bootstrap_api_key=key).bootstrap_api_key == key


def test_no_refused_setting_is_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Settings carry credentials (database URL, keys): a refused one is named, not shown.
    monkeypatch.setenv("FLOOM_PORT", "postgresql://u:hunter2-password@db/floom")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert "port" in str(refused.value)
    assert "hunter2" not in str(refused.value)
