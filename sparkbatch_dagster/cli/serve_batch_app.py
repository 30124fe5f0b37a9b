"""The routes of ``sparkbatch serve-batch``: OpenAI's Files and Batches endpoints as a FastAPI
app on a :class:`.batch_service.Store` and its :class:`.batch_service.Worker`, with Anthropic's
Message Batches beside them (:mod:`.anthropic_batches`, its errors in Anthropic's shape), behind
the :class:`.serve_batch_guard.Guard` (Host, Origin, API key, body size).

Requests are checked against their models (:mod:`.serve_batch_models`); every error, the
framework's own included (an unknown route, a bad query parameter), is OpenAI's shape with a
4xx status: 400 for a bad request, as OpenAI answers. The OpenAPI document is ``/openapi.json``
(no ``/docs`` page: it would load its scripts from a CDN into the server's own origin).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
from typing import Annotated, Any, Literal

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import Response

from ..errors import ConfigError
from .anthropic_batches import anthropic_router
from .anthropic_models import AnthropicErrorResponse, MessageBatchCreate
from .batch_service import ENDPOINT, OPEN, Store, Worker, new_batch
from .serve_batch_guard import Access, ApiError, Guard, is_anthropic, refusal_for
from .serve_batch_models import Batch, BatchCreate, BatchList, ErrorResponse, FileDeleted, FileList, FileObject

TITLE = "sparkbatch serve-batch: OpenAI Files and Batches API, Anthropic Message Batches API"
#: Refusals any operation may answer (the guard's, and 400 for a request its model refuses).
COMMON_ERRORS = {"400": "a bad request: the message names the parameter and the fix",
                 "403": "a web page's request (its Origin is not allowed)",
                 "413": "the request body is over the server's cap",
                 "421": "a Host name the server does not answer to"}
CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
__all__ = ["ApiError", "make_app"]


def make_app(store: Store, worker: Worker, access: Access) -> FastAPI:
    """The server's ASGI app: the routes on ``store`` and ``worker``, behind ``access``'s guard."""
    app = FastAPI(title=TITLE, version="1", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.add_middleware(Guard, access=access)
    _add_error_handlers(app)
    not_found: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "no such object"}}

    @app.post("/v1/files", response_model=FileObject, operation_id="files_create", responses=_links(
        {"retrieve": ("files_retrieve", {"file_id": "id"}), "content": ("files_content", {"file_id": "id"}),
         "batch": ("batches_create", {"input_file_id": "id"})}))
    def create_file(file: Annotated[UploadFile, File(description="the batch input file (JSONL)")],
                    purpose: Annotated[Literal["batch"], Form(description="required, as OpenAI's")]) -> FileObject:
        return _keep_upload(store, file, purpose)

    @app.get("/v1/files", response_model=FileList, operation_id="files_list")
    def list_files(purpose: Annotated[str | None, Query(description="only the files of this purpose")] = None,
                   limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
                   after: Annotated[str | None, Query(description="the last id of the previous page")] = None,
                   order: Annotated[Literal["asc", "desc"], Query(description="by created_at")] = "desc",
                   ) -> dict[str, Any]:
        files = [f.model_dump() for f in store.all_files() if purpose is None or f.purpose == purpose]
        return _page(files[::-1] if order == "desc" else files, after, limit)

    @app.delete("/v1/files/{file_id}", response_model=FileDeleted, responses=not_found, operation_id="files_delete")
    def delete_file(file_id: str) -> dict[str, Any]:
        fid = _file(store, file_id).id
        with store.lock:
            using = [b["id"] for b in store.all_batches() if b["status"] in OPEN and b["input_file_id"] == fid]
            if using:
                raise ApiError(400, f"File {fid} is the input of batch {using[0]}, which has not ended: cancel it "
                               "(batches.cancel) or let it finish, then delete the file", "file_in_use", "file_id")
            store.delete_file(fid)
        return {"id": fid, "object": "file", "deleted": True}

    @app.get("/v1/files/{file_id}", response_model=FileObject, responses=not_found, operation_id="files_retrieve")
    def retrieve_file(file_id: str) -> FileObject:
        return _file(store, file_id)

    @app.get("/v1/files/{file_id}/content", response_class=FileResponse, operation_id="files_content",
             responses={**not_found, 200: {"content": {"application/octet-stream": {"schema": {
                 "type": "string", "format": "binary"}}}, "description": "the file's bytes"}})
    def file_content(file_id: str) -> FileResponse:
        path = store.file_path(_file(store, file_id).id)
        if not path.is_file():
            raise ApiError(404, f"File {file_id} has no content on this server", "not_found")
        return FileResponse(path, media_type="application/octet-stream")

    @app.post("/v1/batches", response_model=Batch, operation_id="batches_create", responses=_links(
        {"retrieve": ("batches_retrieve", {"batch_id": "id"}), "cancel": ("batches_cancel", {"batch_id": "id"}),
         "input": ("files_retrieve", {"file_id": "input_file_id"})}))
    def create_batch(body: BatchCreate) -> dict[str, Any]:
        try:
            batch = new_batch(store, body.model_dump())
        except ConfigError as exc:
            raise ApiError(400, str(exc), "invalid_request") from exc
        worker.submit(batch)
        return batch

    @app.get("/v1/batches", response_model=BatchList, operation_id="batches_list")
    def list_batches(after: Annotated[str | None, Query(description="the last id of the previous page")] = None,
                     limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
        return _listing(store, worker, after, limit)

    app.include_router(anthropic_router(store, worker))

    @app.get("/v1/batches/{batch_id}", response_model=Batch, responses=not_found, operation_id="batches_retrieve")
    def retrieve_batch(batch_id: str) -> dict[str, Any]:
        _batch(store, batch_id)
        return worker.progress(batch_id)

    @app.post("/v1/batches/{batch_id}/cancel", response_model=Batch, responses=not_found,
              operation_id="batches_cancel")
    def cancel_batch(batch_id: str) -> dict[str, Any]:
        _batch(store, batch_id)
        return worker.cancel(batch_id)

    app.openapi = lambda: _openapi(app, access)  # type: ignore[method-assign]
    return app


def _links(links: dict[str, tuple[str, dict[str, str]]]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI links from a 200 answer's fields to the operations that take them: ``{name:
    (operation, {parameter: field})}`` (a fuzzer follows them from an upload to its batch)."""
    def link(operation: str, fields: dict[str, str]) -> dict[str, Any]:
        values = {name: f"$response.body#/{field}" for name, field in fields.items()}
        if operation == "batches_create":  # a body, not parameters
            return {"operationId": operation, "requestBody": {**values, "endpoint": ENDPOINT}}
        return {"operationId": operation, "parameters": values}

    return {200: {"links": {name: link(*target) for name, target in links.items()}}}


