"""Which surfaces may start a worker: worker.yml's `expose` lists them (`ui`, `rest`, `mcp`),
every one when it is absent. Triggers (schedules, webhooks, Composio events, handoffs) and
floom itself are not surfaces: `expose` never stops them.

A surface is where a person or an agent asks for a run, not a permission: a key that may
run a worker (its scope) can reach it on any surface the worker allows. floom's CLI is a
client of the REST API and counts as `rest`; so does any other REST client.
"""

from __future__ import annotations

from floom.errors import NotExposed
from floom.hints import act, told
from floom.manifest.schema import EXPOSE_TARGETS, Manifest
from floom.services.access.principal import Principal, Surface

# The expose target each surface answers to (floom itself, "system", has none).
TARGET_OF: dict[Surface, str] = {"rest": "rest", "cli": "rest", "mcp": "mcp", "ui": "ui"}
_WHERE = {
    "rest": "the REST API",
    "cli": "the CLI (a client of the REST API, so `rest`)",
    "mcp": "MCP",
    "ui": "the web UI",
}


def allowed_surfaces(manifest: Manifest) -> tuple[str, ...]:
    """The surfaces that may start a worker of this manifest: its `expose`, else all."""
    return tuple(manifest.expose) or EXPOSE_TARGETS


def allows(manifest: Manifest, target: str) -> bool:
    return target in allowed_surfaces(manifest)


def check_exposed(manifest: Manifest, *, worker: str, caller: Principal) -> None:
    """Raise NotExposed unless `caller`'s surface may start the worker; floom itself (a
    schedule, a webhook delivery, an event, a handoff, an agent's call) always may."""
    target = TARGET_OF.get(caller.surface)
    if caller.system or target is None:
        return
    allowed = allowed_surfaces(manifest)
    if target in allowed:
        return
    wanted = ", ".join([*allowed, target])
    raise NotExposed(
        f"worker '{worker}' cannot be started from {_WHERE[caller.surface]}: its worker.yml "
        f"exposes it to {', '.join(allowed)} only",
        hint=told(
            f"add {target} to `expose` in its worker.yml (expose: [{wanted}]) and deploy it "
            "again with ",
            act("deploy"),
            "; schedules, webhooks and events start it whatever `expose` says",
        ),
        details={"surface": target, "allowed": list(allowed)},
    )
