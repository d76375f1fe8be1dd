"""Secrets in artifacts of any encoding: each declared secret is masked in an artifact's bytes
as UTF-8, UTF-16 LE/BE and latin-1 (same length, so a binary format keeps its offsets), and
an artifact floom cannot scan (gzip, zip, xz, bzip2, zstd, 7z, ... told by its first bytes)
is recorded as such and served only to keys with the run scope, on REST, MCP and the UI."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import time
import zipfile
import zlib
from pathlib import Path

import anyio
import httpx
import pytest

from floom.engine.collect import collect_artifacts
from floom.engine.safefiles import Bounds
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.access.secrets import Redactor
from floom.services.runs.artifact_scan import ENCODINGS, mask_bytes, unscannable_kind
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.mcp_clients import call_error, http_client
from tests.support.web import signed_in_client

# Non-ASCII, so that its UTF-8 and latin-1 bytes differ; latin-1 can write it.
SECRET = "pässwörd-Zq9s-4f1d"


def _zip(data: bytes) -> bytes:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("inner.txt", data)
    return raw.getvalue()


PLAIN = f"token={SECRET}\n".encode()
ARCHIVES = {
    "gzip": gzip.compress(PLAIN),
    "zip": _zip(PLAIN),
    "xz": lzma.compress(PLAIN),
    "bzip2": bz2.compress(PLAIN),
    "zstd": b"(\xb5/\xfd" + b"\x00" * 32,
    "7z": b"7z\xbc\xaf\x27\x1c" + b"\x00" * 32,
}


def _collect(tmp_path: Path, files: dict[str, bytes]) -> dict[str, tuple[bytes, str]]:
    out = tmp_path / "out"
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)
    done = collect_artifacts(
        out,
        limit=10 * 1024 * 1024,
        bounds=Bounds(deadline=time.monotonic() + 30),
        redactor=Redactor([SECRET]),
    )
    return {name: (data, content_type) for name, data, content_type in done.artifacts}


# What a prober writes a secret in (the test's own list: floom's ENCODINGS must cover it).
WRITTEN_IN = ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be", "latin-1")


def _leaks(data: bytes) -> list[str]:
    return [e for e in WRITTEN_IN if SECRET.encode(e) in data]


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("latin1.txt", f"caf\xe9 token={SECRET}\n".encode("latin-1")),
        ("utf16le.txt", f"\ufefftoken={SECRET}\n".encode("utf-16-le")),
        ("utf16be.txt", f"\ufefftoken={SECRET}\n".encode("utf-16-be")),
        ("utf16.txt", f"token={SECRET}\n".encode("utf-16")),
        ("utf32le.txt", f"token={SECRET}\n".encode("utf-32-le")),
        ("utf32.txt", f"token={SECRET}\n".encode("utf-32")),
        ("nul-early.txt", b"\0" + f"token={SECRET}\n".encode()),
        ("nul-late.txt", b"x" * 2000 + f"token={SECRET}".encode("utf-16-le")),
        ("image.bin", b"\x89PNG\r\n\x1a\n" + SECRET.encode() + b"\0" + SECRET.encode("latin-1")),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_secret_in_an_artifact_of_any_encoding_is_masked_in_place(
    tmp_path: Path, name: str, data: bytes
) -> None:
    assert _leaks(data)
    kept, _ = _collect(tmp_path, {name: data})[name]
    assert _leaks(kept) == [], kept[:200]
    if b"\0" in data[:1024] or name == "latin1.txt":
        assert len(kept) == len(data)  # binary bytes keep their length and offsets


def test_masking_keeps_the_encoding_of_what_it_masks() -> None:
    for encoding in ENCODINGS:
        masked = mask_bytes(f"a{SECRET}b".encode(encoding), [SECRET])
        needle, star = SECRET.encode(encoding), "*".encode(encoding)
        stars = star * (len(needle) // len(star))  # as many bytes as the secret took
        assert masked == "a".encode(encoding) + stars + "b".encode(encoding), encoding


@pytest.mark.parametrize("kind", sorted(ARCHIVES))
def test_a_compressed_or_archived_artifact_is_recorded_as_unscannable(
    tmp_path: Path, kind: str
) -> None:
    data = ARCHIVES[kind]
    found = unscannable_kind(data)
    assert found is not None
    assert found[0] == kind
    kept, content_type = _collect(tmp_path, {"report.txt": data})["report.txt"]
    assert kept == data
    assert content_type == unscannable_kind(data)[1]  # type: ignore[index]
    assert content_type != "text/plain"


# Compressed bytes that do not start with an archive's magic: a zip behind other bytes (zip
# readers find it from its end), a bare zlib stream, a PDF whose streams are compressed.
HIDDEN = {
    "prefixed-zip": (b"#!/bin/sh\nexit 0\n" * 50 + _zip(PLAIN), "zip"),
    "zlib": (zlib.compress(PLAIN), "zlib"),
    "pdf": (
        b"%PDF-1.7\n1 0 obj\n<< /Length 40 /Filter /FlateDecode >>\nstream\n"
        + zlib.compress(PLAIN)
        + b"\nendstream\nendobj\n%%EOF\n",
        "PDF (compressed or encoded streams)",
    ),
}


@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_compressed_bytes_without_an_archive_s_first_bytes_are_unscannable_too(
    tmp_path: Path, case: str
) -> None:
    data, kind = HIDDEN[case]
    found = unscannable_kind(data)
    assert found is not None
    assert found[0] == kind
    kept, content_type = _collect(tmp_path, {"report.txt": data})["report.txt"]
    assert kept == data
    assert content_type == found[1]
    # Text that shares a zlib stream's first bytes, a PDF with nothing compressed: scanned.
    for i, text in enumerate((b"x^2 + 1 = 0\n" + PLAIN, b"%PDF-1.4\n" + PLAIN)):
        assert unscannable_kind(text) is None
        (tmp_path / str(i)).mkdir()
        assert _leaks(_collect(tmp_path / str(i), {"plain.txt": text})["plain.txt"][0]) == []


def test_a_file_named_like_an_archive_that_is_not_one_is_scanned(tmp_path: Path) -> None:
    kept, content_type = _collect(tmp_path, {"notes.zip": PLAIN})["notes.zip"]
    assert _leaks(kept) == []
    assert content_type == "application/octet-stream"


LEAKY_PY = """\
import gzip, os
tok, out = os.environ["LEAK_TOKEN"], os.environ["FLOOM_OUTPUT_DIR"]
open(f"{out}/latin.txt", "wb").write(("token=" + tok).encode("latin-1"))
open(f"{out}/wide.txt", "wb").write(("token=" + tok).encode("utf-16"))
open(f"{out}/log.gz", "wb").write(gzip.compress(("token=" + tok).encode()))
"""


def test_read_keys_get_a_403_naming_why_for_an_unscannable_artifact_on_every_surface(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "leaky", "name: leaky\nsecrets: [LEAK_TOKEN]\n", {"run.py": LEAKY_PY}
    )
    deploy_folder(api, folder)
    assert api.put("/api/v1/secrets/LEAK_TOKEN", json={"value": SECRET}).status_code == 200
    run = wait_for_run(api, api.post("/api/v1/workers/leaky/runs", json={}).json()["id"])
    assert run["status"] == "succeeded", run
    scanned = {a["name"]: a["scanned"] for a in run["artifacts"]}
    assert scanned == {"latin.txt": True, "log.gz": False, "wide.txt": True}
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")
    base = f"/api/v1/runs/{run['id']}/artifacts"
    with server.client(read_key) as reader:
        for name in ("latin.txt", "wide.txt"):
            body = reader.get(f"{base}/{name}")
            assert body.status_code == 200, name
            assert _leaks(body.content) == [], name
        refused = reader.get(f"{base}/log.gz")
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "forbidden"
        assert "cannot scan" in error["message"]
        assert error["details"]["reason"] == "unscannable"
    # A key that may run the worker gets it as written.
    assert gzip.decompress(api.get(f"{base}/log.gz").content) == f"token={SECRET}".encode()

    async def over_mcp() -> None:
        async with http_client(server, read_key) as client:
            error = await call_error(client, "get_artifact", run_id=run["id"], name="log.gz")
            assert error["code"] == "forbidden"
            assert "cannot scan" in error["message"]

    anyio.run(over_mcp)
    page = signed_in_client(server, read_key)
    try:
        for url in (f"/runs/{run['id']}/artifacts/log.gz", f"/runs/{run['id']}/files/log.gz"):
            assert page.get(url).status_code == 403, url
        assert page.get(f"/runs/{run['id']}/files/latin.txt").status_code == 200
    finally:
        page.close()
