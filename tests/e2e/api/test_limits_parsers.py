"""Bounded parsers and quotas: worker.yml (size, depth, nodes, aliases), archives (entries,
names, clashes), run inputs (bytes, depth) and each API key's request rate."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest

from floom.api.auth import RateLimiter
from floom.bundle import Bundle, BundleFile, read_archive, read_folder
from floom.errors import BundlePathInvalid, BundleTooLarge, ManifestTooLarge, RateLimited
from floom.manifest.schema import MAX_MANIFEST_DEPTH, Manifest
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from tests.support.harness import LiveServer, fast_settings, live_server
from tests.support.mcp_clients import call, http_client

RUN_PY = "import json\njson.dump({'outputs': {}}, open('result.json', 'w'))\n"
# A "billion laughs" kept small enough for today's code to survive: a valid manifest of
# under 1 KB whose last default expands to 9**6 strings (9**9 cost 34 s and 400 MB).
ALIAS_BOMB = "name: bomb\ndescription: &a lol\ninputs:\n" + "".join(
    f"  {name}: {{type: array, default: &{name} [{', '.join([f'*{prev}'] * 9)}]}}\n"
    for prev, name in zip("abcdef", "bcdefg", strict=True)
)
# Like the 409-byte manifest that made every listing of workers 6.9 MB.
ALIAS_LISTING = (
    "name: amplifier\ndescription: &a "
    + "x" * 64
    + "\ninputs:\n"
    + "".join(
        f"  {name}: {{type: array, default: &{name} [{', '.join([f'*{prev}'] * 8)}]}}\n"
        for prev, name in zip("abcde", "bcdef", strict=True)
    )
)
OBJECT_WORKER = "name: takes-object\ninputs:\n  doc: {type: object}\n"


def archive(manifest: str, **files: str) -> bytes:
    entries = {"worker.yml": manifest, "run.py": RUN_PY, **files}
    return Bundle(
        {path: BundleFile(path, text.encode()) for path, text in entries.items()}
    ).to_archive()


def raw_tar(entries: list[tuple[str, bytes | None]]) -> bytes:
    """A tar.gz with exactly these entries in this order; None makes a directory entry."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=6)


def worker_entries() -> list[tuple[str, bytes | None]]:
    return [("worker.yml", b"name: clash\n"), ("run.py", RUN_PY.encode())]


def post(client: httpx.Client, path: str, body: bytes) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = client.post(path, content=body, headers={"Content-Type": "application/gzip"})
    return response, time.monotonic() - started


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    assert set(error) >= {"code", "message", "hint"}, error
    assert "Traceback" not in response.text
    return error


@pytest.fixture
def reader(server: LiveServer) -> Iterator[httpx.Client]:
    _, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")
    with server.client(token) as client:
        yield client


# -- worker.yml ------------------------------------------------------------------------------


def test_an_alias_bomb_sent_to_validate_with_a_read_key_is_refused_as_aliases_at_once(
    reader: httpx.Client,
) -> None:
    assert len(ALIAS_BOMB) < 1100
    response, seconds = post(reader, "/api/v1/workers/validate", archive(ALIAS_BOMB))
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "manifest_aliases_refused"
    assert error["details"][0]["limit"] == "aliases"
    assert "alias" in error["message"]
    assert error["hint"]
    # Expanding it took 34 s before; refusing it costs milliseconds.
    assert seconds < 5


def test_a_worker_yml_of_10_mb_is_refused_by_its_size_before_it_is_parsed(
    reader: httpx.Client,
) -> None:
    huge = "name: many\n" + "".join(f"k{i}: {i}\n" for i in range(800_000))
    assert len(huge) > 10_000_000
    response, seconds = post(reader, "/api/v1/workers/validate", archive(huge))
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "manifest_too_large"
    assert error["details"][0]["limit"] == "bytes"
    assert seconds < 10  # parsing it took 120 s before


def test_a_worker_yml_with_more_nodes_than_the_limit_is_refused_naming_the_limit(
    reader: httpx.Client,
) -> None:
    many = "name: many\nx: [" + ", ".join("1" for _ in range(20_000)) + "]\n"
    response, _ = post(reader, "/api/v1/workers/validate", archive(many))
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "manifest_too_large"
    assert error["details"][0]["limit"] == "nodes"


