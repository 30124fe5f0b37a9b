"""OpenAI's Files API on ``sparkbatch serve-batch`` (:func:`files_router`, included by
:func:`.app.make_app`): upload a batch input file, list, retrieve, delete, and read a file's
bytes (an input, or a batch's results)."""

from __future__ import annotations

import contextlib
import secrets
import shutil
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import FileResponse

from .guard import ApiError
from .openai_models import ErrorResponse, FileDeleted, FileList, FileObject
from .paging import links, page
from .store import Store

__all__ = ["files_router"]


def files_router(store: Store) -> APIRouter:
    """The Files routes on ``store``."""
    router = APIRouter(prefix="/v1/files")
    not_found: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "no such object"}}

    @router.post("", response_model=FileObject, operation_id="files_create", responses=links(
        {"retrieve": ("files_retrieve", {"file_id": "id"}), "content": ("files_content", {"file_id": "id"}),
         "batch": ("batches_create", {"input_file_id": "id"})}))
    def create_file(file: Annotated[UploadFile, File(description="the batch input file (JSONL)")],
                    purpose: Annotated[Literal["batch"], Form(description="required, as OpenAI's")]) -> FileObject:
        return _keep_upload(store, file, purpose)

    @router.get("", response_model=FileList, operation_id="files_list")
    def list_files(purpose: Annotated[str | None, Query(description="only the files of this purpose")] = None,
                   limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
                   after: Annotated[str | None, Query(description="the last id of the previous page")] = None,
                   order: Annotated[Literal["asc", "desc"], Query(description="by created_at")] = "desc",
                   ) -> FileList:
        files = [f for f in store.all_files() if purpose is None or f.purpose == purpose]
        return FileList.of(*page(files[::-1] if order == "desc" else files, after, limit))

    @router.delete("/{file_id}", response_model=FileDeleted, responses=not_found, operation_id="files_delete")
    def delete_file(file_id: str) -> dict[str, Any]:
        fid = _file(store, file_id).id
        with store.lock:
            using = [b.id for b in store.all_batches() if b.is_open and b.input_file_id == fid]
            if using:
                raise ApiError(400, f"File {fid} is the input of batch {using[0]}, which has not ended: cancel it "
                               "(batches.cancel) or let it finish, then delete the file", "file_in_use", "file_id")
            store.delete_file(fid)
        return {"id": fid, "object": "file", "deleted": True}

    @router.get("/{file_id}", response_model=FileObject, responses=not_found, operation_id="files_retrieve")
    def retrieve_file(file_id: str) -> FileObject:
        return _file(store, file_id)

    @router.get("/{file_id}/content", response_class=FileResponse, operation_id="files_content",
                responses={**not_found, 200: {"content": {"application/octet-stream": {"schema": {
                    "type": "string", "format": "binary"}}}, "description": "the file's bytes"}})
    def file_content(file_id: str) -> FileResponse:
        path = store.file_path(_file(store, file_id).id)
        if not path.is_file():
            raise ApiError(404, f"File {file_id} has no content on this server", "not_found")
        return FileResponse(path, media_type="application/octet-stream")

    return router


def _file(store: Store, fid: str) -> FileObject:
    meta = store.file(fid)
    if meta is None:
        raise ApiError(404, f"No such File object: {fid}", "not_found", "file_id")
    return meta


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
