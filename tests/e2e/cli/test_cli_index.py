"""The command index that `floom --help` prints without loading the commands stays true to the
commands themselves: the same names, each with its own docstring's first line."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import typer

import floom
from floom.cli.index import COMMANDS, help_text
from tests.support.harness import REPO, make_worker


def _real_commands() -> dict[str, str]:
    """name -> first line of the help, from every command module's own registration."""
    found: dict[str, str] = {}
    for module, register in {(e.module, e.register) for e in COMMANDS.values()}:
        holder = typer.Typer(add_completion=False)
        getattr(importlib.import_module(f"floom.cli.{module}"), register)(holder)
        for name, command in typer.main.get_group(holder).commands.items():
            found[name] = (command.help or "").strip().splitlines()[0]
    return found


def test_the_index_lists_every_command_with_its_own_first_help_line() -> None:
    real = _real_commands()
    assert sorted(real) == sorted(COMMANDS)
    assert {name: e.summary for name, e in COMMANDS.items()} == real


def test_floom_help_prints_the_index_without_loading_typer_or_a_command_module() -> None:
    probe = (
        "import sys, runpy; sys.argv = ['floom', '--help']; "
        "from floom.cli import main; main(); "
        "heavy = [m for m in ('typer', 'rich', 'httpx', 'pydantic', 'floom.cli.commands.runs') "
        "if m in sys.modules]; print('LOADED', heavy)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.startswith(help_text())
    assert done.stdout.strip().endswith("LOADED []")


def test_a_command_line_loads_only_the_module_of_its_command() -> None:
    probe = (
        "import sys; sys.argv = ['floom', 'secrets', '--help']; "
        "from floom.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith('floom.cli.')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = done.stdout.strip().splitlines()[-1]
    assert "floom.cli.commands.admin" in loaded
    for other in (
        "floom.cli.commands.runs",
        "floom.cli.commands.handoffs",
        "floom.cli.serve",
        "floom.cli.commands.workers",
    ):
        assert other not in loaded


def test_floom_version_prints_the_package_version_without_loading_typer() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert floom.__version__ == declared
    done = subprocess.run(
        [sys.executable, "-m", "floom.cli", "--version"], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"floom {declared}\n", "")
    probe = (
        "import sys; sys.argv = ['floom', '--version']; "
        "from floom.cli import main; main(); "
        "heavy = [m for m in ('typer', 'rich', 'httpx', 'pydantic', 'floom.config') "
        "if m in sys.modules]; print('LOADED', heavy)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout == f"floom {declared}\nLOADED []\n"
    assert "--version" in help_text()


def test_validating_a_worker_folder_loads_neither_the_store_nor_sqlalchemy(tmp_path: Path) -> None:
    """`floom validate` and `floom deploy` check the folder on the user's machine: the checks
    of its triggers once loaded the store's table models (SQLAlchemy and SQLModel) for a
    clock, about 0.25 s of CPU on every such command."""
    folder = make_worker(
        tmp_path / "ticks",
        "name: ticks\ntriggers:\n  - schedule:\n      cron: '*/5 * * * *'\n",
        {"run.py": "print('tick')\n"},
    )
    probe = (
        f"import sys; sys.argv = ['floom', 'validate', {str(folder)!r}]; "
        "from floom.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in ('sqlalchemy', 'sqlmodel', 'floom.store', "
        "'floom.store.models') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("ok: ticks (script, entry run.py)"), done.stdout + done.stderr
    assert done.stdout.strip().endswith("LOADED []")