@pytest.mark.parametrize(
    "manifest",
    [
        "name: deep\nx: " + "[" * 10_000 + "]" * 10_000 + "\n",
        "name: deep\nx: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n",
        "name: deep\nx: " + "[" * 400 + "\n",
        "name: deep\n" + "".join("  " * i + f"k{i}:\n" for i in range(400)),
    ],
    ids=["flow-lists", "flow-maps", "unclosed", "block"],
)
def test_nesting_thousands_of_levels_deep_answers_422_not_500(
    reader: httpx.Client, manifest: str
) -> None:
    response, _ = post(reader, "/api/v1/workers/validate", archive(manifest))
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "manifest_too_large"
    assert error["details"][0] == error["details"][0] | {"limit": "depth", "max": 32}


@pytest.mark.parametrize(
    "manifest",
    ["name: loop\nx: &a [*a]\n", "name: loop\nx: &a {b: *a}\n", "&a name: loop\n"],
    ids=["list", "map", "anchor-only"],
)
def test_a_self_referencing_alias_or_any_anchor_answers_422_not_500(
    reader: httpx.Client, manifest: str
) -> None:
    response, _ = post(reader, "/api/v1/workers/validate", archive(manifest))
    assert response.status_code == 422, response.text[:500]
    assert error_of(response)["code"] == "manifest_aliases_refused"


def test_a_manifest_with_aliases_cannot_be_deployed_to_amplify_every_listing(
    api: httpx.Client,
) -> None:
    assert len(ALIAS_LISTING) < 700
    response, _ = post(api, "/api/v1/workers", archive(ALIAS_LISTING))
    assert response.status_code == 422, response.text[:500]
    assert error_of(response)["code"] == "manifest_aliases_refused"
    listing = api.get("/api/v1/workers")
    assert listing.status_code == 200
    assert listing.json()["items"] == []
    assert len(listing.content) < 10_000  # was 6.9 MB


def test_an_input_default_nested_250_deep_is_refused_and_list_workers_over_mcp_still_answers(
    server: LiveServer, api: httpx.Client
) -> None:
    deep_default = "[" * 250 + "]" * 250
    manifest = f"name: deep-default\ninputs:\n  x: {{type: array, default: {deep_default}}}\n"
    response, _ = post(api, "/api/v1/workers", archive(manifest))
    assert response.status_code == 422, response.text[:500]
    assert error_of(response)["details"][0]["limit"] == "depth"
    fine = "name: shallow\ninputs:\n  x: {type: array, default: " + "[" * 20 + "]" * 20 + "}\n"
    assert post(api, "/api/v1/workers", archive(fine))[0].status_code == 201

    async def session() -> None:
        async with http_client(server) as mcp:
            listed = await call(mcp, "list_workers")
            assert [w["name"] for w in listed["items"]] == ["shallow"]

    anyio.run(session)


def test_the_manifest_model_refuses_values_nested_deeper_than_the_limit() -> None:
    deep: list[Any] = []
    for _ in range(250):
        deep = [deep]
    fields = {"name": "w", "entry": "run.py"}
    spec = {"type": "array", "default": deep}
    with pytest.raises(ValueError, match=f"deeper than {MAX_MANIFEST_DEPTH}"):
        Manifest.model_validate({**fields, "inputs": {"x": spec}})
    with pytest.raises(ValueError, match=f"deeper than {MAX_MANIFEST_DEPTH}"):
        Manifest.model_validate({**fields, "triggers": [{"webhook": {"a": deep}}]})
    assert Manifest.model_validate({**fields, "inputs": {"x": {"type": "array", "enum": [[1]]}}})


def test_a_folder_whose_worker_yml_is_too_large_is_refused_locally(tmp_path: Path) -> None:
    from floom.manifest.load import check_folder

    (tmp_path / "worker.yml").write_text("name: w\n" + "#" * 300_000 + "\n")
    (tmp_path / "run.py").write_text(RUN_PY)
    with pytest.raises(ManifestTooLarge) as caught:
        check_folder(tmp_path)
    assert caught.value.details[0]["limit"] == "bytes"


