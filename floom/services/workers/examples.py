"""The example workers shipped in workers/: deployed on a fresh install, never acting on
their own until their secrets are set."""

from __future__ import annotations

import logging

from floom.bundle import read_folder
from floom.errors import FloomError
from floom.services.access import principal, secrets
from floom.services.context import Context
from floom.services.triggers import registry as triggers
from floom.services.workers import versions as workers
from floom.store.models import Version
from floom.vocabulary import TriggerKind

log = logging.getLogger("floom")


def deploy_examples(ctx: Context) -> list[str]:
    """Deploy each example worker that is not deployed yet; never override a user's choice."""
    folder = ctx.settings.resolved_examples_dir()
    if folder is None:
        return []
    deployed = []
    for sub in sorted(p for p in folder.iterdir() if (p / "worker.yml").is_file()):
        try:
            bundle = read_folder(sub, max_bytes=ctx.settings.max_bundle_bytes)
            result = workers.deploy(
                ctx, archive=bundle.to_archive(), caller=principal.system("examples")
            )
        except FloomError as exc:
            log.warning("example worker %s not deployed: %s", sub.name, exc.message)
            continue
        if result.created:
            deployed.append(result.worker.name)
            pause_schedules_missing_secrets(ctx, result.worker.name, result.version)
    return deployed


def pause_schedules_missing_secrets(ctx: Context, worker_name: str, version: Version) -> None:
    """An example never acts on its own on a fresh install: its schedules start paused while
    a secret it declares is not set (each tick would only fail), and the log says how to
    turn them on."""
    examples = principal.system("examples")
    # Names only: nothing is decrypted to learn which are set.
    missing = secrets.missing(ctx, workers.manifest_of(version).secrets, caller=examples)
    if not missing:
        return
    _, found = triggers.list_triggers(ctx, worker_name=worker_name, caller=examples)
    paused = [t for t in found if t.kind == TriggerKind.SCHEDULE and t.removed_at is None]
    for trigger in paused:
        triggers.set_paused(
            ctx,
            worker_name=worker_name,
            paused=True,
            trigger_id=trigger.id,
            caller=examples,
        )
    if paused:
        log.warning(
            "example %s: its schedule is paused until its secrets are set "
            "(floom secrets set %s; then floom resume %s --trigger %s)",
            worker_name,
            " ".join(missing),
            worker_name,
            paused[0].id,
        )
