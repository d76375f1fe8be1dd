"""UI sessions and the nodes list with the nodes' own clocks ten minutes apart, on one
PostgreSQL: a session opened through one node is judged by any other, and a node's liveness
by any node, on the database's clock. SQLite is one host and one clock: PostgreSQL only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from floom.errors import Unauthorized
from floom.services.access import keys, sessions
from floom.services.access.principal import SYSTEM, Principal
from floom.services.context import Context
from floom.services.ops import nodes
from floom.vocabulary import NodeState
from tests.support.clocks import SKEW, node_clock
from tests.support.harness import fast_settings, wait_until

OFFSETS = {"behind": -SKEW, "ahead": SKEW}
BOTH_WAYS = pytest.mark.parametrize(("first", "second"), [("behind", "ahead"), ("ahead", "behind")])


@pytest.fixture
def ctx(tmp_path: Path, database_url: str) -> Iterator[Context]:
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite is one host: its nodes share one clock")
    context = Context.open(fast_settings(tmp_path / "data", database_url, lease_seconds=60.0))
    yield context
    context.engine.dispose()


@BOTH_WAYS
def test_a_ui_session_lasts_its_lifetime_on_the_database_clock_whichever_node_judges(
    ctx: Context, monkeypatch: pytest.MonkeyPatch, first: str, second: str
) -> None:
    _, key = keys.create_key(ctx, caller=SYSTEM, scopes=["read"], name="ui")
    monkeypatch.setattr(sessions, "SESSION_LIFETIME", timedelta(minutes=5))
    with node_clock(OFFSETS[first]):
        _, live = sessions.sign_in(ctx, api_key=key)
    with node_clock(OFFSETS[second]):
        assert sessions.session_for(ctx, token=live).key.id  # not ended minutes early
    monkeypatch.setattr(sessions, "SESSION_LIFETIME", timedelta(seconds=1))
    with node_clock(OFFSETS[first]):
        _, short = sessions.sign_in(ctx, api_key=key)

    def ended() -> bool:
        with node_clock(OFFSETS[second]):
            try:
                sessions.session_for(ctx, token=short)
            except Unauthorized:
                return True
            return False

    wait_until(ended, timeout=20)  # nor minutes late


def test_each_node_sees_the_other_live_while_it_beats_whichever_clock_is_off(
    ctx: Context,
) -> None:
    behind, ahead = replace(ctx, node_id="behind"), replace(ctx, node_id="ahead")
    for node, offset in ((behind, -SKEW), (ahead, SKEW)):
        with node_clock(offset):
            nodes.register(node, slots=None)
            nodes.heartbeat(node, slots_in_use=0)
    _, token = keys.create_key(ctx, caller=SYSTEM, scopes=["read"], name="reader")
    caller = Principal.of_key(keys.authenticate(ctx, token))
    for offset in (-SKEW, SKEW):
        with node_clock(offset):
            states = {v.node.id: v.state for v in nodes.list_nodes(ctx, caller=caller)}
            assert states["behind"] == states["ahead"] == NodeState.LIVE
            assert {"behind", "ahead"} <= set(nodes.live_executor_ids(ctx))