# -- archives --------------------------------------------------------------------------------


def test_directory_entries_count_toward_the_entry_limit(api: httpx.Client) -> None:
    # The audit's upload held 200k directories (7 s to read); a tenth shows the same.
    upload = raw_tar(worker_entries() + [(f"d{i}", None) for i in range(20_000)])
    response, seconds = post(api, "/api/v1/workers", upload)
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "bundle_too_large"
    assert error["details"] == {"limit": "entries", "max": 4000}
    assert seconds < 5
    assert api.get("/api/v1/workers").json()["items"] == []


@pytest.mark.parametrize(
    ("extra", "limit"),
    [
        ([("n" * 256, b"x")], "name_bytes"),
        ([("/".join(["p" * 200] * 6), b"x")], "path_bytes"),
    ],
    ids=["name", "path"],
)
def test_names_longer_than_the_limits_are_refused_at_deploy(
    api: httpx.Client, extra: list[tuple[str, bytes | None]], limit: str
) -> None:
    response, _ = post(api, "/api/v1/workers", raw_tar(worker_entries() + extra))
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "bundle_path_invalid"
    assert error["details"]["limit"] == limit
    assert api.get("/api/v1/workers").json()["items"] == []


@pytest.mark.parametrize(
    "extra",
    [
        [("a", b"file"), ("a/b", b"inside")],
        [("a/b", b"inside"), ("a", b"file")],
        [("a", b"file"), ("a", None)],
        [("a", b"one"), ("a", b"two")],
        [("a", b"one"), ("./a", b"two")],
    ],
    ids=["file-then-dir", "dir-then-file", "dir-entry", "twice", "twice-normalised"],
)
def test_a_name_clash_is_refused_at_deploy_not_at_every_run(
    api: httpx.Client, extra: list[tuple[str, bytes | None]]
) -> None:
    response, _ = post(api, "/api/v1/workers", raw_tar(worker_entries() + extra))
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "bundle_path_invalid"
    assert "'a'" in error["message"]
    assert api.get("/api/v1/workers").json()["items"] == []


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ru\u200bn.py", "zero-width"),
        ("lib/a\u202eyp.exe", "bidi"),
        ("a\x1b[31mb.py", "control"),
        ("a\u2028b", "control"),
        ("\ufeffworker.yml", "zero-width"),
    ],
    ids=["zero-width", "bidi-override", "escape", "line-separator", "bom"],
)
def test_a_file_whose_name_shows_as_another_is_refused_at_deploy(
    api: httpx.Client, name: str, kind: str
) -> None:
    # "ru\u200bn.py" lists as "run.py" in the version's files: a reader of the worker would
    # be shown a file that is not the one that runs.
    response, _ = post(api, "/api/v1/workers", raw_tar([*worker_entries(), (name, b"x")]))
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "bundle_path_invalid"
    assert kind in error["message"]
    assert name not in error["message"]
    assert api.get("/api/v1/workers").json()["items"] == []


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        ([("worker.yml", b"name: latin\ndescription: caf\xe9\n"), ("run.py", b"x")], "worker.yml"),
        (
            [("worker.yml", b"name: skilled\n"), ("SKILL.md", b"# Summarise\n\xff\xfe do it\n")],
            "SKILL.md",
        ),
    ],
    ids=["worker-yml", "skill-md"],
)
def test_a_worker_yml_or_skill_md_that_is_not_utf8_is_refused_at_deploy_and_validate(
    api: httpx.Client, entries: list[tuple[str, bytes | None]], named: str
) -> None:
    # Read with its bytes replaced, a Latin-1 worker.yml deployed (and its manifest stored)
    # as text other than the file's, which `floom check` of the same folder refuses; a
    # SKILL.md the same, as the agent's instructions.
    response, _ = post(api, "/api/v1/workers/validate", raw_tar(entries))
    assert response.status_code == 200, response.text[:500]
    assert response.json()["valid"] is False
    [problem] = response.json()["problems"]
    assert problem["message"].startswith(f"{named} is not UTF-8 text (byte 0x"), problem
    response, _ = post(api, "/api/v1/workers", raw_tar(entries))
    assert response.status_code == 400, response.text[:500]
    error = error_of(response)
    assert error["code"] == "manifest_invalid", error
    assert f"{named} is not UTF-8 text" in error["message"], error
    assert f"save {named} as UTF-8" in error["hint"], error
    assert api.get("/api/v1/workers").json()["items"] == []


