"""The app of ``sparkbatch serve-batch``: one router per API on a :class:`.store.Store` and its
:class:`.worker.Worker` (OpenAI's Files, :mod:`.openai_files`, and Batches, :mod:`.openai_batches`;
Anthropic's Message Batches, :mod:`.anthropic_batches`, its errors in Anthropic's shape; liveness,
:mod:`.health`), behind the :class:`.guard.Guard` (Host, Origin, API key, body size).

Requests are checked against their models (:mod:`.openai_models`); every error, the
framework's own included (an unknown route, a bad query parameter), is OpenAI's shape with a
4xx status: 400 for a bad request, as OpenAI answers. The OpenAPI document is ``/openapi.json``
(no ``/docs`` page: it would load its scripts from a CDN into the server's own origin).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import Response

from .anthropic_batches import anthropic_router
from .anthropic_models import AnthropicErrorResponse, MessageBatchCreate
from .guard import Access, ApiError, Guard, is_anthropic, refusal_for
from .health import health_router
from .openai_batches import batches_router
from .openai_files import files_router
from .openai_models import ErrorResponse
from .store import Store
from .worker import Worker

TITLE = "sparkbatch serve-batch: OpenAI Files and Batches API, Anthropic Message Batches API"
#: Refusals any operation may answer (the guard's, and 400 for a request its model refuses).
COMMON_ERRORS = {"400": "a bad request: the message names the parameter and the fix",
                 "403": "a web page's request (its Origin is not allowed)",
                 "413": "the request body is over the server's cap",
                 "421": "a Host name the server does not answer to"}
CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
__all__ = ["ApiError", "make_app"]


def make_app(store: Store, worker: Worker, access: Access) -> FastAPI:
    """The server's ASGI app: one router per API on ``store`` and ``worker``, behind ``access``'s guard."""
    app = FastAPI(title=TITLE, version="1", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.add_middleware(Guard, access=access)
    _add_error_handlers(app)
    for router in (files_router(store), batches_router(store, worker), anthropic_router(store, worker),
                   health_router()):
        app.include_router(router)
    app.openapi = lambda: _openapi(app, access)  # type: ignore[method-assign]
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape (Anthropic's under ``/v1/messages``): the routes', the models',
    the framework's."""

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return refusal_for(request.url.path, exc.status, exc.message, exc.code, exc.param)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            return refusal_for(request.url.path, 400, f"the body is not JSON: {first.get('ctx', {}).get('error')}",
                               "invalid_json")
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        message = f"{param}: {first['msg']}" if param else f"the request body: {first['msg']} (send a JSON object)"
        return refusal_for(request.url.path, 400, message, str(first["type"]), param)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (f"{request.method} {request.url.path} is not served here (the Files, Batches and "
                       "Message Batches endpoints are: see /openapi.json)")
        headers = exc.headers
        if exc.status_code == 405:  # Allow: the methods of every route on this path, not only the first's
            methods = sorted({m for r in request.app.routes if isinstance(r, APIRoute) and
                              r.path_regex.fullmatch(request.url.path) for m in r.methods})
            message, headers = f"{request.method} is not served on {request.url.path}", {"Allow": ", ".join(methods)}
        return refusal_for(request.url.path, exc.status_code, message, CODES.get(exc.status_code), headers=headers)

    async def server_error(request: Request, exc: Exception) -> Response:
        return refusal_for(request.url.path, 500, f"the server failed: {type(exc).__name__}: {exc}", "server_error",
                              kind="server_error")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_error)


def _openapi(app: FastAPI, access: Access) -> dict[str, Any]:
    """FastAPI's document, with the errors as served: 400 (not 422) and the guard's, in OpenAI's
    shape (Anthropic's on the Message Batches routes), and the bearer key when the server asks for one."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes, description=__doc__)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    # MessageBatchCreate: the create route reads its body itself (anthropic_create), so FastAPI
    # does not list the schema that its request body names.
    for model in (ErrorResponse, AnthropicErrorResponse, MessageBatchCreate):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, nested in schema.pop("$defs", {}).items():
            schemas.setdefault(name, nested)
        schemas.setdefault(model.__name__, schema)
    errors = {**COMMON_ERRORS, **({"401": "no API key, or a wrong one"} if access.api_key else {})}
    for path, item in doc["paths"].items():
        name = AnthropicErrorResponse.__name__ if is_anthropic(path) else ErrorResponse.__name__
        ref = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}
        for operation in item.values():
            operation["responses"].pop("422", None)
            operation["responses"].update({status: {"description": text, **ref} for status, text in errors.items()})
    if access.api_key:
        doc["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"apiKey": []}]
    app.openapi_schema = doc
    return doc
