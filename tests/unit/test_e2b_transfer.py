"""The archive of a run's files coming back from a remote sandbox, read as hostile: the
sandbox may have made it anything (its process can replace tar or the archive itself)."""

from __future__ import annotations

import io
import re
import resource
import tarfile
import zlib
from pathlib import Path

import pytest

from floom.sandbox.base import MAX_WALK_DEPTH
from floom.sandbox.e2b.transfer import DECODED_PIECE, decoded_body, unpack_hostile

MIB = 1024 * 1024


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _gzip_claiming(size: int, kind: bytes) -> bytes:
    """A gzip tar whose first record (a PAX header or a GNU long name) claims `size` bytes of
    zeros: a few hundred KB that tarfile would read whole."""
    record = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "pax")
    record.type, record.size = kind, size
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [packer.compress(record.tobuf(tarfile.GNU_FORMAT))]
    zeros = bytes(MIB)
    out += [packer.compress(zeros) for _ in range(size // MIB)]
    out.append(packer.compress(tarfile.TarInfo("work/x").tobuf(tarfile.USTAR_FORMAT)))
    out.append(packer.flush())
    return b"".join(out)


def test_a_record_claiming_more_than_the_budget_is_not_read_into_memory(tmp_path: Path) -> None:
    # 300 KB of gzip claiming 300 MB took 300 MB of floom's memory; the download of such an
    # archive is bounded only by its compressed size (the budget and 1 MiB).
    for kind in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME):
        data = _gzip_claiming(400 * MIB, kind)
        assert len(data) < MIB
        before = _peak_rss_mib()

        done = unpack_hostile(data, into=tmp_path / "landing", names=("work", "output"), budget=MIB)

        assert done.over_budget, done
        assert _peak_rss_mib() - before < 100


def test_files_within_the_budget_come_back(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, content in (("work/result.json", b"{}"), ("output/a.txt", b"a")):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))

    done = unpack_hostile(
        raw.getvalue(), into=tmp_path / "landing", names=("work", "output"), budget=MIB
    )

    assert not done.over_budget
    assert done.notes == []
    assert (done.trees["work"] / "result.json").read_bytes() == b"{}"
    assert (done.trees["output"] / "a.txt").read_bytes() == b"a"


def _archive(*members: tuple[str, bytes, bytes]) -> bytes:
    """A gzip tar of (name, type, content) members; a link's content is its target."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, kind, content in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.REGTYPE:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                info.linkname = content.decode()
                tar.addfile(info)
    return raw.getvalue()


def test_a_tree_that_came_back_as_a_file_stays_a_folder(tmp_path: Path) -> None:
    # Before: `output` (the sandbox's output dir replaced by a file) came back as a file,
    # over the fresh folder and what had been unpacked into it, and then replaced the
    # run's output dir on the host.
    data = _archive(
        ("output/kept.txt", tarfile.REGTYPE, b"kept"),
        ("output", tarfile.REGTYPE, b"not a folder"),
        ("work", tarfile.SYMTYPE, b"/etc"),
    )

    done = unpack_hostile(data, into=tmp_path / "landing", names=("work", "output"), budget=MIB)

    assert done.trees["output"].is_dir()
    assert done.trees["work"].is_dir()
    assert (done.trees["output"] / "kept.txt").read_bytes() == b"kept"
    assert sum("output was not kept" in note for note in done.notes) == 1, done.notes


def test_names_in_notes_cannot_shape_the_runs_log(tmp_path: Path) -> None:
    # Before: a link's name went into the note raw, so a newline or a terminal escape in it
    # wrote a line of its own (a fake "floom: ..." line) or coloured the log.
    data = _archive(
        ("output/a\nfloom: all good\x1b[2J", tarfile.SYMTYPE, b"/etc/passwd"),
        ("../escape\r\x07", tarfile.REGTYPE, b"x"),
    )

    done = unpack_hostile(data, into=tmp_path / "landing", names=("work", "output"), budget=MIB)

    assert len(done.notes) == 2, done.notes
    for note in done.notes:
        assert note.isprintable(), note


def test_a_file_the_host_cannot_write_is_left_out_and_the_rest_come_back(tmp_path: Path) -> None:
    # Before: the first file whose name the host could not write (a name over 255 bytes, a
    # file where a folder came before) cut the unpack short, and every file after it was lost.
    data = _archive(
        ("output/" + "n" * 300, tarfile.REGTYPE, b"too long a name"),
        ("output/a", tarfile.REGTYPE, b"a file"),
        ("output/a/b", tarfile.REGTYPE, b"under a file"),
        ("output/after.txt", tarfile.REGTYPE, b"after"),
        ("work/result.json", tarfile.REGTYPE, b"{}"),
    )

    done = unpack_hostile(data, into=tmp_path / "landing", names=("work", "output"), budget=MIB)

    assert (done.trees["output"] / "a").read_bytes() == b"a file"
    assert (done.trees["output"] / "after.txt").read_bytes() == b"after"
    assert (done.trees["work"] / "result.json").read_bytes() == b"{}"
    assert len(done.notes) == 2, done.notes
    assert all("was not kept" in note and note.isprintable() for note in done.notes), done.notes
    assert not any("cut short" in note for note in done.notes)


def test_a_file_nested_too_deep_is_named_as_such_with_the_local_walk_s_bound(
    tmp_path: Path,
) -> None:
    # Before: E2B said a 40-folder-deep file "leaves the workspace" (it does not), by a bound
    # of its own; the local walk's bound and words are used now.
    deep = "output/" + "d/" * 40 + "f.txt"
    data = _archive((deep, tarfile.REGTYPE, b"deep"), ("output/kept", tarfile.REGTYPE, b"k"))

    done = unpack_hostile(data, into=tmp_path / "landing", names=("work", "output"), budget=MIB)

    assert (done.trees["output"] / "kept").read_bytes() == b"k"
    assert len(done.notes) == 1, done.notes
    assert f"nested deeper than {MAX_WALK_DEPTH} folders" in done.notes[0]


@pytest.mark.parametrize(
    ("encoding", "wbits"),
    [("gzip", 16 + zlib.MAX_WBITS), ("deflate", zlib.MAX_WBITS), ("Deflate", -zlib.MAX_WBITS)],
)
def test_a_download_is_decoded_whole_and_in_pieces_of_at_most_decoded_piece(
    encoding: str, wbits: int
) -> None:
    body = bytes(range(256)) * 12 + bytes(1 << 20) + b"end"
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    sent = packer.compress(body) + packer.flush()
    wire = [sent[i : i + 1] for i in range(3)] + [sent[3:]]  # a first chunk of one byte

    pieces = list(decoded_body(encoding, wire))

    assert b"".join(pieces) == body
    assert max(len(piece) for piece in pieces) <= DECODED_PIECE


def test_a_download_without_an_encoding_comes_as_it_was_sent() -> None:
    assert list(decoded_body("", [b"a", b"b"])) == [b"a", b"b"]
    assert list(decoded_body("identity", [b"a"])) == [b"a"]


@pytest.mark.parametrize("encoding", ["br", "gzip, gzip", "zstd, gzip", "x-unknown"])
def test_a_download_in_an_encoding_floom_did_not_ask_for_is_refused_naming_it(
    encoding: str,
) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(encoding))):
        list(decoded_body(encoding, [b"\x1f\x8b"]))
