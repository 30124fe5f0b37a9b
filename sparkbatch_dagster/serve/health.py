"""``GET /healthz``: liveness, for a load balancer or a supervisor. It answers while the process
serves requests, touching neither the store nor the worker, so a slow disk or a long batch never
reads as a dead server."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel

__all__ = ["Health", "health_router"]


class Health(BaseModel):
    """The answer: the server is up."""

    status: Literal["ok"] = "ok"


def health_router() -> APIRouter:
    """The liveness route."""
    router = APIRouter()

    @router.get("/healthz", response_model=Health, operation_id="healthz")
    def healthz() -> Health:
        return Health()

    return router