def test_an_archive_made_by_tar_from_inside_the_folder_deploys(
    api: httpx.Client, tmp_path: Path
) -> None:
    folder = tmp_path / "dotted"
    (folder / "lib").mkdir(parents=True)
    (folder / "worker.yml").write_text("name: dotted\n")
    (folder / "run.py").write_text(RUN_PY)
    (folder / "lib" / "util.py").write_text("X = 1\n")
    packed = tmp_path / "w.tgz"
    subprocess.run(["tar", "czf", str(packed), "-C", str(folder), "."], check=True)
    with tarfile.open(packed) as archive:
        listed = archive.getnames()
    assert "." in listed
    assert "./worker.yml" in listed

    response, _ = post(api, "/api/v1/workers", packed.read_bytes())

    assert response.status_code == 201, response.text[:500]
    version = response.json()["version"]
    assert version["file_count"] == 3
    files = api.get(f"/api/v1/workers/dotted/versions/{version['id']}").json()["files"]
    assert sorted(f["path"] for f in files) == ["lib/util.py", "run.py", "worker.yml"]
    also: list[tuple[str, bytes | None]] = [("./", None), ("./worker.yml", b"name: slashed\n")]
    response, _ = post(api, "/api/v1/workers", raw_tar([*also, ("./run.py", RUN_PY.encode())]))
    assert response.status_code == 201, response.text[:500]


@pytest.mark.parametrize(
    "name", ["../run.py", "./../run.py", "lib/../../run.py", "/etc/run.py", "."]
)
def test_an_entry_that_escapes_the_folder_is_refused_with_the_archive_format(
    api: httpx.Client, name: str
) -> None:
    response, _ = post(api, "/api/v1/workers", raw_tar([*worker_entries(), (name, b"x")]))
    assert response.status_code == 400, response.text[:500]
    error = error_of(response)
    assert "points outside the worker folder" in error["message"]
    assert "tar czf worker.tgz -C FOLDER ." in error["hint"]
    assert api.get("/api/v1/workers").json()["items"] == []


def test_an_upload_leaves_environment_files_and_fifos_out_and_says_so(
    api: httpx.Client, reader: httpx.Client
) -> None:
    # Before: an archive sent to the REST API shipped `.env` and `sub/.env.local` into the
    # version, readable by any read key and in every run's sandbox (and a FIFO was refused),
    # while `floom deploy` of the same folder left them out.
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [
            *worker_entries(),
            (".env", b"TOKEN=sk-live\n"),
            ("sub/.env.local", b"TOKEN=x\n"),
            (".env.example", b"TOKEN=\n"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data or b""))
        fifo = tarfile.TarInfo("pipe")
        fifo.type = tarfile.FIFOTYPE
        tar.addfile(fifo)
    upload = gzip.compress(raw.getvalue())

    checked, _ = post(reader, "/api/v1/workers/validate", upload)
    response, _ = post(api, "/api/v1/workers", upload)

    assert checked.status_code == 200, checked.text[:500]
    assert response.status_code == 201, response.text[:500]
    for said in (checked.json()["left_out"], response.json()["left_out"]):
        assert [why.split(" ", 1)[0] for why in said] == ["'.env'", "'sub/.env.local'", "'pipe'"]
        # Told as a REST client does it.
        assert "PUT /api/v1/secrets/NAME" in said[0]
        assert "FIFO" in said[2]
    version = response.json()["version"]["id"]
    files = api.get(f"/api/v1/workers/clash/versions/{version}").json()["files"]
    assert sorted(f["path"] for f in files) == [".env.example", "run.py", "worker.yml"]
    # The same version as the files without them: one content id whatever the surface.
    plain = raw_tar([*worker_entries(), (".env.example", b"TOKEN=\n")])
    again, _ = post(api, "/api/v1/workers", plain)
    assert again.json()["version"]["id"] == version
    assert again.json()["created"] is False
    assert again.json()["left_out"] == []


