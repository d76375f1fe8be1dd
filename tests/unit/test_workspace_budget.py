"""A paused agent's workspace is read within one byte budget for all its files: files that
grow after they were counted (a process the agent started may still write) are read only
up to what is left of the budget, and the workspace is then not kept. Before, each file was
read up to the whole budget, so N files could cost N budgets of memory."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from floom.agent import workspace
from floom.engine import safefiles
from floom.engine.safefiles import Bounds
from floom.services.runs import agent as agent_runs

BUNDLE, ARTIFACTS = 1000, 1000
BUDGET = BUNDLE + ARTIFACTS


def _env(tmp_path: Path) -> Any:
    lines: list[str] = []
    work, output = tmp_path / "work", tmp_path / "output"
    work.mkdir()
    output.mkdir()
    settings = SimpleNamespace(max_bundle_bytes=BUNDLE, max_artifact_bytes=ARTIFACTS)
    return SimpleNamespace(
        ctx=SimpleNamespace(settings=settings),
        attempt=SimpleNamespace(bounds=lambda: Bounds(deadline=time.monotonic() + 30)),
        workdir=work,
        output_dir=output,
        run_log=SimpleNamespace(add=lambda _kind, line: lines.append(line)),
        lines=lines,
    )


def test_files_grown_past_the_budget_after_the_count_are_not_read_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(tmp_path)
    names = [f"f{i}" for i in range(4)]
    for name in names:
        (env.workdir / name).write_bytes(b"\0" * 100)  # 400 bytes counted: under the budget
    real_walk = safefiles.walk

    def walk_then_grow(root: Path, bounds: Bounds, **kw: Any) -> Any:
        found = real_walk(root, bounds, **kw)
        if root == env.workdir:
            for name in names:  # each under the budget, together four times past it
                (env.workdir / name).write_bytes(b"\0" * (BUDGET - 10))
        return found

    read = []
    real_read = safefiles.read_fd

    def counted(fd: int, limit: int) -> bytes:
        data = real_read(fd, limit)
        read.append(len(data))
        return data

    stored: list[bytes] = []
    monkeypatch.setattr("floom.agent.workspace.walk", walk_then_grow)
    monkeypatch.setattr("floom.agent.workspace.read_fd", counted, raising=False)
    monkeypatch.setattr(safefiles, "read_fd", counted)
    monkeypatch.setattr(agent_runs, "put_blob", lambda _ctx, data: stored.append(data))

    assert workspace.keep(env) is None
    assert stored == []
    assert sum(read) <= BUDGET + 1, read
    assert any("is over FLOOM_MAX_BUNDLE_BYTES" in line for line in env.lines), env.lines


def test_a_workspace_within_the_budget_is_kept_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(tmp_path)
    for i in range(4):
        (env.workdir / f"f{i}").write_bytes(b"\0" * (BUDGET // 4 - 1))
    stored: list[bytes] = []
    monkeypatch.setattr(agent_runs, "put_blob", lambda _ctx, data: stored.append(data))
    workspace.keep(env)
    assert len(stored) == 1
    assert env.lines == []
