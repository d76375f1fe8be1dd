"""`floom triggers`, `floom pause`, `floom resume`, `floom deliveries` and
`floom replay-delivery`: thin clients of the triggers REST API."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.text import Text

from floom.cli.commands.runs import watch_run
from floom.cli.common import JsonOpt, open_client
from floom.cli.output import new_table, out, print_json, when
from floom.schemas.triggers import TriggerListing, TriggerPublic
from floom.vocabulary import TriggerKind

TriggerOpt = Annotated[
    str | None, typer.Option("--trigger", metavar="ID", help="only this trigger of the worker")
]
OUTCOME_STYLES = {
    "run": "green",
    "paused": "yellow",
    "unmatched": "dim",
    "input_invalid": "red",
    "start_failed": "red",
}


def register(app: typer.Typer) -> None:
    """Add the trigger commands to the floom command."""
    app.command("triggers")(list_triggers)
    app.command("pause")(pause)
    app.command("resume")(resume)
    app.command("deliveries")(list_deliveries)
    app.command("replay-delivery")(replay_delivery)


def _details(t: TriggerPublic) -> str:
    config = t.config
    if t.kind == TriggerKind.SCHEDULE:
        return (
            f"{config.get('cron')}  overlap {config.get('overlap')}, "
            f"catch_up {config.get('catch_up')}"
        )
    if t.kind == TriggerKind.WEBHOOK:
        secret = config.get("secret")
        state = "" if t.secret_set is not False else f" (secret {secret} not set!)"
        return f"POST {t.url}  {config.get('signature')} signature{state}"
    if t.kind == TriggerKind.COMPOSIO:
        parts = [str(config.get("event"))]
        if config.get("connected_account"):
            parts.append(f"account {config['connected_account']}")
        if config.get("filters"):
            parts.append(f"filters {json.dumps(config['filters'])}")
        return "  ".join(parts)
    return json.dumps(config)


def _print_listing(listing: TriggerListing) -> None:
    worker = listing.worker
    if listing.paused:
        out.print(Text(f"{worker} is paused: schedules and webhooks do not start runs", "yellow"))
    if not listing.items:
        out.print(f"{worker} has no triggers: declare them under triggers: in worker.yml")
        return
    table = new_table("TRIGGER", "KIND", "STATE", "DETAILS")
    for t in listing.items:
        if t.paused:
            state = Text("paused", "yellow")
        elif not t.active:
            state = Text("paused with its worker", "yellow")
        else:
            state = Text("active", "green")
        table.add_row(t.id, t.kind, state, _details(t))
    out.print(table)
    for t in listing.items:
        if t.next_fires:
            out.print(Text(f"next fires of {t.id} ({t.timezone}):"))
            for fire in t.next_fires:
                out.print(Text(f"  {fire}"))


def list_triggers(
    worker: Annotated[str, typer.Argument(help="worker name")], as_json: JsonOpt = False
) -> None:
    """List a worker's triggers; schedules with their next three fire times in their timezone."""
    with open_client() as client:
        listing = client.list_triggers(worker)
    if as_json:
        print_json(listing)
    else:
        _print_listing(listing)


WorkerArg = Annotated[str, typer.Argument(help="worker name")]


def pause(worker: WorkerArg, trigger: TriggerOpt = None) -> None:
    """Pause a worker (or one trigger): its ticks and webhooks are recorded, not run."""
    _set_paused(worker, trigger, paused=True)


def resume(worker: WorkerArg, trigger: TriggerOpt = None) -> None:
    """Resume a worker (or one trigger); ticks skipped meanwhile are not run."""
    _set_paused(worker, trigger, paused=False)


def _set_paused(worker: str, trigger: str | None, *, paused: bool) -> None:
    with open_client() as client:
        client.set_paused(worker, paused=paused, trigger_id=trigger)
    what = f"trigger {trigger} of {worker}" if trigger else worker
    out.print(Text(f"{what} {'paused' if paused else 'resumed'}"))


def list_deliveries(
    worker: Annotated[str, typer.Argument(help="worker name")],
    limit: Annotated[int, typer.Option(min=1, max=500, help="deliveries per page")] = 20,
    cursor: Annotated[str | None, typer.Option(help="continue after this page")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List a worker's webhook and Composio deliveries, newest first."""
    with open_client() as client:
        page = client.list_deliveries(worker, cursor=cursor, limit=limit)
    if as_json:
        print_json(page)
        return
    if not page.items:
        out.print(f"no deliveries to {worker} yet")
        return
    table = new_table("DELIVERY", "RECEIVED", "SOURCE", "EVENT", "OUTCOME", "RUN", "SENDER ID")
    for d in page.items:
        table.add_row(
            d.id,
            when(d.received_at),
            d.source,
            d.event or "-",
            Text(d.outcome, OUTCOME_STYLES.get(d.outcome, "")),
            d.run_id or "-",
            d.delivery_id or "-",
        )
    out.print(table)
    if page.next_cursor:
        out.print(Text(f"more: floom deliveries {worker} --cursor {page.next_cursor}", style="dim"))


def replay_delivery(
    delivery_id: Annotated[str, typer.Argument(help="delivery id (see `floom deliveries`)")],
    force: Annotated[
        bool,
        typer.Option("--force", help="run even though the worker is paused (a deploy-scoped key)"),
    ] = False,
    wait: Annotated[bool, typer.Option("--wait", help="follow the run until it ends")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a stored delivery again, as a new run."""
    with open_client() as client:
        started = client.replay_delivery(delivery_id, force=force)
        if wait:
            watch_run(client, started, as_json=as_json, timeout=None)
        elif as_json:
            print_json(started)
        else:
            out.print(Text(started.id))
