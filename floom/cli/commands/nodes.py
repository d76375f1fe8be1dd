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
    """List the cluster's nodes: state, roles, version, slots in use, last heartbeat."""
    with open_client() as client:
        items = client.list_nodes()["items"]
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