def _file(store: Store, fid: str) -> FileObject:
    meta = store.file(fid)
    if meta is None:
        raise ApiError(404, f"No such File object: {fid}", "not_found", "file_id")
    return meta


def _batch(store: Store, bid: str) -> dict[str, Any]:
    batch = store.batch(bid)
    if batch is None or batch.get("format", "openai_batch") != "openai_batch":  # a Message Batch is not one
        raise ApiError(404, f"No such Batch object: {bid}", "not_found", "batch_id")
    return batch


def _keep_upload(store: Store, upload: UploadFile, purpose: str) -> FileObject:
    """The upload (spooled to disk as it came) copied beside the store's files, then moved in."""
    tmp = store.files / f".upload-{secrets.token_hex(8)}.tmp"
    try:
        with tmp.open("wb") as out:
            shutil.copyfileobj(upload.file, out, 1024 * 1024)
        return store.add_file(tmp, upload.filename or "upload.jsonl", purpose)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _listing(store: Store, worker: Worker, after: str | None, limit: int) -> dict[str, Any]:
    """``batches.list``: newest first, ``limit`` of them after the id ``after`` (unknown: none)."""
    listing = _page([b for b in store.all_batches() if b.get("format", "openai_batch") == "openai_batch"], after,
                    limit)
    listing["data"] = [worker.progress(b["id"]) if b["status"] in OPEN else b for b in listing["data"]]
    return listing


def _page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """A cursor page, as OpenAI's lists: ``limit`` items after the id ``after`` (unknown: none)."""
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


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