@pytest.mark.parametrize(
    ("first", "second", "named"),
    [
        ("caf\u00e9.py", "cafe\u0301.py", "cafe\u0301.py"),  # composed, decomposed: NFC-equal
        ("run2.py", "run\u00b2.py", "run\u00b2.py"),  # a superscript two: NFKC-equal
        ("lib/run.py", "lib\uff0frun.py", "lib\uff0frun.py"),  # a fullwidth solidus
        ("conff/a.py", "con\ufb00/a.py", "con\ufb00"),  # folders too: U+FB00 is "ff"
    ],
    ids=["nfc", "nfkc", "solidus", "folder"],
)
def test_two_names_that_differ_only_in_unicode_form_are_refused_at_deploy(
    api: httpx.Client, tmp_path: Path, first: str, second: str, named: str
) -> None:
    # Before: both were stored as two files of one version that every listing and diff
    # showed under one name, so a reader could not tell which one ran or changed.
    extra: list[tuple[str, bytes | None]] = [(first, b"one"), (second, b"two")]
    response, _ = post(api, "/api/v1/workers", raw_tar(worker_entries() + extra))
    assert response.status_code == 422, response.text[:500]
    error = error_of(response)
    assert error["code"] == "bundle_path_invalid"
    assert "differ only in Unicode form" in error["message"]
    assert ascii(named) in error["message"]
    assert api.get("/api/v1/workers").json()["items"] == []
    # So is a folder holding both (Linux keeps them apart), before anything is sent.
    folder = tmp_path / "w"
    for name, data in [*worker_entries(), *extra]:
        (folder / str(name)).parent.mkdir(parents=True, exist_ok=True)
        (folder / str(name)).write_bytes(data or b"")
    with pytest.raises(BundlePathInvalid, match="differ only in Unicode form"):
        read_folder(folder, max_bytes=1 << 20)
    # A version stored before this rule is read as stored, and still runs.
    stored = Bundle({name: BundleFile(name, b"") for name in (first, second)}).to_archive()
    assert sorted(read_archive(stored, max_bytes=1 << 20).files) == sorted([first, second])


def test_names_that_differ_only_in_case_are_distinct_files(api: httpx.Client) -> None:
    extra: list[tuple[str, bytes | None]] = [("a", b"lower"), ("A", b"upper"), ("d", None)]
    response, _ = post(api, "/api/v1/workers", raw_tar(worker_entries() + extra))
    assert response.status_code == 201, response.text[:500]
    assert response.json()["version"]["file_count"] == 4


def test_an_archive_that_unpacks_to_far_more_than_its_limits_is_refused_while_unpacking() -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("worker.yml")
        info.pax_headers = {"comment": "z" * (40 * 1024 * 1024)}
        tar.addfile(info, io.BytesIO(b""))
    upload = gzip.compress(raw.getvalue())
    assert len(upload) < 100_000
    with pytest.raises(BundleTooLarge) as caught:
        read_archive(upload, max_bytes=1024 * 1024)
    assert caught.value.details["limit"] == "unpacked_bytes"


# -- run inputs ------------------------------------------------------------------------------


def test_inputs_larger_than_the_limit_are_refused_before_anything_is_stored(
    server: LiveServer, api: httpx.Client
) -> None:
    assert post(api, "/api/v1/workers", archive(OBJECT_WORKER))[0].status_code == 201
    _, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["run"], name="runner")
    big = {"inputs": {"doc": {"blob": "x" * (2 * 1024 * 1024)}}}
    with server.client(token) as runner:
        response = runner.post("/api/v1/workers/takes-object/runs", json=big)
    assert response.status_code == 413, response.text[:500]
    error = error_of(response)
    assert error["code"] == "inputs_too_large"
    assert error["details"][0]["max"] == 1024 * 1024
    assert api.get("/api/v1/runs").json()["items"] == []


