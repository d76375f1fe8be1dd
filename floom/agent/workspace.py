"""An agent run's workspace across pauses: kept in the store when the run waits for a person,
restored wherever it resumes; files under output/ travel as the run's artifacts."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

from floom.engine.collect import Artifact
from floom.services import agent_runs

if TYPE_CHECKING:
    from floom.agent.builtin import AgentEnv
    from floom.services.context import Context


def keep(env: AgentEnv) -> str | None:
    """Store the workspace and output dir as a blob; None (with a log line) when too large."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(env.workdir, arcname="work")
        tar.add(env.output_dir, arcname="output")
    data = buf.getvalue()
    limit = env.ctx.settings.max_bundle_bytes
    if len(data) > limit:
        env.run_log.add(
            "system",
            f"the workspace ({len(data)} bytes packed) is over FLOOM_MAX_BUNDLE_BYTES and is not "
            "kept across the pause; it restarts from the worker's files",
        )
        return None
    return agent_runs.put_blob(env.ctx, data)


def restore(ctx: Context, *, digest: str, base: Path) -> bool:
    """Unpack what `keep` stored into base (holding work/ and output/)."""
    data = agent_runs.get_blob(ctx, digest)
    if data is None:
        return False
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(base, filter="data")
    return True


def artifacts(env: AgentEnv) -> list[Artifact]:
    return env.attempt.collect_artifacts()
