"""`floom nodes`: the nodes sharing the server's store, a thin client of GET /api/v1/nodes."""

from __future__ import annotations

import typer
from rich.text import Text

from floom.cli.common import JsonOpt, open_client
from floom.cli.output import new_table, out, print_json, when

STATE_STYLE = {"live": "green", "lost": "bold red", "stopped": "dim"}


def register(app: typer.Typer) -> None:
    app.command("nodes")(nodes_list)


def nodes_list(as_json: JsonOpt = False) -> None:
    """List the cluster's nodes: state, roles, version, slots in use, last heartbeat; and the
    answering node's warm pools (worker, version, children ready and running, hits, misses)."""
    with open_client() as client:
        items = client.list_nodes()["items"]
        # Warm pools live in a node's memory, not the store: the answering node's own.
        health = client.health()
    warm = health.get("warm") or {}
    for item in items:
        if item["id"] == health.get("node") and warm:
            item["warm"] = warm
    if as_json:
        print_json(items)
        return
    if not items:
        out.print("no node has registered yet")
        return
    table = new_table("NODE", "STATE", "ROLES", "VERSION", "SLOTS", "HEARTBEAT")
    for n in items:
        slots = "-" if n["slots"] is None else f"{n['slots_in_use']}/{n['slots']}"
        table.add_row(
            n["id"],
            Text(n["state"], style=STATE_STYLE.get(n["state"], "")),
            ",".join(n["roles"]),
            n["version"],
            slots,
            f"{when(n['heartbeat_at'])} ({n['silent_seconds']:.0f}s ago)",
        )
    out.print(table)
    if warm.get("enabled"):
        out.print(
            f"warm starts on {health['node']}: {len(warm['pools'])} pools, "
            f"{warm['hits']} hits, {warm['misses']} misses"
        )
        if warm["pools"]:
            pools = new_table("WORKER", "VERSION", "READY", "RUNNING", "HITS", "MISSES", "MiB")
            for pool in warm["pools"]:
                pools.add_row(
                    pool["worker"],
                    pool["version"],
                    str(pool["ready"]),
                    str(pool["running"]),
                    str(pool["hits"]),
                    str(pool["misses"]),
                    f"{pool['rss_bytes'] / 2**20:.0f}",
                )
            out.print(pools)
