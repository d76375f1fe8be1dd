"""An agent's SKILL.md is bounded on its own (MAX_SKILL_BYTES), not only by the bundle's size:
it is read whole at every run and sent to the model with every turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from floom.agent.runner import _read_skill
from floom.bundle import read_folder
from floom.errors import LimitExceeded
from floom.manifest.schema import MAX_SKILL_BYTES
from tests.support.harness import live_server, make_worker

HEADERS = {"Content-Type": "application/gzip"}


def agent_archive(tmp_path: Path, name: str, skill_bytes: int) -> bytes:
    folder = make_worker(
        tmp_path / name, f"name: {name}\n", {"SKILL.md": "Say hello.\n" + "x" * skill_bytes}
    )
    return read_folder(folder, max_bytes=10 << 20).to_archive()


def test_a_skill_md_over_its_bound_is_refused_at_deploy_and_by_validate(tmp_path: Path) -> None:
    # A SKILL.md of any size up to the bundle limit (50 MiB) deployed, and every run read it
    # whole into the node's memory and sent it to the model with every turn.
    big = agent_archive(tmp_path, "wordy", MAX_SKILL_BYTES)
    fits = agent_archive(tmp_path, "brief", MAX_SKILL_BYTES // 2)
    with (
        live_server(tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}") as server,
        server.client() as api,
    ):
        deployed = api.post("/api/v1/workers", content=big, headers=HEADERS)
        checked = api.post("/api/v1/workers/validate", content=big, headers=HEADERS)
        workers = api.get("/api/v1/workers").json()["items"]
        assert api.post("/api/v1/workers", content=fits, headers=HEADERS).status_code == 201

    assert deployed.status_code == 400, deployed.text
    error = deployed.json()["error"]
    assert error["code"] == "manifest_invalid"
    [problem] = error["details"]
    assert problem["path"] == "entry"
    assert "SKILL.md is" in problem["message"]
    assert f"({MAX_SKILL_BYTES // 1024} KiB)" in problem["message"]
    assert "SKILL.md" in problem["hint"]
    assert workers == []  # nothing stored
    assert checked.json()["valid"] is False
    assert checked.json()["problems"] == [problem]


def test_a_run_reads_no_more_of_skill_md_than_its_bound(tmp_path: Path) -> None:
    # A version stored before the bound may hold a larger one: its run fails naming it.
    skill = tmp_path / "SKILL.md"
    skill.write_bytes(b"x" * MAX_SKILL_BYTES)
    assert len(_read_skill(skill)) == MAX_SKILL_BYTES
    skill.write_bytes(b"x" * (MAX_SKILL_BYTES + 1))
    with pytest.raises(LimitExceeded, match=r"SKILL\.md is more than"):
        _read_skill(skill)
