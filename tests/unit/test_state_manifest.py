"""worker.yml's `state:` section: checked with paths, exported in the JSON Schema, and held to
the server's FLOOM_MAX_STATE_BYTES at deploy."""

from __future__ import annotations

from pathlib import Path

import pytest

from floom.errors import ManifestInvalid
from floom.manifest.load import parse_manifest
from floom.manifest.schema import manifest_json_schema
from floom.services.workers.limit_ceilings import over_ceilings
from tests.support.harness import fast_settings


def test_state_in_worker_yml_is_checked_exported_and_held_to_the_servers_ceiling(
    tmp_path: Path,
) -> None:
    files = frozenset({"run.py"})
    assert parse_manifest("name: a\nstate: true\n", files).state.enabled is True
    assert parse_manifest("name: a\n", files).state.enabled is False
    spec = parse_manifest("name: a\nstate: {on_conflict: retry}\n", files).state
    assert spec.enabled
    assert spec.on_conflict == "retry"
    assert spec.max_bytes is None
    with pytest.raises(ManifestInvalid) as bad:
        parse_manifest("name: a\nstate: {on_conflict: never, max_bytes: 1}\n", files)
    paths = sorted(d["path"] for d in bad.value.details)
    assert paths == ["state.max_bytes", "state.on_conflict"]
    schema = manifest_json_schema()
    assert schema["properties"]["state"]["anyOf"][0] == {"type": "boolean"}
    assert set(schema["$defs"]["StateSpec"]["properties"]) == {
        "enabled",
        "on_conflict",
        "max_bytes",
    }

    settings = fast_settings(tmp_path, "sqlite://", max_state_bytes=1000)
    over = parse_manifest("name: a\nstate: {max_bytes: 5000}\n", files)
    (problem,) = over_ceilings(over, settings)
    assert problem.path == "state.max_bytes"
    assert "FLOOM_MAX_STATE_BYTES" in problem.message
    assert over_ceilings(parse_manifest("name: a\nstate: true\n", files), settings) == []
