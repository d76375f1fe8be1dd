"""A run's artifacts for an agent over MCP: the get_artifact tool and the artifact resource
follow one rule, text inline up to MAX_INLINE_ARTIFACT_BYTES, any other file a download link
with its media type and size; written against the Backend interface."""

from __future__ import annotations

import json
from typing import Annotated
from urllib.parse import quote

from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver import Context
from pydantic import Field

from floom.engine.collect import is_text
from floom.errors import NotFound, quoted
from floom.mcp.backends.base import JSON, Backend
from floom.mcp.render import Reply, quoted_lines, said
from floom.mcp.toolkit import READ, FloomTool, backend_of, floom_tool, off
from floom.schemas.runs import ArtifactPublic

# A model's context is the budget: text up to this size comes inline, anything larger as a
# link (the tool's description says "64 KiB"; a test keeps them equal).
MAX_INLINE_ARTIFACT_BYTES = 64 * 1024
# `+`: an artifact's name is a path under the run's output dir and may hold slashes.
ARTIFACT_URI = "floom://runs/{run_id}/artifacts/{+name}"
# What a resource read answers instead of a binary or large artifact's bytes.
LINK_MEDIA_TYPE = "application/vnd.floom.artifact-link+json"
DOWNLOAD_HOW = "GET it with your floom API key as a bearer token (Authorization: Bearer <key>)"

RunId = Annotated[str, Field(description="run id, e.g. run_0123abcd...")]
ArtifactName = Annotated[
    str,
    Field(description="the artifact's name as get_run lists it, e.g. report.md or out/data.csv"),
]


def artifact_uri(run_id: str, name: str) -> str:
    return f"floom://runs/{run_id}/artifacts/{quote(name, safe='/')}"


def artifact_path(run_id: str, name: str) -> str:
    """The REST API's download path of an artifact, its name quoted for a URL."""
    return f"/api/v1/runs/{quote(run_id, safe='')}/artifacts/{quote(name, safe='/')}"


def with_links(backend: Backend, run_id: str, artifact: ArtifactPublic) -> JSON:
    """An artifact as listed, with where an agent gets it: the MCP resource and the URL."""
    name = artifact.name
    return {
        **artifact.to_json(),
        "download_url": backend.link(artifact_path(run_id, name)),
        "uri": artifact_uri(run_id, name),
    }


class ArtifactView(ArtifactPublic):
    """An artifact as get_artifact shows it: with its links, and its text when it comes
    inline, or why it does not."""

    download_url: str
    uri: str
    inline: bool
    text: str | None = None
    why: str | None = None

    omit_when_unset = ArtifactPublic.omit_when_unset | {"text", "why"}


def open_artifact(backend: Backend, run_id: str, name: str) -> ArtifactView:
    """The run's artifact `name` with its links, plus "text" when it is text of at most
    MAX_INLINE_ARTIFACT_BYTES ("inline": true), else "why" it is a link only.

    Text is decided as floom.engine.collect decided it when the run ended (the same
    is_text); secrets were masked in every artifact's bytes then. An artifact floom could not
    scan (compressed, encrypted) never comes inline and is refused to a key without the run
    scope, as the REST download is. Only a name the run's listing holds is read."""
    listing = backend.list_artifacts(run_id)
    found = next((a for a in listing.items if a.name == name), None)
    if found is None:
        names = [a.name for a in listing.items]
        hint = f"its artifacts: {', '.join(names)}" if names else f"run {run_id} left no files"
        raise NotFound(f"run {quoted(run_id)} has no artifact '{quoted(name)}'", hint=hint)
    linked = with_links(backend, run_id, found)
    if not found.scanned:
        backend.read_artifact(run_id, name)  # refuses a key that may not read it, as REST does
        why = "not scanned for secrets (compressed or encrypted)"
        return ArtifactView(**linked, inline=False, why=why)
    if found.size > MAX_INLINE_ARTIFACT_BYTES:
        why = f"larger than {MAX_INLINE_ARTIFACT_BYTES} bytes"
        return ArtifactView(**linked, inline=False, why=why)
    data = backend.read_artifact(run_id, name)
    if not is_text(data):
        return ArtifactView(**linked, inline=False, why="binary")
    return ArtifactView(**linked, inline=True, text=data.decode("utf-8"))


def artifact_text(view: ArtifactView) -> str:
    head = f"{said(view.name)} ({said(view.content_type)}, {view.size} bytes)"
    if view.inline:
        # The file's lines are the worker's: each marked so, none posing as floom's.
        return f"{head}, each line after '| ':\n{quoted_lines(view.text or '')}"
    return (
        f"{head} is {view.why}, so it is not shown inline; download it from "
        f"{view.download_url}: {DOWNLOAD_HOW}"
    )


async def artifact_contents(ctx: Context, run_id: str, name: str) -> ReadResourceContents:
    """The artifact resource's contents: the text with its media type, or for a binary or
    large file a small JSON document (LINK_MEDIA_TYPE) with its type, size and URL."""
    view = await off(open_artifact, backend_of(ctx), run_id, name)
    if view.inline:
        # A text file without a known extension is stored as application/octet-stream.
        media = view.content_type
        media = "text/plain" if media == "application/octet-stream" else media
        return ReadResourceContents(content=view.text or "", mime_type=media)
    link = {
        "name": view.name,
        "content_type": view.content_type,
        "size": view.size,
        "digest": view.digest,
        "download_url": view.download_url,
        "why": view.why,
        "how": DOWNLOAD_HOW,
    }
    return ReadResourceContents(content=json.dumps(link), mime_type=LINK_MEDIA_TYPE)


@floom_tool
async def get_artifact(ctx: Context, run_id: RunId, name: ArtifactName) -> Reply:
    """A file a run left (get_run lists its artifacts). Text up to 64 KiB comes inline (as
    written in the structured content; in the text, each line after '| ' with control
    characters escaped); a binary or larger file comes as a download URL with its media type
    and size. Also a resource: floom://runs/{run_id}/artifacts/{name}."""
    view = await off(open_artifact, backend_of(ctx), run_id, name)
    return Reply(artifact_text(view), view.to_json())


ARTIFACT_TOOLS: tuple[FloomTool, ...] = (FloomTool(get_artifact, READ, "read"),)
