"""docker-compose.yml and the Dockerfile say only what floom understands: every FLOOM_
variable is a real setting, every command is a floom command with options it takes, and the
cluster's shape (shared settings, roles, health checks, privileges) is what the README says."""

from __future__ import annotations

import re
from typing import Any

import pytest

from floom.cli.command import LazyCommands
from floom.cli.index import COMMANDS
from floom.config import Settings
from tests.compose_support import (
    OPERATOR_ENV,
    floom_services,
    interpolate,
    load_compose,
    service_env,
)
from tests.conftest import REPO

SHARED = ("FLOOM_DATABASE_URL", "FLOOM_SECRET_KEY", "FLOOM_BOOTSTRAP_API_KEY", "FLOOM_PUBLIC_URL")
SETTINGS = {f"FLOOM_{name.upper()}" for name in Settings.model_fields}


def floom_command(argv: list[str]) -> Any:
    """Parse `argv` as the floom command line would; raises on an unknown command/option."""
    assert argv[0] == "floom"
    assert argv[1] in COMMANDS, f"`floom {argv[1]}` is not a floom command"
    group = LazyCommands(name="floom")
    command = group.get_command(None, argv[1])
    return command.make_context(f"floom {argv[1]}", list(argv[2:]))


def test_every_floom_variable_in_the_compose_file_and_dockerfile_is_a_real_setting() -> None:
    text = (REPO / "docker-compose.yml").read_text() + (REPO / "Dockerfile").read_text()
    named = set(re.findall(r"\bFLOOM_[A-Z0-9_]+", text))
    assert named - SETTINGS == set(), "not floom settings"
    compose = load_compose()
    for name, svc in floom_services(compose, profiles={"e2b", "bwrap"}).items():
        env = service_env(svc, OPERATOR_ENV)
        unknown = {k for k in env if k.startswith("FLOOM_")} - SETTINGS
        assert not unknown, (name, unknown)
        Settings(**{k.removeprefix("FLOOM_").lower(): v for k, v in env.items() if k in SETTINGS})


def test_every_command_is_a_floom_command_with_options_it_takes_and_valid_values() -> None:
    compose = load_compose()
    services = floom_services(compose, profiles={"e2b", "bwrap"})
    assert set(services) == {
        "api",
        "executor-e2b-1",
        "executor-e2b-2",
        "executor-bwrap-1",
        "executor-bwrap-2",
    }
    for name, svc in services.items():
        params = floom_command(svc["command"]).params
        Settings(roles=params["roles"])  # a role the settings refuse would stop start-up
        assert params["sandbox"] in (None, "local", "e2b"), name
    with pytest.raises(Exception, match="No such option"):
        floom_command(["floom", "serve", "--role", "api"])
    dockerfile = (REPO / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None and cmd.group(1) == '["floom", "serve"]'


def test_the_cluster_shares_one_database_secret_key_admin_key_and_public_url() -> None:
    compose = load_compose()
    envs = {
        name: service_env(svc, OPERATOR_ENV)
        for name, svc in floom_services(compose, profiles={"e2b", "bwrap"}).items()
    }
    for variable in SHARED:
        assert len({env[variable] for env in envs.values()}) == 1, variable
    url = envs["api"]["FLOOM_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://") and "@postgres:5432/" in url
    # The operator must choose the secrets: without them compose refuses to start.
    for required in ("FLOOM_SECRET_KEY", "FLOOM_BOOTSTRAP_API_KEY"):
        without = {k: v for k, v in OPERATOR_ENV.items() if k != required}
        with pytest.raises(KeyError, match=required):
            service_env(compose["services"]["api"], without)
    assert interpolate("${X:-a}${Y-b}$$", {"Y": ""}) == "a$"


def test_one_api_and_scheduler_node_and_two_executors_per_sandbox_profile() -> None:
    compose = load_compose()
    default = floom_services(compose, profiles=set())
    assert list(default) == ["api"]
    assert floom_command(default["api"]["command"]).params["roles"] == "api,scheduler"
    for profile, sandbox in (("e2b", "e2b"), ("bwrap", "local")):
        extra = {
            name: svc
            for name, svc in floom_services(compose, profiles={profile}).items()
            if name != "api"
        }
        assert len(extra) == 2, profile
        for svc in extra.values():
            params = floom_command(svc["command"]).params
            assert params["roles"] == "executor" and params["sandbox"] == sandbox


def test_health_checks_volume_ports_and_start_order() -> None:
    compose = load_compose()
    postgres = compose["services"]["postgres"]
    assert "pg_isready" in postgres["healthcheck"]["test"]
    assert any(v.startswith("pgdata:/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "pgdata" in compose["volumes"]
    for name, svc in floom_services(compose, profiles={"e2b", "bwrap"}).items():
        port = service_env(svc, OPERATOR_ENV)["FLOOM_PORT"]
        check = " ".join(svc["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/healthz" in check, name
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy", name
    assert compose["services"]["api"]["ports"] == ["8321:8321"]


def test_only_bubblewrap_executors_get_privileges_and_exactly_the_listed_ones() -> None:
    compose = load_compose()
    privileged_keys = ("cap_add", "security_opt", "devices", "privileged", "cgroup", "pid")
    for name, svc in floom_services(compose, profiles={"e2b", "bwrap"}).items():
        if "bwrap" in name:
            assert sorted(svc["cap_add"]) == ["NET_ADMIN", "SYS_ADMIN"]
            assert sorted(svc["security_opt"]) == ["apparmor=unconfined", "seccomp=unconfined"]
            assert svc["devices"] == ["/dev/net/tun:/dev/net/tun"]
            assert not svc.get("privileged")
        else:
            assert not any(k in svc for k in privileged_keys), name
