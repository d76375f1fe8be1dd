"""REST route listing the nodes that share this store."""

from __future__ import annotations

from fastapi import APIRouter

from floom.api.auth import CtxDep, ReadCaller
from floom.api.openapi import authed
from floom.api.routing import JSONRoute
from floom.schemas.nodes import NodeList, node_public
from floom.services.ops import nodes

router = APIRouter(prefix="/api/v1", tags=["nodes"], route_class=JSONRoute)


@router.get(
    "/nodes",
    summary="The cluster's nodes: roles, version, slots, last heartbeat; lost when silent",
    response_model=NodeList,
    responses=authed(),
)
def list_nodes(ctx: CtxDep, caller: ReadCaller) -> NodeList:
    return NodeList(items=[node_public(v) for v in nodes.list_nodes(ctx, caller=caller)])
