"""The E2B backend against a hostile sandbox (tests/standins/e2b): a script, or an envd it
took over, that prints without pause, lies about its files or trickles them back. Every
byte and second that comes back to floom's host process is bounded, as with `local`."""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from floom.sandbox.base import SandboxUnavailable
from floom.sandbox.e2b.backend import E2BSandbox
from tests.standins.e2b import E2BStandin
from tests.support.rigs.e2b import e2b_backend
from tests.support.rigs.sandboxes import run_script

# Prints a short line every few milliseconds, for far longer than any test waits.
CHATTY = """
import time
for i in range(100_000):
    print('chatter', i, flush=True)
    time.sleep(0.005)
"""


def test_a_run_that_never_stops_printing_still_times_out_at_its_timeout(
    e2b: E2BSandbox, tmp_path: Path
) -> None:
    # Before: the timeout was looked at only when no output came for 0.1 s, so a run
    # printing more often than that ran on to E2B's own backstop (its timeout + 30 s).
    started = time.monotonic()
    result, lines = run_script(e2b, tmp_path, CHATTY, timeout_seconds=2.0)
    assert result.timed_out, result
    assert lines  # it did print
    assert time.monotonic() - started < 20  # well before the backstop at 32 s


def test_a_run_that_never_stops_printing_can_still_be_cancelled(
    e2b: E2BSandbox, tmp_path: Path
) -> None:
    asked = threading.Event()

    def on_line(stream: str, line: str) -> None:
        asked.set()

    result, _ = run_script(
        e2b, tmp_path, CHATTY, on_line=on_line, should_cancel=asked.is_set, timeout_seconds=25.0
    )
    assert result.cancelled, result


def test_output_faster_than_the_log_takes_it_waits_in_the_sandbox_not_in_floom_s_memory(
    e2b: E2BSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a reader thread put every chunk on an unbounded queue; a run printing faster
    # than the run's log stores lines piled them up in floom's memory.
    from floom.sandbox.e2b import command as command_module

    made: list[command_module.E2BCommand] = []
    real = command_module.E2BCommand.__init__

    def remember(self: command_module.E2BCommand, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(command_module.E2BCommand, "__init__", remember)
    waiting: list[int] = []

    def slow_log(stream: str, line: str) -> None:
        waiting.append(made[0].events.qsize())
        time.sleep(0.002)

    result, lines = run_script(
        e2b,
        tmp_path,
        "import sys\nfor i in range(3000): sys.stdout.write(f'line {i}\\n')",
        on_line=slow_log,
    )
    assert result.exit_code == 0
    assert len(lines) == 3000
    assert max(waiting) <= command_module.QUEUED_CHUNKS


def test_files_trickling_back_end_the_run_at_its_time_limit_not_never(
    standin: E2BStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: each read of the download waited up to 120 s and the download as a whole had
    # no end, so an envd answering a byte at a time held the run (and its slot) for ever.
    from floom.sandbox.e2b import backend as backend_module

    monkeypatch.setattr(backend_module, "COLLECT_MIN_SECONDS", 1.0)
    e2b = e2b_backend(standin)

    async def trickle(path: str) -> AsyncIterator[bytes]:
        for _ in range(600):  # 30 s
            yield b"\x1f"
            await asyncio.sleep(0.05)

    standin.serve_downloads(trickle)
    started = time.monotonic()
    result, _ = run_script(e2b, tmp_path, "print('done')", timeout_seconds=2.0)
    assert result.timed_out, result
    assert "bringing back" in (result.error or "")
    assert time.monotonic() - started < 15
    assert list((tmp_path / "output").iterdir()) == []


def _deflate_bomb(encoding: str, unpacked: int) -> bytes:
    """`unpacked` zero bytes compressed as `encoding` names them: about a thousandth of it."""
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "raw": -zlib.MAX_WBITS}
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits[encoding])
    block = bytes(1 << 20)
    parts = [packer.compress(block) for _ in range(unpacked >> 20)]
    return b"".join([*parts, packer.flush()])


def test_a_deflated_download_is_decoded_no_further_than_floom_brings_back(
    standin: E2BStandin, tmp_path: Path
) -> None:
    # Before: the SDK's reader decoded each chunk read from the wire whole: 8 KiB of a
    # deflate-encoded answer made one 8 MiB chunk in floom's memory before any bound was
    # looked at (a peak of 22 MiB here for deflate, 2 MiB after, where floom brings back
    # 1.1 MiB at most). gzip the SDK's transport decodes itself, 4 KiB at a time.
    e2b = e2b_backend(standin, max_result_bytes=1 << 16, max_artifact_bytes=1 << 16)
    bomb = _deflate_bomb("deflate", 256 << 20)

    async def answer(path: str) -> AsyncIterator[bytes]:
        yield bomb

    standin.serve_downloads(answer, encoding="deflate")
    tracemalloc.start()
    try:
        result, _ = run_script(e2b, tmp_path, "print('done')")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.limit_exceeded == "files", result
    assert peak < 8 << 20, f"{peak >> 20} MiB held at once"


def test_a_download_in_an_encoding_floom_did_not_ask_for_ends_the_run_saying_so(
    standin: E2BStandin, tmp_path: Path
) -> None:
    e2b = e2b_backend(standin)

    async def answer(path: str) -> AsyncIterator[bytes]:
        yield b"\x28\xb5\x2f\xfd" + bytes(64)

    standin.serve_downloads(answer, encoding="zstd, gzip")
    with pytest.raises(SandboxUnavailable, match="'zstd, gzip'"):
        run_script(e2b, tmp_path, "print('done')")
