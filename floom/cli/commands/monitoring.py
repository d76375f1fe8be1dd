"""Who hears about the cluster: `floom nodes` (the nodes sharing the store) and `floom alerts`
(channels, rules, deliveries, test sends, the run-callback key); thin clients of
GET /api/v1/nodes and /api/v1/alerts."""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
from rich.text import Text

from floom.cli.common import JsonOpt, open_client
from floom.cli.output import new_table, out, print_json, when
from floom.schemas.alerts import ChannelChange, DeliveryQuery, RuleCreate
from floom.schemas.health import WarmHealth

STATE_STYLE = {"live": "green", "lost": "bold red", "stopped": "dim"}
DELIVERY_STYLE = {
    "delivered": "green",
    "pending": "yellow",
    "failed": "bold red",
    "throttled": "dim",
}

alerts_app = typer.Typer(
    help="Alerts: channels (webhook, Slack, email), rules, deliveries; a test send."
)
channels_app = typer.Typer(help="Alert channels: list (no subcommand), add, update, rm.")
rules_app = typer.Typer(help="Global alert rules: list (no subcommand), add, enable, disable, rm.")


def register(app: typer.Typer) -> None:
    app.command("nodes")(nodes_list)
    app.add_typer(alerts_app, name="alerts", no_args_is_help=True)
    alerts_app.add_typer(channels_app, name="channels")
    alerts_app.add_typer(rules_app, name="rules")


def nodes_list(as_json: JsonOpt = False) -> None:
    """List the cluster's nodes: state, roles, version, slots in use, last heartbeat.

    Also each node's warm pools (worker, version, children ready and running, hits, misses)
    and its E2B sandboxes created ahead of runs (FLOOM_E2B_WARM): the answering node's as
    they are now, the others' as their last heartbeat saw them."""
    with open_client() as client:
        nodes = client.list_nodes().items
        health = client.health()
    # The answering node's own pools, live rather than as of its last heartbeat.
    nodes = [
        n.model_copy(update={"warm": health.warm}) if n.id == health.node else n for n in nodes
    ]
    if as_json:
        print_json([n.to_json() for n in nodes])
        return
    if not nodes:
        out.print("no node has registered yet")
        return
    table = new_table("NODE", "STATE", "ROLES", "VERSION", "SLOTS", "HEARTBEAT")
    for n in nodes:
        slots = "-" if n.slots is None else f"{n.slots_in_use}/{n.slots}"
        table.add_row(
            n.id,
            Text(n.state, style=STATE_STYLE.get(n.state, "")),
            ",".join(n.roles),
            n.version,
            slots,
            f"{when(n.heartbeat_at)} ({n.silent_seconds:.0f}s ago)",
        )
    out.print(table)
    for n in nodes:
        if n.warm is not None:
            _print_warm(n.id, n.warm)


def _print_warm(node: str, warm: WarmHealth) -> None:
    if warm.enabled:
        out.print(
            f"warm starts on {node}: {len(warm.pools)} pools, "
            f"{warm.hits} hits, {warm.misses} misses"
        )
        if warm.pools:
            pools = new_table("WORKER", "VERSION", "READY", "RUNNING", "HITS", "MISSES", "MiB")
            for pool in warm.pools:
                pools.add_row(
                    pool.worker,
                    pool.version,
                    str(pool.ready),
                    str(pool.running),
                    str(pool.hits),
                    str(pool.misses),
                    f"{pool.rss_bytes / 2**20:.0f}",
                )
            out.print(pools)
    e2b = warm.e2b
    if e2b:
        out.print(
            f"E2B sandboxes ready ahead on {node}: {len(e2b.pools)} pools, "
            f"{e2b.hits} hits, {e2b.misses} misses (budget {e2b.budget})"
        )
        if e2b.pools:
            boxes = new_table(
                "TEMPLATE", "NETWORK", "READY", "CREATING", "RUNNING", "HITS", "MISSES"
            )
            for box in e2b.pools:
                boxes.add_row(
                    box.template,
                    "on" if box.network else "off",
                    *(str(n) for n in (box.ready, box.creating, box.running, box.hits, box.misses)),
                )
            out.print(boxes)


