"""Nodes as users see them: which hosts are registered and alive."""

from __future__ import annotations

import json

from fastapi import APIRouter

from api.http.deps import CurrentUser, ServicesDep
from api.http.schemas import NodePublic, NodesPublic

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


@router.get("")
def list_nodes(services: ServicesDep, _: CurrentUser) -> NodesPublic:
    """Registered nodes, their accelerators, and whether their agent is alive."""
    live = services.state.live_nodes(services.settings.node_timeout_s)
    busy = services.queries.busy_accels()
    return NodesPublic(
        nodes=[
            NodePublic(
                id=row["id"], name=row["name"], accels=row["accels"],
                accel_type=row["accel_type"], busy_accels=busy.get(row["id"], 0),
                alive=row["id"] in live, registered_at=row["registered_at"],
                isolation=json.loads(row["isolation"]) if row.get("isolation") else None,
            )  # fmt: skip
            for row in services.queries.nodes()
        ]
    )
