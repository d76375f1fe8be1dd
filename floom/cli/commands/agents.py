"""`floom agents` and `floom roles`: thin clients of the handoff REST API (admins manage)."""

from __future__ import annotations

from typing import Annotated

import typer

from floom.cli.common import HandoffSession, JsonOpt
from floom.cli.output import new_table, note, out, print_json, say, value_text, when

agents_app = typer.Typer(help="Handoff agents: identities with roles and their own API keys.")
roles_app = typer.Typer(help="Handoff roles: the kinds of work agents take on (admins manage).")

RoleOpt = Annotated[list[str], typer.Option("--role", help="a role name; repeat for several")]


def register(app: typer.Typer) -> None:
    """Add `floom agents` and `floom roles` to the floom command."""
    app.add_typer(agents_app, name="agents", no_args_is_help=True)
    app.add_typer(roles_app, name="roles", no_args_is_help=True)


# -- agents ----------------------------------------------------------------------------------


@agents_app.command("create")
def agents_create(
    label: Annotated[str, typer.Argument(help="the agent's name, e.g. claude-laptop")],
    role: RoleOpt,
    tool_family: Annotated[str, typer.Option(help="e.g. claude-code, codex")] = "",
    scope: Annotated[
        list[str] | None, typer.Option("--scope", help="its key's scopes (default: run)")
    ] = None,
) -> None:
    """Create an agent holding roles; its API key is printed once, on stdout."""
    with HandoffSession() as api:
        agent = api.create_agent(
            label, roles=role, tool_family=tool_family, scopes=scope or ["run"]
        )
    note(f"created agent {agent.label} ({agent.id}) with roles {', '.join(agent.roles)}")
    say(agent.key)
    note("store the key now: it will not be shown again", style="yellow")


@agents_app.command("list")
def agents_list(
    include_retired: Annotated[bool, typer.Option("--all", help="retired ones too")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List agents and their roles."""
    with HandoffSession() as api:
        page = api.list_agents(include_retired=include_retired)
    if as_json:
        print_json(page)
        return
    table = new_table("ID", "LABEL", "TOOL", "ROLES", "CREATED", "RETIRED")
    for a in page.items:
        retired = when(a.retired_at) if a.retired_at else ""
        row = (a.id, a.label, a.tool_family, ", ".join(a.roles))
        table.add_row(*row, when(a.created_at), retired)
    out.print(table if table.row_count else "no agents yet")


@agents_app.command("set-roles")
def agents_set_roles(
    agent: Annotated[str, typer.Argument(help="agent id or label")], role: RoleOpt
) -> None:
    """Replace an agent's roles; its next request sees them."""
    with HandoffSession() as api:
        found = api.update_agent(agent, roles=role)
    say(f"agent {found.label} now holds {', '.join(found.roles) or 'no roles'}")


@agents_app.command("retire")
def agents_retire(agent: Annotated[str, typer.Argument(help="agent id or label")]) -> None:
    """Retire an agent: its keys stop working and the jobs it holds are published again."""
    with HandoffSession() as api:
        found = api.retire_agent(agent)
    say(f"retired agent {found.label}")


# -- roles -----------------------------------------------------------------------------------


@roles_app.command("create")
def roles_create(
    name: Annotated[str, typer.Argument(help="e.g. reviewer")],
    description: Annotated[str, typer.Option(help="what agents of this role do")] = "",
) -> None:
    """Create a role."""
    with HandoffSession() as api:
        role = api.create_role(name, description=description)
    say(f"created role {role.name} ({role.id})")


@roles_app.command("rename")
def roles_rename(
    name: Annotated[str, typer.Argument(help="the role's current name")],
    new_name: Annotated[str, typer.Argument(help="its new name")],
) -> None:
    """Rename a role; its jobs and agents keep it."""
    with HandoffSession() as api:
        role = api.update_role(name, name=new_name)
    say(f"renamed role {name} to {role.name}")


@roles_app.command("retire")
def roles_retire(name: Annotated[str, typer.Argument(help="role name")]) -> None:
    """Retire a role: no new jobs for it, and agents stop holding it."""
    with HandoffSession() as api:
        role = api.retire_role(name)
    say(f"retired role {role.name}")


@roles_app.command("list")
def roles_list(
    include_retired: Annotated[bool, typer.Option("--all", help="retired ones too")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List roles."""
    with HandoffSession() as api:
        page = api.list_roles(include_retired=include_retired)
    if as_json:
        print_json(page)
        return
    table = new_table("NAME", "ID", "DESCRIPTION", "RETIRED")
    for r in page.items:
        retired = when(r.retired_at) if r.retired_at else ""
        # One line each: a description stored before floom refused line breaks in one.
        table.add_row(r.name, r.id, value_text(r.description), retired)
    out.print(table if table.row_count else "no roles yet (`floom roles create NAME`)")
