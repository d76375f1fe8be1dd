"""The one rule for the names a worker may give its process's environment variables."""

from __future__ import annotations

from pathlib import Path

from floom.sandbox import env_names

SECURITY_MODEL = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "security-model.md"


def test_the_security_model_lists_every_refused_name_and_prefix() -> None:
    readme = SECURITY_MODEL.read_text()
    refused = [f"{prefix}*" for prefix, _why in env_names._PREFIXES] + list(env_names._NAMES)
    missing = [name for name in refused if f"`{name}`" not in readme]
    assert missing == []


def test_a_refused_name_is_refused_in_any_case_and_its_neighbours_are_not() -> None:
    for name in ("LD_PRELOAD", "ld_preload", "Ld_Audit", "PYTHONHOME", "glibc_tunables"):
        assert env_names.refusal(name), name
    for name in ("LDAP_URL", "NODE_ENV", "PATHS", "MY_PATH", "HOME_DIR", "FLOOMX", "GITHUB_TOKEN"):
        assert env_names.refusal(name) is None, name


def test_floom_passes_only_its_own_run_values_among_the_refused_names() -> None:
    assert all(env_names.refusal(name) for name in env_names.RUN_VARIABLES)
    assert "FLOOM_SANDBOX_FOR" not in env_names.RUN_VARIABLES
