"""`floom init NAME [--agent]` makes a worker folder that validates, deploys and runs as it is
written, through the real command against a live server; a bad name or a folder in the way
is refused with a clear message and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standins.anthropic_api import reply, tool_use
from tests.support.harness import LiveServer
from tests.support.rigs.agents import agent_rig


def floom_in(folder: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "floom.cli", *args],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def offline_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env["FLOOM_DATA_DIR"] = str(tmp_path / "cli-home")
    return env


def test_init_makes_a_script_worker_that_validates_deploys_and_runs_as_is(
    server: LiveServer, tmp_path: Path
) -> None:
    env = server.cli_env()
    made = floom_in(tmp_path, "init", "greeter", env=env)
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "greeter"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "run.py", "worker.yml"]
    manifest = (folder / "worker.yml").read_text()
    assert manifest.count("\n#") >= 5, "worker.yml explains itself in comments"
    assert "floom deploy greeter" in made.stdout
    checked = floom_in(tmp_path, "validate", "greeter", env=env)
    assert checked.returncode == 0, checked.stderr
    assert "ok: greeter" in checked.stdout, checked.stderr
    deployed = floom_in(tmp_path, "deploy", "greeter", env=env)
    assert deployed.returncode == 0, deployed.stderr
    assert "deployed greeter" in deployed.stdout, deployed.stderr
    ran = floom_in(tmp_path, "run", "greeter", "-i", "name=Ada", "--wait", "--json", env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    record = json.loads(ran.stdout)
    assert record["status"] == "succeeded", record
    assert record["outputs"] == {"greeting": "Hello, Ada!"}
    assert [a["name"] for a in record["artifacts"]] == ["greeting.txt"]


def test_init_agent_makes_an_agent_worker_that_validates_deploys_and_runs_as_is(
    tmp_path: Path, database_url: str
) -> None:
    with agent_rig(tmp_path / "data", database_url) as rig:
        env = rig.server.cli_env()
        made = floom_in(tmp_path, "init", "notes", "--agent", env=env)
        assert made.returncode == 0, made.stderr
        folder = tmp_path / "notes"
        assert sorted(p.name for p in folder.iterdir()) == ["README.md", "SKILL.md", "worker.yml"]
        checked = floom_in(tmp_path, "validate", "notes", env=env)
        assert checked.returncode == 0, checked.stderr
        assert "ok: notes" in checked.stdout, checked.stderr
        deployed = floom_in(tmp_path, "deploy", "notes", env=env)
        assert deployed.returncode == 0, deployed.stderr
        rig.model.script(
            reply(tool_use("write_file", {"path": "note.md", "content": "floom runs workers."})),
            reply(tool_use("finish", {"outputs": {"summary": "floom runs workers."}})),
        )
        ran = floom_in(tmp_path, "run", "notes", "--wait", "--json", env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        record = json.loads(ran.stdout)
        assert sorted(rig.model.tool_names(0)) == ["finish", "write_file"]
        assert "You write a short note" in json.dumps(rig.model.requests[0]["system"])
    assert record["status"] == "succeeded", record
    assert record["inputs"] == {"topic": "floom"}
    assert record["outputs"] == {"summary": "floom runs workers."}
    assert [a["name"] for a in record["artifacts"]] == ["note.md"]


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("My Worker", 'try "my-worker"'),
        ("../escape", 'try "escape"'),
        ("a/b", 'try "a-b"'),
        ("x_y", 'try "x-y"'),
        ("9lives", "starting with a letter"),
    ],
)
def test_init_refuses_a_bad_name_and_writes_nothing(tmp_path: Path, name: str, hint: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    done = floom_in(work, "init", name, env=offline_env(tmp_path))
    said = " ".join(done.stderr.split())
    assert done.returncode == 1
    assert f"error: {name!r} is not a valid worker name" in said
    assert hint in said
    assert list(work.iterdir()) == []
    assert not (tmp_path / "escape").exists()


def test_init_refuses_a_folder_in_the_way_and_uses_an_empty_one(tmp_path: Path) -> None:
    env = offline_env(tmp_path)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    done = floom_in(tmp_path, "init", "taken", env=env)
    said = " ".join(done.stderr.split())
    assert done.returncode == 1
    assert "error: taken/ already exists and is not empty; nothing was written" in said
    assert "hint: choose another name" in said
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    (tmp_path / "afile").write_text("x")
    done = floom_in(tmp_path, "init", "afile", env=env)
    assert done.returncode == 1
    assert "afile already exists and is not a folder" in done.stderr
    assert (tmp_path / "afile").read_text() == "x"
    (tmp_path / "empty").mkdir()
    done = floom_in(tmp_path, "init", "empty", "--agent", env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == [
        "README.md",
        "SKILL.md",
        "worker.yml",
    ]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
