"""The files around the image and the compose file: .dockerignore keeps local state (a
virtualenv, git, caches, test and bench output, secrets) out of the build context but lets
through everything the Dockerfile copies; .env.example lists every variable
docker-compose.yml reads, with no value a secret, and as a .env it loads as the docs say."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.harness import REPO
from tests.support.processes.compose import (
    MissingVariable,
    compose_config,
    floom_services,
    interpolated_names,
    load_compose,
    service_env,
)

Rule = tuple[bool, re.Pattern[str]]


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker matches it (Go's filepath.Match plus `**`): `*` and
    `?` stay within one path component, `**` spans any number, no pattern is unanchored."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_rules(text: str) -> list[Rule]:
    rules: list[Rule] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.removeprefix("!").strip().lstrip("/").rstrip("/")
        rules.append((negate, _pattern(pattern)))
    return rules


def ignored(path: str, rules: list[Rule]) -> bool:
    """Whether Docker leaves `path` (relative to the context) out: the last rule matching it
    or one of its parent folders decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    out = False
    for negate, rule in rules:
        if any(rule.fullmatch(prefix) for prefix in prefixes):
            out = not negate
    return out


def test_the_dockerignore_matcher_reads_patterns_as_docker_does() -> None:
    rules = dockerignore_rules("__pycache__\n**/*.pyc\n.env.*\n!.env.example\n")
    assert ignored("__pycache__/a.pyc", rules)
    assert ignored("floom/deep/x.pyc", rules)
    assert ignored(".env.local", rules)
    assert not ignored(".env.example", rules)
    # A bare name is anchored at the context's root, unlike .gitignore's.
    no_glob = dockerignore_rules("__pycache__\n")
    assert not ignored("floom/__pycache__/a.cpython-311.opt", no_glob)


def copied_sources() -> list[str]:
    """Every source path of the Dockerfile's COPY lines (the last word is the target)."""
    dockerfile = (REPO / "Dockerfile").read_text()
    sources: list[str] = []
    for words in re.findall(r"^COPY\s+(.+)$", dockerfile, re.M):
        sources += words.split()[:-1]
    return sources


def test_dockerignore_lets_through_what_the_dockerfile_copies_and_leaves_out_local_state() -> None:
    rules = dockerignore_rules((REPO / ".dockerignore").read_text())
    sources = copied_sources()
    assert {"pyproject.toml", "README.md", "floom", "web", "workers"} <= set(sources)
    tracked = subprocess.run(
        ["git", "ls-files", "--", *sources],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for source in sources:
        assert any(path == source or path.startswith(source + "/") for path in tracked), source
    assert [path for path in tracked if ignored(path, rules)] == []
    left_out = [
        ".venv/lib/python3.11/site-packages/typer/__init__.py",
        ".venv/bin/python",
        ".git/HEAD",
        "floom/__pycache__/config.cpython-311.pyc",
        "floom/cli/__pycache__/index.cpython-311.pyc",
        "tests/__pycache__/conftest.cpython-311-pytest-8.3.4.pyc",
        "floom.egg-info/PKG-INFO",
        ".pytest_cache/v/cache/lastfailed",
        ".mypy_cache/3.11/floom/config.meta.json",
        ".ruff_cache/0.8.0/123",
        "test-artifacts/junit.xml",
        ".floom/floom.db",
        "workers/hello/.floom/floom.db",
        "bench/bench_runs.py",
        ".env",
        ".env.production",
    ]
    assert [path for path in left_out if not ignored(path, rules)] == []


def env_example() -> dict[str, str]:
    """.env.example as Compose reads a .env: NAME=value lines, # comments."""
    text = (REPO / ".env.example").read_text()
    return dict(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", text, re.M))


def test_env_example_lists_every_variable_the_compose_file_reads_each_explained() -> None:
    text = (REPO / ".env.example").read_text()
    listed = env_example()
    read = interpolated_names(load_compose())
    assert {"FLOOM_SECRET_KEY", "FLOOM_BOOTSTRAP_API_KEY", "E2B_API_KEY"} <= read
    assert read | {"COMPOSE_PROFILES"} == set(listed)
    assert all(value == "" for value in listed.values()), "no value, let alone a secret"
    for name in listed:  # each under a comment that says what it is
        assert re.search(rf"^#.*\n{name}=", text, re.M), name


def test_env_example_as_a_dot_env_refuses_until_filled_then_loads_each_profile() -> None:
    """`cp .env.example .env`, then `docker compose up` with nothing exported: Compose reads
    the .env beside the file (COMPOSE_PROFILES too)."""
    dotenv = (REPO / ".env.example").read_text()
    with pytest.raises(MissingVariable, match=r"FLOOM_SECRET_KEY|FLOOM_BOOTSTRAP_API_KEY"):
        compose_config({}, dotenv=dotenv)
    filled = dotenv.replace("FLOOM_SECRET_KEY=\n", f"FLOOM_SECRET_KEY={'a1' * 32}\n").replace(
        "FLOOM_BOOTSTRAP_API_KEY=\n", f"FLOOM_BOOTSTRAP_API_KEY=flm_{'b2' * 24}\n"
    )
    for profile in ("", "bwrap", "e2b"):
        chosen = filled.replace("COMPOSE_PROFILES=\n", f"COMPOSE_PROFILES={profile}\n")
        config = compose_config({}, dotenv=chosen)
        started = floom_services(config)
        assert len(started) == (1 if not profile else 3), profile
        api = service_env(config["services"]["api"])
        assert api["FLOOM_PUBLIC_URL"] == "http://localhost:8321"
        assert "floom:floom@postgres:5432/floom" in api["FLOOM_DATABASE_URL"]


def test_the_docs_say_compose_v2_is_required_and_point_at_env_example() -> None:
    page = (REPO / "docs" / "how-to" / "cluster.md").read_text()
    section = page[page.index("`docker-compose.yml` at the top of the repository") :]
    section = section[: section.index("\n## ")]
    assert "Docker Compose v2" in section
    assert ".env.example" in section
