"""Which surfaces may start a worker, and which choices in starting one are a deploy key's.

worker.yml's `expose` lists the surfaces (`ui`, `rest`, `mcp`), every one when it is
absent. Triggers (schedules, webhooks, Composio events, handoffs) and floom itself are not
surfaces: `expose` never stops them.

A surface is where a person or an agent asks for a run, not a permission: a key that may
run a worker (its scope) can reach it on any surface the worker allows. floom's CLI is a
client of the REST API and counts as `rest`; so does any other REST client.
"""

from __future__ import annotations

from typing import NoReturn

from floom.errors import Forbidden, NotExposed
from floom.hints import KeyWith, Part, act, told
from floom.manifest.schema import EXPOSE_TARGETS, Manifest
from floom.services.access.principal import Principal, Surface
from floom.store.db import Writer
from floom.store.models import Worker

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


def check_deploy_choices(
    worker: Worker,
    *,
    version_id: str,
    force: bool,
    replay_of: str | None,
    caller: Principal,
    s: Writer | None = None,
    recording: bool = False,
) -> None:
    """Refuse (Forbidden, naming the deploy scope) a caller without the deploy scope who
    starts `worker` on a version other than its active one (a pinned `version_id`, or a
    replay of a run on the version it recorded), or, with `force`, while it is paused.

    Which code runs, and whether a worker runs at all, are a deploy key's decisions (deploy,
    rollback, pause, resume); a run key runs what they left active. A replay from a
    recording (`recording`) comes here only when it may call tools live (its version's
    replay.live_tools): then it acts, as a run does; one that cannot acts on nothing and
    needs no more than the run scope. With `s`, the write transaction
    that queues the run and has locked `worker`'s row, the decision is made again from that
    row and a deploy key is read again (`require_in`), so a rollback, a pause or a revocation
    committed meanwhile is seen."""
    paused_forced = worker.paused and force
    other_version = version_id != worker.active_version_id
    if not (paused_forced or other_version):
        return
    if caller.can("deploy"):
        if s is not None:
            caller.require_in(s, "deploy")
        return
    if recording:
        _refuse_live_replay(worker, version_id=version_id, other_version=other_version)
    if other_version:
        active = worker.active_version_id or "none"
        what = "a replay of" if replay_of else "a run of"
        instead: tuple[Part, ...] = (
            ("replay it on the active version with ", act("replay", run_id=replay_of, latest=True))
            if replay_of
            else ("run the active version (leave the version out)",)
        )
        raise _needs_deploy(
            f"{what} worker '{worker.name}' on version {version_id}, not its active version "
            f"({active}), needs the 'deploy' scope: which version runs is a deploy decision",
            *instead,
            "; to run that version, make it active with ",
            act("rollback", worker=worker.name, version=version_id),
            " or use ",
        )
    raise _needs_deploy(
        f"running paused worker '{worker.name}' anyway (force) needs the 'deploy' scope: "
        "pausing and resuming are deploy decisions",
        "wait until it is resumed (",
        act("resume", worker=worker.name),
        ", with a deploy key), or use ",
    )


def check_delivery_replay(
    *,
    worker_name: str,
    delivery_id: str,
    came_paused: bool,
    trigger_paused: bool,
    caller: Principal,
    s: Writer | None = None,
) -> None:
    """Refuse (Forbidden, naming the deploy scope) a caller without the deploy scope who
    replays a delivery that came while its trigger or worker was paused (`came_paused`), or
    whose trigger is paused now (`trigger_paused`).

    A pause decides which events run, a deploy key's decision as running a paused worker
    anyway (`force`, check_deploy_choices) is; a run key replays only what its triggers let
    run. With `s`, the write transaction that queues the run, the trigger's pause has been
    read from it and a deploy key is read again (`require_in`), so a pause or a revocation
    committed meanwhile is seen."""
    if not (came_paused or trigger_paused):
        return
    if caller.can("deploy"):
        if s is not None:
            caller.require_in(s, "deploy")
        return
    when = (
        "came while its trigger or worker was paused" if came_paused else "is to a paused trigger"
    )
    raise _needs_deploy(
        f"replaying delivery {delivery_id}, which {when}, needs the 'deploy' scope: which "
        "events run is a deploy decision (pausing and resuming)",
        "deliveries that come once it is resumed (",
        act("resume", worker=worker_name),
        ", with a deploy key) run; to run this one, use ",
    )


def _refuse_live_replay(worker: Worker, *, version_id: str, other_version: bool) -> NoReturn:
    """check_deploy_choices' refusal of a what-if replay that may call tools live."""
    live = "may call that version's tools live (its replay.live_tools)"
    if other_version:
        active = worker.active_version_id or "none"
        raise _needs_deploy(
            f"a what-if replay of worker '{worker.name}' on version {version_id}, not its "
            f"active version ({active}), {live}, which needs the 'deploy' scope: which "
            "version acts is a deploy decision",
            "replay it on the active version (leave the version out), or exactly (acting "
            "on nothing); to replay on that version, make it active with ",
            act("rollback", worker=worker.name, version=version_id),
            " or use ",
        )
    raise _needs_deploy(
        f"a what-if replay of paused worker '{worker.name}' {live.replace('that', 'its')}, "
        "which needs the 'deploy' scope: pausing and resuming are deploy decisions",
        "replay it exactly (acting on nothing), wait until it is resumed (",
        act("resume", worker=worker.name),
        ", with a deploy key), or use ",
    )


def _needs_deploy(message: str, *hint: Part) -> Forbidden:
    """A refusal that names the deploy scope (`details.scope_needed`); its hint, `hint`
    then a key with that scope."""
    return Forbidden(
        message, hint=told(*hint, KeyWith("deploy")), details={"scope_needed": "deploy"}
    )
