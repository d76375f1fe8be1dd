"""Reading a worker folder for deploy (the CLI, the MCP stdio server, the shipped examples):
a file's size is checked before it is read, so a huge file is refused at its size."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from floom import bundle as bundle_module
from floom.bundle import Bundle, BundleFile, read_archive, read_folder, read_upload
from floom.errors import BundleInvalid, BundlePathInvalid, BundleTooLarge
from floom.hints.cli import written
from floom.manifest.load import check_folder


def test_a_huge_file_in_the_folder_is_refused_by_its_size_without_being_read(
    tmp_path: Path,
) -> None:
    (tmp_path / "worker.yml").write_text("name: big\n")
    with (tmp_path / "data.bin").open("wb") as f:
        f.truncate(1 << 40)  # sparse: 1 TiB claimed, nothing on disk
    with pytest.raises(BundleInvalid, match="larger than 1 MiB"):
        read_folder(tmp_path, max_bytes=1 << 20)


def test_files_within_the_limit_are_read_whole_with_their_mode(tmp_path: Path) -> None:
    (tmp_path / "worker.yml").write_text("name: small\n")
    run = tmp_path / "run.sh"
    run.write_bytes(b"#!/bin/sh\necho hi\n")
    run.chmod(0o755)
    bundle = read_folder(tmp_path, max_bytes=1 << 20)
    assert bundle.files["run.sh"].data == b"#!/bin/sh\necho hi\n"
    assert bundle.files["run.sh"].executable
    assert not bundle.files["worker.yml"].executable


def test_a_link_swapped_in_after_the_folder_was_listed_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "worker.yml").write_text("name: racy\n")
    secret = tmp_path.parent / f"{tmp_path.name}-id_rsa"
    secret.write_text("PRIVATE KEY")
    (tmp_path / "notes.txt").symlink_to(secret)
    # The link appears between the listing and the read: the listing saw a plain file.
    monkeypatch.setattr(
        bundle_module,
        "folder_entries",
        lambda folder: iter([("notes.txt", stat.S_IFREG | 0o644), ("worker.yml", stat.S_IFREG)]),
    )
    with pytest.raises(BundleInvalid, match=r"'notes.txt' could not be read"):
        read_folder(tmp_path, max_bytes=1 << 20)


def test_a_file_whose_name_hides_a_character_is_refused_before_anything_is_read(
    tmp_path: Path,
) -> None:
    (tmp_path / "worker.yml").write_text("name: posing\n")
    (tmp_path / "run.py").write_text("print('shown')\n")
    (tmp_path / "ru\u200bn.py").write_text("print('run')\n")
    with pytest.raises(BundlePathInvalid, match=r"'ru\\u200bn.py' holds a zero-width character"):
        read_folder(tmp_path, max_bytes=1 << 20)


def test_a_worker_yml_linked_out_of_the_folder_is_refused_without_being_read(
    tmp_path: Path,
) -> None:
    # Before: `floom validate` and `deploy` read worker.yml through the link; a coding agent's
    # `floom validate` of a cloned folder read (and could show) a file of the user's anywhere.
    folder = tmp_path / "w"
    folder.mkdir()
    outside = tmp_path / "id_rsa"
    outside.write_text("name: read-from-outside\n")
    (folder / "worker.yml").symlink_to(outside)
    manifest, problems = check_folder(folder)
    assert manifest is None
    assert [p.message for p in problems] == ["worker.yml is a symlink; floom reads no link"]
    assert "read-from-outside" not in str(problems)


def test_a_worker_yml_that_is_a_fifo_is_named_as_one_and_nothing_waits(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "worker.yml")
    manifest, problems = check_folder(tmp_path)
    assert manifest is None
    assert [p.message for p in problems] == ["worker.yml is a FIFO, not a regular file"]


def test_env_files_stay_behind_and_are_named_while_examples_ship(tmp_path: Path) -> None:
    # Before: `.env` went into the version, readable by any read key and in every run's
    # sandbox, whatever secrets it held.
    (tmp_path / "worker.yml").write_text("name: dotenv\n")
    (tmp_path / "run.py").write_text("print('hi')\n")
    (tmp_path / ".env").write_text("OPENAI_API_KEY=sk-live\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / ".env.production").write_text("TOKEN=x\n")
    (tmp_path / ".env.example").write_text("OPENAI_API_KEY=\n")
    os.mkfifo(tmp_path / "pipe")
    bundle = read_folder(tmp_path, max_bytes=1 << 20)
    assert sorted(bundle.files) == [".env.example", "run.py", "worker.yml"]
    said = {why.split(" ", 1)[0]: why for why in map(written, bundle.left_out)}
    assert sorted(said) == ["'.env'", "'conf/.env.production'", "'pipe'"]
    assert "floom secrets set" in said["'.env'"]
    assert "FIFO" in said["'pipe'"]
    _, problems = check_folder(tmp_path)
    assert problems == []


def test_an_archive_of_a_folder_leaves_out_what_the_folder_walk_does_at_any_depth(
    tmp_path: Path,
) -> None:
    # Before: the server read an uploaded archive whole, so a REST deploy of `tar czf` of a
    # folder (or MCP `files`) shipped the `.env` files `floom deploy` of it leaves behind,
    # and refused a FIFO it leaves out.
    folder = tmp_path / "w"
    (folder / "conf" / "deep").mkdir(parents=True)
    (folder / "worker.yml").write_text("name: dotenv\n")
    (folder / "run.py").write_text("print('hi')\n")
    (folder / ".env").write_text("OPENAI_API_KEY=sk-live\n")
    (folder / "conf" / "deep" / ".env.local").write_text("TOKEN=x\n")
    (folder / "conf" / ".env.sample").write_text("TOKEN=\n")
    os.mkfifo(folder / "pipe")
    packed = tmp_path / "w.tgz"
    subprocess.run(["tar", "czf", str(packed), "-C", str(folder), "."], check=True)
    walked = read_folder(folder, max_bytes=1 << 20)

    uploaded = read_upload(packed.read_bytes(), max_bytes=1 << 20)

    assert sorted(uploaded.files) == ["conf/.env.sample", "run.py", "worker.yml"]
    assert uploaded.digest == walked.digest
    said = sorted(map(written, uploaded.left_out))  # tar lists a folder in its own order
    assert said == sorted(map(written, walked.left_out))
    assert [why.split(" ", 1)[0] for why in said] == ["'.env'", "'conf/deep/.env.local'", "'pipe'"]
    # A stored version's archive is read as it is: its digest is what it was stored under.
    stored = Bundle({".env": BundleFile(".env", b"X=1"), "run.py": BundleFile("run.py", b"")})
    assert sorted(read_archive(stored.to_archive(), max_bytes=1 << 20).files) == [".env", "run.py"]


def test_folders_left_out_are_never_walked_and_a_huge_tree_stops_at_the_entry_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "worker.yml").write_text("name: walked\n")
    for skipped in (".git", "node_modules", ".venv"):
        (tmp_path / skipped / "deep").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    for i in range(60):
        (tmp_path / "data" / f"f{i}").write_text("x")
    listed: list[str] = []
    real = os.scandir

    def spy(path: Any = ".") -> Any:
        listed.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", spy)
    monkeypatch.setattr(bundle_module, "MAX_ENTRIES", 20)
    with pytest.raises(BundleTooLarge, match="more than 20 entries"):
        read_folder(tmp_path, max_bytes=1 << 20)
    assert not [p for p in listed if any(s in p for s in (".git", "node_modules", ".venv"))]
    listed.clear()
    with pytest.raises(BundleTooLarge, match="more than 20 entries"):
        check_folder(tmp_path)
    assert not [p for p in listed if any(s in p for s in (".git", "node_modules", ".venv"))]