def test_inputs_nested_deeper_than_the_limit_are_refused(
    server: LiveServer, api: httpx.Client
) -> None:
    assert post(api, "/api/v1/workers", archive(OBJECT_WORKER))[0].status_code == 201
    deep: dict[str, Any] = {}
    for _ in range(250):
        deep = {"a": deep}
    response = api.post("/api/v1/workers/takes-object/runs", json={"inputs": {"doc": deep}})
    assert response.status_code == 422, response.text[:500]
    assert error_of(response)["details"][0]["limit"] == "depth"
    assert api.get("/api/v1/runs").json()["items"] == []


# -- request rate ----------------------------------------------------------------------------


@pytest.fixture
def limited(tmp_path: Path, database_url: str) -> Iterator[LiveServer]:
    """A live server that lets each key make 3 requests at once, then 6 a minute."""
    with live_server(
        tmp_path / "data", database_url, rate_limit_per_minute=6, rate_limit_burst=3
    ) as srv:
        yield srv


def test_a_key_over_its_rate_gets_429_with_retry_after_in_the_error_shape(
    limited: LiveServer,
) -> None:
    _, other = keys.create_key(limited.ctx, caller=SYSTEM, scopes=["read"], name="other")
    with limited.client() as api, limited.client(other) as second:
        for _ in range(3):
            assert api.get("/api/v1/workers").status_code == 200
        refused = api.get("/api/v1/runs")
        assert refused.status_code == 429, refused.text
        error = error_of(refused)
        assert error["code"] == "rate_limited"
        assert "FLOOM_RATE_LIMIT_PER_MINUTE" in error["hint"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 10
        # The bucket is the key's: another key is not slowed down by it.
        assert second.get("/api/v1/workers").status_code == 200
        # /mcp authenticates through the same door.
        mcp = api.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json, text/event-stream"},
        )
        assert mcp.status_code == 429
        assert error_of(mcp)["code"] == "rate_limited"
        assert "Retry-After" in mcp.headers
    # A caller without a valid key learns nothing about rates: it is refused as before.
    with limited.client("flm_not-a-key") as stranger:
        assert stranger.get("/api/v1/workers").status_code == 401


def test_the_default_rate_lets_a_client_make_hundreds_of_quick_requests(
    server: LiveServer,
) -> None:
    with server.client() as api:
        for _ in range(300):
            assert api.get("/api/v1/workers").status_code == 200


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_refills_at_the_rate_and_holds_no_more_than_the_burst() -> None:
    clock = Clock()
    limiter = RateLimiter(per_minute=60, burst=2, clock=clock)
    limiter.charge("k")
    limiter.charge("k")
    with pytest.raises(RateLimited) as caught:
        limiter.charge("k")
    assert caught.value.details == {"retry_after_seconds": 1}
    clock.now += 1
    limiter.charge("k")
    clock.now += 3600  # an idle hour still refills only up to the burst
    limiter.charge("k")
    limiter.charge("k")
    with pytest.raises(RateLimited):
        limiter.charge("k")


def test_a_rate_of_zero_turns_the_limit_off() -> None:
    limiter = RateLimiter(per_minute=0, burst=1, clock=Clock())
    for _ in range(10_000):
        limiter.charge("k")


def test_each_app_has_its_own_limiter(tmp_path: Path) -> None:
    from floom.api.app import create_app
    from floom.api.auth import rate_limiter

    settings = fast_settings(tmp_path, "sqlite://", rate_limit_per_minute=60, rate_limit_burst=1)
    first, second = create_app(settings), create_app(settings)
    for app in (first, second):
        app.state.ctx = SimpleNamespace(settings=settings)  # what the lifespan sets
    rate_limiter(first).charge("k")
    with pytest.raises(RateLimited):
        rate_limiter(first).charge("k")
    rate_limiter(second).charge("k")


def test_inputs_within_the_limit_still_run(server: LiveServer, api: httpx.Client) -> None:
    assert post(api, "/api/v1/workers", archive(OBJECT_WORKER))[0].status_code == 201
    doc = {"blob": "x" * 500_000, "nested": json.loads("[" * 30 + "]" * 30)}
    response = api.post("/api/v1/workers/takes-object/runs", json={"inputs": {"doc": doc}})
    assert response.is_success, response.text[:500]
