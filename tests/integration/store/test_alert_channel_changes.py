"""A partial change of an alert channel's settings (PATCH, the CLI's `channels update`, MCP's
update_alert_channel) on both stores: it keeps what it does not name, and a change saved by
another caller between its read and its write is merged over, not lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from floom.services.alerts import channels
from floom.services.context import Context
from tests.support.rigs.alerts import mail_host_context

# Its host is checked by the egress guard when saved: a name of these tests' own, resolved to
# loopback, which `ctx` below allows.
MAIL = {"host": "mail.test", "sender": "floom@example.com", "to": ["ops@example.com"]}


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    """The conftest's `ctx`, with MAIL's host resolved to loopback and loopback allowed."""
    with mail_host_context(tmp_path, database_url, "mail.test") as context:
        yield context


def test_a_change_keeps_the_settings_it_does_not_name(ctx: Context) -> None:
    channels.create_channel(ctx, name="mail", kind="email", config=MAIL, caller=SYSTEM)
    row = channels.change_channel(ctx, name="mail", changes={"port": 2525}, caller=SYSTEM)
    assert channels.Channel.of(row).config == {**MAIL, "port": 2525, "starttls": True}


def test_a_change_made_meanwhile_by_another_caller_is_merged_over(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets.set_secret(ctx, name="MAIL_PW", value="mail-password", caller=SYSTEM)
    channels.create_channel(ctx, name="mail", kind="email", config=MAIL, caller=SYSTEM)
    check = channels.check_config
    others: list[str] = []

    def check_while_another_changes(ctx: Context, **kwargs: Any) -> dict[str, Any]:
        # The first check runs between this change's read and its write: another caller's
        # change lands there.
        if not others:
            others.append("port")
            channels.update_channel(ctx, name="mail", config={**MAIL, "port": 2525}, caller=SYSTEM)
        return check(ctx, **kwargs)

    monkeypatch.setattr(channels, "check_config", check_while_another_changes)
    login = {"username": "floom", "password_secret": "MAIL_PW"}
    row = channels.change_channel(ctx, name="mail", changes=login, caller=SYSTEM)
    config = channels.Channel.of(row).config
    assert config["port"] == 2525  # the other caller's change is kept
    assert config["username"] == "floom"
    stored = channels.get_channel(ctx, name="mail", caller=SYSTEM)
    assert channels.Channel.of(stored).config == config
