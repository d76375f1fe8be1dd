"""The web UI's nodes page: the cluster's nodes and which of them went silent."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from floom.api.auth import CtxDep
from floom.schemas.nodes import node_public
from floom.services.ops import nodes
from floom.ui.support import Me, UiRoute, render

router = APIRouter(route_class=UiRoute, include_in_schema=False)


@router.get("/nodes")
def nodes_page(request: Request, ctx: CtxDep, me: Me) -> Response:
    items = [node_public(v) for v in nodes.list_nodes(ctx, caller=me.caller)]
    return render(request, "nodes.html", {"items": items})
