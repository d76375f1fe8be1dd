"""An agent run's workspace across pauses: kept in the store when the run waits for a person,
restored wherever it resumes; files under output/ travel as the run's artifacts."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from floom.engine.collect import Artifact
from floom.engine.safefiles import Cancelled, Refused, open_regular, read_fd, said, walk
from floom.services.runs import agent as agent_runs

if TYPE_CHECKING:
    from floom.agent.builtin import AgentEnv
    from floom.services.context import Context

# The longest path (bytes, from the workspace's top) kept across a pause. A run's process can
# make a path of any length folder by folder, but unpacking it on resume opens it whole,
# under the run dir, and the kernel refuses a path over PATH_MAX (4096 bytes).
MAX_PATH_BYTES = 2048


def keep(env: AgentEnv) -> str | None:
    """Store the workspace and output dir as a blob; None (with a log line) when too large.

    Only regular files are kept, read without following links, their sizes summed before
    any is read: a command the agent ran may have left anything in the workspace."""
    settings = env.ctx.settings
    budget = settings.max_bundle_bytes + settings.max_artifact_bytes
    bounds = env.attempt.bounds()
    trees: list[tuple[str, Path, list[tuple[str, int]]]] = []
    for arcname, root in (("work", env.workdir), ("output", env.output_dir)):
        try:
            found = walk(root, bounds, label=f"{arcname}/")
        except Cancelled:
            return None
        for note in found.notes:
            env.run_log.add("system", f"not kept with the workspace: {note}")
        trees.append((arcname, root, found.files))
    raw = sum(size for _, _, files in trees for _, size in files)
    if raw > budget:
        _too_large(env, f"{raw} bytes of files")
        return None
    buf = io.BytesIO()
    # Files can grow after the walk (a process the agent started may still write): each is
    # read up to what is left of the budget, never the whole budget again.
    left = budget
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for arcname, root, files in trees:
            folder = tarfile.TarInfo(arcname)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(folder)
            for rel, _ in files:
                name = f"{arcname}/{rel}"
                if len(name.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
                    env.run_log.add(
                        "system",
                        f"not kept with the workspace: {said(name)[:200]}...: its path is "
                        f"too long (over {MAX_PATH_BYTES} bytes) to unpack on resume",
                    )
                    continue
                try:
                    with open_regular(root, rel) as (fd, st):
                        data = b"" if st.st_size > left else read_fd(fd, left)
                except (Refused, OSError) as exc:
                    why = exc.message if isinstance(exc, Refused) else exc.strerror
                    env.run_log.add("system", f"not kept with the workspace: {said(name)}: {why}")
                    continue
                if st.st_size > left or len(data) > left:
                    _too_large(env, f"over {budget} bytes of files, grown since they were counted")
                    return None
                left -= len(data)
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    if len(data) > settings.max_bundle_bytes:
        _too_large(env, f"{len(data)} bytes packed")
        return None
    return agent_runs.put_blob(env.ctx, data)


def _too_large(env: AgentEnv, size: str) -> None:
    env.run_log.add(
        "system",
        f"the workspace ({size}) is over FLOOM_MAX_BUNDLE_BYTES and is not kept across the "
        "pause; it restarts from the worker's files",
    )


def restore(
    ctx: Context, *, run_id: str, digest: str, base: Path, note: Callable[[str], None]
) -> bool:
    """Unpack what `keep` stored into base (holding work/ and output/). A member that cannot
    be unpacked (a path too long, one the data filter refuses) is left out and `note`d: it
    never fails the run's resume."""
    data = agent_runs.get_blob(ctx, digest, what=f"the agent workspace of run {run_id}")
    if data is None:
        return False
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar:
            try:
                tar.extract(member, base, filter="data")
            except (OSError, tarfile.TarError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                note(f"not restored with the workspace: {said(member.name)[:200]}: {said(why)}")
    return True


def artifacts(env: AgentEnv) -> list[Artifact]:
    return env.attempt.collect_artifacts().artifacts
