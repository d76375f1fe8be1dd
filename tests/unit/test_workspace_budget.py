"""A paused agent's workspace is read within one byte budget for all its files: files that
grow after they were counted (a process the agent started may still write) are read only
up to what is left of the budget, and the workspace is then not kept. Before, each file was
read up to the whole budget, so N files could cost N budgets of memory."""

from __future__ import annotations

import io
import os
import tarfile
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


def _deep_file(top: Path, depth: int, name_len: int) -> str:
    """A file `depth` folders down under `top`, each folder name `name_len` long, made from
    folder fds as a run's process can: its whole path may be longer than any path the host
    can open in one go (PATH_MAX, 4096 bytes)."""
    parts = [f"{i:03d}" + "d" * (name_len - 3) for i in range(depth)]
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            os.mkdir(part, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"deep")
        os.close(leaf)
    finally:
        os.close(fd)
    return "/".join([*parts, "f"])


def test_a_path_no_host_can_unpack_is_left_out_and_said_so_and_the_rest_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workspace file whose path is too long to unpack (a run's process can make one folder
    by folder) once failed every resume of its run: restore raised ENAMETOOLONG as floom's
    own error. It is now left out when kept, said in the run's log, and a stored workspace
    that holds one anyway restores all else, the member left out said so."""
    env = _env(tmp_path)
    settings = env.ctx.settings
    settings.max_bundle_bytes = settings.max_artifact_bytes = 1 << 20
    (env.workdir / "plain.txt").write_text("kept")
    deep = _deep_file(env.workdir, 24, 250)  # 6,000 bytes of path, under 32 folders
    stored: list[bytes] = []

    def put(_ctx: object, data: bytes) -> str:
        stored.append(data)
        return "d"

    monkeypatch.setattr(agent_runs, "put_blob", put)
    workspace.keep(env)
    assert len(stored) == 1
    assert any("too long" in line and "not kept with the workspace" in line for line in env.lines)

    # A workspace stored before this check (or by another floom) holding such a path.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("work/" + deep, b"deep"), ("work/plain.txt", b"kept")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for blob in (stored[0], buf.getvalue()):
        base = tmp_path / f"resumed-{len(os.listdir(tmp_path))}"
        base.mkdir()
        notes: list[str] = []
        monkeypatch.setattr(agent_runs, "get_blob", lambda _ctx, _d, what, b=blob: b)
        ctx: Any = SimpleNamespace()
        assert workspace.restore(ctx, run_id="r", digest="d", base=base, note=notes.append)
        assert (base / "work/plain.txt").read_text() == "kept"
        if blob is not stored[0]:
            assert any("not restored" in n and "too long" in n for n in notes), notes
