"""The host's opener for a run's files, on its own: no link followed at any component, only
regular files, sizes checked first, walks bounded by entries, time and cancel."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from floom.engine.collect import collect_artifacts
from floom.engine.safefiles import (
    Bounds,
    Cancelled,
    Refused,
    read_regular,
    walk,
    write_regular,
)
from floom.services.access.secrets import Redactor


def _later(seconds: float = 30.0) -> Bounds:
    return Bounds(deadline=time.monotonic() + seconds)


def test_a_link_at_an_inner_component_of_a_path_is_refused(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("host only")
    run = tmp_path / "run"
    run.mkdir()
    (run / "sub").symlink_to(host)

    with pytest.raises(Refused, match="sub is a symlink; floom does not follow it"):
        read_regular(run, "sub/secret.txt", limit=100, setting="X")
    with pytest.raises(Refused, match="sub is a symlink"):
        write_regular(run, "sub/new.txt", b"x")
    assert not (host / "new.txt").exists()


def test_a_write_never_goes_through_a_link_or_into_a_fifo(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    run = tmp_path / "run"
    run.mkdir()
    (run / "decision.json").symlink_to(victim)
    os.mkfifo(run / "pipe")

    with pytest.raises(Refused, match=r"decision\.json is a symlink"):
        write_regular(run, "decision.json", b"{}")
    with pytest.raises(Refused, match="pipe is a FIFO"):
        write_regular(run, "pipe", b"{}")
    assert victim.read_text() == "original"


def test_a_file_over_its_limit_is_refused_by_size_before_reading(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 40)  # a terabyte that takes no disk

    with pytest.raises(Refused, match=f"sparse is {1 << 40} bytes, over the limit of 10 \\(X\\)"):
        read_regular(tmp_path, "sparse", limit=10, setting="X")


def test_a_walk_stops_at_its_entry_bound_and_never_enters_a_linked_folder(tmp_path: Path) -> None:
    (tmp_path / "many").mkdir()
    for i in range(50):
        (tmp_path / "many" / f"{i:02}").write_text("x")
    (tmp_path / "up").symlink_to("/")

    found = walk(tmp_path, Bounds(deadline=time.monotonic() + 30, max_entries=20))

    assert not found.complete
    assert len(found.files) < 20
    assert "more than 20 entries; floom stopped looking there" in found.notes
    assert not any(name.startswith("up/") for name, _ in found.files)


def test_a_walk_past_its_deadline_stops_and_a_cancel_ends_it(tmp_path: Path) -> None:
    for i in range(200):
        (tmp_path / f"{i:03}").write_text("x")

    late = walk(tmp_path, Bounds(deadline=time.monotonic() - 1))
    assert not late.complete
    assert "floom stopped collecting files at the run's time limit" in late.notes
    with pytest.raises(Cancelled):
        walk(tmp_path, Bounds(deadline=time.monotonic() + 30, should_cancel=lambda: True))
    cancelled = collect_artifacts(
        tmp_path,
        limit=1 << 20,
        bounds=Bounds(deadline=time.monotonic() + 30, should_cancel=lambda: True),
        redactor=Redactor([]),
    )
    assert cancelled.cancelled
    assert cancelled.artifacts == []


def test_collected_artifacts_have_secrets_redacted_in_names_text_and_binary_bytes(
    tmp_path: Path,
) -> None:
    (tmp_path / "a-tok123.txt").write_text("value tok123 here")
    (tmp_path / "b.bin").write_bytes(b"\0tok123")
    (tmp_path / "c-tok123.txt").write_text("second")

    done = collect_artifacts(
        tmp_path, limit=1 << 20, bounds=_later(), redactor=Redactor(["tok123"])
    )

    assert [(n, d) for n, d, _ in done.artifacts] == [
        ("a-***.txt", b"value *** here"),
        ("b.bin", b"\0******"),  # masked in place, its length kept
        ("c-***.txt", b"second"),
    ]
