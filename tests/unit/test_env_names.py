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


# Names beyond issue 28's list that make a program load code or run a command of the value's
# choosing, as a prober would try them next: each is refused, its harmless neighbours are not.
CODE_LOADING = (
    "OPENSSL_CONF",
    "openssl_engines",
    "OPENSSL_MODULES",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_KEY_0",
    "GIT_SSH_COMMAND",
    "GIT_EXEC_PATH",
    "npm_config_script_shell",
    "NPM_CONFIG_NODE_OPTIONS",
    "LESSOPEN",
    "PAGER",
    "EDITOR",
    "SSH_ASKPASS",
    "GTK_MODULES",
    "GIO_EXTRA_MODULES",
    "SASL_PATH",
    "KRB5_CONFIG",
    "GEM_PATH",
    "R_PROFILE_USER",
    "GOFLAGS",
    "RUSTC_WRAPPER",
    "ZDOTDIR",
    "BASH_LOADABLES_PATH",
    "SSLKEYLOGFILE",
)


def test_names_that_load_code_or_run_a_command_beyond_the_issues_list_are_refused() -> None:
    assert [name for name in CODE_LOADING if not env_names.refusal(name)] == []
    for name in ("GIT_TOKEN", "GITHUB_TOKEN", "NPM_TOKEN", "OPENAI_API_KEY", "R_API_KEY"):
        assert env_names.refusal(name) is None, name


def test_floom_passes_only_its_own_run_values_among_the_refused_names() -> None:
    assert all(env_names.refusal(name) for name in env_names.RUN_VARIABLES)
    assert "FLOOM_SANDBOX_FOR" not in env_names.RUN_VARIABLES
