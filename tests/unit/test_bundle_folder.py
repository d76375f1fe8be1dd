"""Reading a worker folder for deploy (the CLI, the MCP stdio server, the shipped examples):
a file's size is checked before it is read, so a huge file is refused at its size."""

from __future__ import annotations

from pathlib import Path

import pytest

from floom.bundle import read_folder
from floom.errors import BundleInvalid, BundlePathInvalid


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
    # The link appears between the check and the read: the check sees a plain file.
    monkeypatch.setattr(Path, "is_symlink", lambda self: False)
    monkeypatch.setattr(Path, "is_file", lambda self: True)
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
