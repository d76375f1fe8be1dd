"""`floom secrets` and `floom keys`: thin clients of the secrets and API-key REST API."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from floom.cli.common import open_client
from floom.cli.output import err, fail, new_table, out, when

secrets_app = typer.Typer(help="Secrets that workers can declare (values are never shown).")
keys_app = typer.Typer(help="API keys: create, list, revoke.")


def register(app: typer.Typer) -> None:
    """Add the secrets and keys command groups to the floom command."""
    app.add_typer(secrets_app, name="secrets", no_args_is_help=True)
    app.add_typer(keys_app, name="keys", no_args_is_help=True)


@secrets_app.command("set")
def secrets_set(
    name: Annotated[str, typer.Argument(help="secret name, e.g. GITHUB_TOKEN")],
    value_stdin: Annotated[
        bool, typer.Option("--value-stdin", help="read the value from stdin")
    ] = False,
) -> None:
    """Set a secret; the value comes from a hidden prompt or from stdin."""
    if value_stdin or not sys.stdin.isatty():
        value = sys.stdin.read()
        value = value.removesuffix("\n").removesuffix("\r")
    else:
        value = typer.prompt(f"value of {name}", hide_input=True, confirmation_prompt=True)
    if not value:
        fail("the secret value is empty", "pipe the value in or type it at the prompt")

    with open_client() as client:
        client.set_secret(name, value)
    out.print(Text(f"secret {name} set"))


@secrets_app.command("list")
def secrets_list() -> None:
    """List secret names (never values)."""
    with open_client() as client:
        items = client.list_secrets().items
    if not items:
        out.print("no secrets yet: add one with `floom secrets set NAME`")
        return
    table = new_table("NAME", "UPDATED")
    for s in items:
        table.add_row(s.name, when(s.updated_at or s.created_at))
    out.print(table)


@secrets_app.command("rm")
def secrets_rm(name: Annotated[str, typer.Argument(help="secret name")]) -> None:
    """Delete a secret."""
    with open_client() as client:
        client.delete_secret(name)
    out.print(Text(f"secret {name} removed"))


# -- API keys --------------------------------------------------------------------------------


@keys_app.command("create")
def keys_create(
    scope: Annotated[
        list[str], typer.Option("--scope", help="read, run, deploy or admin; repeat for several")
    ],
    name: Annotated[str, typer.Option("--name", help="what the key is for")] = "",
) -> None:
    """Create an API key; the key is printed once, on stdout."""
    with open_client() as client:
        created = client.create_key(scopes=scope, name=name)
    err.print(Text(f"created API key {created.id} with scopes {', '.join(created.scopes)}"))
    out.print(Text(created.key))
    err.print(Text("store it now: this key will not be shown again", style="yellow"))


@keys_app.command("list")
def keys_list() -> None:
    """List API keys (ids and prefixes, never the keys)."""
    with open_client() as client:
        items = client.list_keys().items
    table = new_table("ID", "NAME", "PREFIX", "SCOPES", "CREATED", "REVOKED")
    for k in items:
        table.add_row(
            k.id,
            k.name,
            k.prefix,
            ",".join(k.scopes),
            when(k.created_at),
            when(k.revoked_at) if k.revoked_at else "",
        )
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="key id (see `floom keys list`)")],
) -> None:
    """Revoke an API key at once."""
    with open_client() as client:
        client.revoke_key(key_id)
    out.print(Text(f"revoked API key {key_id}"))