# -- channels ----------------------------------------------------------------------------------


@channels_app.callback(invoke_without_command=True)
def channels(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List alert channels (settings name secrets, never their values)."""
    if ctx.invoked_subcommand is not None:
        return
    with open_client() as client:
        items = client.list_alert_channels().items
    if as_json:
        print_json([c.to_json() for c in items])
        return
    if not items:
        out.print("no alert channel yet: `floom alerts channels add NAME --kind webhook ...`")
        return
    table = new_table("CHANNEL", "KIND", "SETTINGS")
    for c in items:
        settings = ", ".join(f"{k}={v}" for k, v in c.config.items())
        table.add_row(c.name, c.kind, settings)
    out.print(table)


# A channel's settings, as `channels add` and `channels update` take them.
UrlOpt = Annotated[str | None, typer.Option("--url", help="webhook: the receiver's URL")]
SecretOpt = Annotated[
    str | None, typer.Option("--secret", help="webhook: the secret holding its whsec_ key")
]
UrlSecretOpt = Annotated[
    str | None, typer.Option("--url-secret", help="slack: the secret holding its URL")
]
HostOpt = Annotated[str | None, typer.Option("--host", help="email: the SMTP server")]
UsernameOpt = Annotated[str | None, typer.Option("--username", help="email: login")]
PasswordSecretOpt = Annotated[
    str | None, typer.Option("--password-secret", help="email: the secret with the password")
]
SenderOpt = Annotated[str | None, typer.Option("--from", help="email: the From address")]


@channels_app.command("add")
def channel_add(
    name: Annotated[str, typer.Argument(help="a lowercase slug, e.g. ops")],
    kind: Annotated[str, typer.Option("--kind", help="webhook, slack or email")],
    url: UrlOpt = None,
    secret: SecretOpt = None,
    url_secret: UrlSecretOpt = None,
    host: HostOpt = None,
    port: Annotated[int | None, typer.Option("--port", help="email: its port (587)")] = None,
    no_starttls: Annotated[
        bool, typer.Option("--no-starttls", help="email: send without STARTTLS (local relays)")
    ] = False,
    username: UsernameOpt = None,
    password_secret: PasswordSecretOpt = None,
    sender: SenderOpt = None,
    to: Annotated[
        list[str] | None, typer.Option("--to", help="email: a recipient (repeat for more)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Add an alert channel; its credentials are named secrets (`floom secrets set NAME`)."""
    given: dict[str, Any] = {
        "url": url,
        "secret": secret,
        "url_secret": url_secret,
        "host": host,
        "port": port,
        "starttls": False if no_starttls else None,
        "username": username,
        "password_secret": password_secret,
        "sender": sender,
        "to": to or None,
    }
    config = {k: v for k, v in given.items() if v is not None}
    with open_client() as client:
        channel = client.add_alert_channel(name, kind, config)
    if as_json:
        print_json(channel)
        return
    out.print(f"added {channel.kind} channel {channel.name}; try it: floom alerts test {name}")


@channels_app.command("update")
def channel_update(
    name: Annotated[str, typer.Argument(help="the channel")],
    url: UrlOpt = None,
    secret: SecretOpt = None,
    url_secret: UrlSecretOpt = None,
    host: HostOpt = None,
    port: Annotated[int | None, typer.Option("--port", help="email: its port")] = None,
    starttls: Annotated[
        bool | None,
        typer.Option("--starttls/--no-starttls", help="email: STARTTLS before sending"),
    ] = None,
    username: UsernameOpt = None,
    password_secret: PasswordSecretOpt = None,
    sender: SenderOpt = None,
    to: Annotated[
        list[str] | None,
        typer.Option("--to", help="email: a recipient (repeat for more; replaces the list)"),
    ] = None,
    unset: Annotated[
        list[str] | None,
        typer.Option(
            "--unset",
            metavar="SETTING",
            help="remove an optional setting, as `channels` shows it, e.g. "
            "--unset username --unset password_secret (repeat for more)",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Change some of a channel's settings (the others stay); checked as when it was added.

    `--unset SETTING` removes one (an email channel's login, say); the server refuses a
    setting the channel's kind does not have, or one it needs."""
    given: dict[str, Any] = {
        "url": url,
        "secret": secret,
        "url_secret": url_secret,
        "host": host,
        "port": port,
        "starttls": starttls,
        "username": username,
        "password_secret": password_secret,
        "sender": sender,
        "to": to or None,
    }
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    for key in _unset_keys(unset or [], given=changes):
        changes[key] = None  # null removes it (PATCH's merge)
    if not changes:
        raise typer.BadParameter("give at least one setting to change, e.g. --url or --unset")
    with open_client() as client:
        channel = client.change_alert_channel(name, ChannelChange(config=changes))
    if as_json:
        print_json(channel)
        return
    changed = sorted(k for k, v in changes.items() if v is not None)
    removed = sorted(k for k, v in changes.items() if v is None)
    said = [", ".join(changed)] if changed else []
    said += [f"removed {', '.join(removed)}"] if removed else []
    out.print(f"updated channel {name}: {'; '.join(said)}")


def _unset_keys(names: list[str], *, given: dict[str, Any]) -> list[str]:
    """The settings `--unset` names, spelt as the server's keys (`password-secret` and the
    option `--from` are taken too); one also given a value is refused, as neither wins."""
    keys = []
    for name in names:
        key = "sender" if name == "from" else name.replace("-", "_")
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", key):
            raise typer.BadParameter(
                f"{name[:80]!r} is not a setting name; e.g. --unset username", param_hint="--unset"
            )
        if key in given:
            raise typer.BadParameter(
                f"{key} is both given a value and unset; give one of them", param_hint="--unset"
            )
        keys.append(key)
    return keys


@channels_app.command("rm")
def channel_rm(name: Annotated[str, typer.Argument(help="the channel")]) -> None:
    """Delete an alert channel (rules naming it skip it)."""
    with open_client() as client:
        client.delete_alert_channel(name)
    out.print(f"deleted channel {name}")


@alerts_app.command("test")
def send_test_alert(
    name: Annotated[str, typer.Argument(help="the channel")], as_json: JsonOpt = False
) -> None:
    """Send a test alert to a channel now; exit 1 with the reason if it was not delivered."""
    with open_client() as client:
        delivery = client.test_alert_channel(name)
    if as_json:
        print_json(delivery)
        return
    out.print(f"test alert delivered to {name} ({delivery.id})")


# -- rules -------------------------------------------------------------------------------------


@rules_app.callback(invoke_without_command=True)
def rules(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the global alert rules (a worker's own are in its worker.yml, `alerts:`)."""
    if ctx.invoked_subcommand is not None:
        return
    with open_client() as client:
        items = client.list_alert_rules().items
    if as_json:
        print_json([r.to_json() for r in items])
        return
    if not items:
        out.print(
            "no global alert rule: `floom alerts rules add NAME --event run.failed --channel ops`"
        )
        return
    table = new_table("RULE", "WORKER", "EVENTS", "CHANNELS", "RECOVERY", "ENABLED")
    for r in items:
        table.add_row(
            r.name,
            r.worker or "(all)",
            ", ".join(r.events),
            ", ".join(r.channels),
            "yes" if r.recovery else "no",
            "yes" if r.enabled else Text("no", style="dim"),
        )
    out.print(table)


@rules_app.command("add")
def rule_add(
    name: Annotated[str, typer.Argument(help="a lowercase slug, e.g. failures")],
    events: Annotated[
        list[str], typer.Option("--event", help="run.failed, schedule.*, * ... (repeat for more)")
    ],
    channels: Annotated[list[str], typer.Option("--channel", help="a channel (repeat for more)")],
    worker: Annotated[
        str | None, typer.Option("--worker", help="only this worker's events")
    ] = None,
    no_recovery: Annotated[
        bool, typer.Option("--no-recovery", help="do not send the incident's recovery")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Add a global rule: which events go to which channels."""
    rule = RuleCreate(
        name=name, events=events, channels=channels, worker=worker, recovery=not no_recovery
    )
    with open_client() as client:
        added = client.add_alert_rule(rule)
    if as_json:
        print_json(added)
        return
    out.print(f"added rule {name}: {', '.join(events)} -> {', '.join(channels)}")


def _set_enabled(name: str, enabled: bool, as_json: bool) -> None:
    with open_client() as client:
        rule = client.set_alert_rule_enabled(name, enabled)
    if as_json:
        print_json(rule)
        return
    out.print(f"rule {name} {'enabled' if rule.enabled else 'disabled'}")


@rules_app.command("enable")
def rule_enable(
    name: Annotated[str, typer.Argument(help="the rule")], as_json: JsonOpt = False
) -> None:
    """Turn a global alert rule back on."""
    _set_enabled(name, True, as_json)


@rules_app.command("disable")
def rule_disable(
    name: Annotated[str, typer.Argument(help="the rule")], as_json: JsonOpt = False
) -> None:
    """Turn a global alert rule off: it routes nothing, and is kept."""
    _set_enabled(name, False, as_json)


@rules_app.command("rm")
def rule_rm(name: Annotated[str, typer.Argument(help="the rule")]) -> None:
    """Delete a global alert rule."""
    with open_client() as client:
        client.delete_alert_rule(name)
    out.print(f"deleted rule {name}")


# -- deliveries --------------------------------------------------------------------------------


@alerts_app.command("deliveries")
def deliveries(
    status: Annotated[
        str | None, typer.Option("--status", help="pending, delivered, failed or throttled")
    ] = None,
    purpose: Annotated[
        str | None, typer.Option("--purpose", help="alert, test or callback")
    ] = None,
    channel: Annotated[str | None, typer.Option("--channel", help="only this channel's")] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="only this run's")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List alert, test and callback deliveries, newest first, with their status."""
    with open_client() as client:
        query = DeliveryQuery(
            status=status, purpose=purpose, channel=channel, run_id=run_id, limit=limit
        )
        page = client.list_alert_deliveries(query)
    if as_json:
        print_json(page)
        return
    if not page.items:
        out.print("no deliveries")
        return
    table = new_table("DELIVERY", "STATUS", "TYPE", "TO", "TRIES", "CREATED", "SUMMARY / ERROR")
    for d in page.items:
        table.add_row(
            d.id,
            Text(d.status, style=DELIVERY_STYLE.get(d.status, "")),
            d.type,
            d.channel or d.target or "",
            f"{d.attempts}/{d.max_attempts}",
            when(d.created_at),
            d.last_error or d.summary,
        )
    out.print(table)


@alerts_app.command("resend")
def resend(delivery_id: Annotated[str, typer.Argument(help="the delivery")]) -> None:
    """Send a failed or throttled delivery again (a delivered one as a new delivery)."""
    with open_client() as client:
        delivery = client.resend_alert_delivery(delivery_id)
    out.print(f"{delivery.id} queued to send again")


@alerts_app.command("callback-key")
def callback_key(as_json: JsonOpt = False) -> None:
    """Print the key that signs run callbacks (admin), to verify them with Standard Webhooks."""
    with open_client() as client:
        key = client.callback_key()
    if as_json:
        print_json(key)
        return
    out.print(Text(key.key))
