"""Checkpoints after they are saved, as the RestClient and the `tinker` command line manage
them: signed URLs for an exported adapter's files and the files themselves, a checkpoint's
time to live (expired ones are deleted by the sweeper), publication, and copies."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from core.models import Run, utcnow
from server.errors import BadRequest, NotFound
from server.tinker_api import paths
from server.tinker_api.downloads import DownloadSigner
from server.tinker_api.schemas import CopyWeightsIn, JsonObject
from server.tinker_api.sessions.records import SessionRecords

MIN_TTL_S, MAX_TTL_S = 3600, 10 * 365 * 86400  # the SDK's bounds: an hour to ten years
COPY_SEQS = 900_000  # copies' model numbers start here (model ids allow six digits)
# Our own files in a checkpoint folder (record, manifest): not part of what is downloaded.
OWN_FILES = "rlcs_"


def expiry(ttl_seconds: int | None, field: str, now: datetime | None = None) -> datetime | None:
    """When a checkpoint given `ttl_seconds` expires; BadRequest naming `field` out of bounds."""
    if ttl_seconds is None:
        return None
    if not MIN_TTL_S <= ttl_seconds <= MAX_TTL_S:
        raise BadRequest(
            f"{field}: {ttl_seconds} is out of bounds; give seconds between {MIN_TTL_S} (an "
            f"hour) and {MAX_TTL_S} (ten years), or none to keep it until deleted"
        )
    return (now or utcnow()) + timedelta(seconds=ttl_seconds)


class TinkerWeights:
    def __init__(
        self, records: SessionRecords, signer: DownloadSigner, now: Callable[[], datetime] = utcnow
    ) -> None:
        self._records = records
        self._signer = signer
        self._now = now
        self._copies: dict[str, JsonObject] = {}  # by the SDK's X-Idempotency-Key

    # Downloads ---------------------------------------------------------------------------

    def external_urls(self, model_id: str, checkpoint_id: str, base_url: str) -> JsonObject:
        ref, _, folder = self._checkpoint(model_id, checkpoint_id)
        if ref.kind != paths.EXTERNAL_KIND:
            raise BadRequest(
                f"checkpoint_id: {checkpoint_id} is not external weights; save_weights_external "
                "makes them (tinker checkpoint download does it for a training checkpoint)"
            )
        urls, expires = {}, 0.0
        for file in _files(folder):
            urls[file], expires = self._signer.url(base_url, f"{model_id}/{ref.name}/{file}")
        return {"urls": urls, "expires": datetime.fromtimestamp(expires, UTC).isoformat()}

    def download(self, model_id: str, name: str, file: str, expires: int, signature: str) -> Path:
        """The file a signed URL names (checked first)."""
        self._signer.check(f"{model_id}/{name}/{file}", expires, signature)
        _, _, folder = self._checkpoint(model_id, f"external_weights/{name}")
        if file not in _files(folder):
            raise NotFound(f"file: {file[:100]} is not a file of {name}")
        return folder / file

    # Time to live and publication ----------------------------------------------------------

    def set_ttl(self, model_id: str, checkpoint_id: str, ttl_seconds: int | None) -> None:
        run, ref, folder = self._row_of(model_id, checkpoint_id)
        expires_at = expiry(ttl_seconds, "ttl_seconds", self._now())
        self._records.update_checkpoint(run.id, str(folder), expires_at=expires_at)

    def publish(self, model_id: str, checkpoint_id: str, public: bool) -> None:
        run, ref, folder = self._row_of(model_id, checkpoint_id)
        row = self._records.update_checkpoint(run.id, str(folder))
        assert row is not None
        if row.public == public:
            # Tinker documents a 409, which the SDK retries for minutes: a 400 ends the call.
            state = "public" if public else "private"
            raise BadRequest(f"checkpoint_id: {ref.path} is already {state}")
        self._records.update_checkpoint(run.id, str(folder), public=public)

    def expire(self) -> list[str]:
        """Delete the checkpoints whose time to live passed (folders and rows); their paths."""
        gone = []
        for row in self._records.expired(self._now()):
            folder = Path(row.path)
            shutil.rmtree(folder, ignore_errors=True)
            if folder.parent.is_dir() and not any(folder.parent.iterdir()):
                folder.parent.rmdir()
            self._records.forget_checkpoint(row.run_id, row.path)
            ref = paths.from_folder(row.run_id, row.path)
            gone.append(ref.path if ref is not None else row.path)
        return gone

    # Copies ------------------------------------------------------------------------------

    def copy(self, body: CopyWeightsIn, idempotency_key: str | None) -> JsonObject:
        """A copy of a checkpoint as a new training run that cannot be trained on (its files
        linked, not duplicated): the model `model_seq_id` of `session_id`, or, given only a
        project (which this server records but does not separate), a new model of the
        source's session."""
        if idempotency_key and idempotency_key in self._copies:
            return self._copies[idempotency_key]
        source = _parse(body.source_path, "source_path")
        _, _, folder = self._checkpoint(source.model_id, source.checkpoint_id)
        owner = body.session_id or source.session_id
        run = self._records.run(owner)
        if run is None:
            raise NotFound(f"session_id: no Tinker session {owner[:80]} on this server")
        models = json.loads(run.config_json).get("models") or {}
        if body.session_id and body.model_seq_id is None:
            raise BadRequest("model_seq_id: give the copy's model sequence id with session_id")
        seq = body.model_seq_id if body.model_seq_id is not None else _next_seq(models, run)
        if str(seq) in models:
            raise BadRequest(f"model_seq_id: {paths.model_id(owner, seq)} exists; pick a new one")
        copy = paths.CheckpointRef(owner, seq, source.kind, source.name)
        target = copy.folder(Path(run.run_dir))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(folder, target, copy_function=_link_or_copy)
        record = json.loads((folder / source.record_file).read_text())
        self._records.add_model(
            owner,
            seq,
            {
                "model_id": copy.model_id,
                "base_model": record.get("base_model"),
                "lora_rank": (record.get("lora") or {}).get("rank"),
                "user_metadata": None,
                "copied_from": body.source_path,
            },
        )
        kind = source.kind
        expires_at = expiry(body.ttl_seconds, "ttl_seconds", self._now())
        self._records.checkpoint(run.id, run.step, kind, source.name, str(target), expires_at)
        answer = {"tinker_path": copy.path}
        if idempotency_key:
            self._copies[idempotency_key] = answer
        return answer

    # Helpers -----------------------------------------------------------------------------

    def _checkpoint(
        self, model_id: str, checkpoint_id: str
    ) -> tuple[paths.CheckpointRef, Run, Path]:
        ref = _parse(f"{paths.PREFIX}{model_id}/{checkpoint_id}", "checkpoint_id")
        run = self._records.run(ref.session_id)
        folder = ref.folder(Path(run.run_dir)) if run is not None else None
        if run is None or folder is None or not (folder / ref.record_file).is_file():
            raise NotFound(f"checkpoint_id: no checkpoint {ref.path} on this server")
        return ref, run, folder

    def _row_of(self, model_id: str, checkpoint_id: str) -> tuple[Run, paths.CheckpointRef, Path]:
        ref, run, folder = self._checkpoint(model_id, checkpoint_id)
        if self._records.update_checkpoint(run.id, str(folder)) is None:
            raise NotFound(f"checkpoint_id: {ref.path} is not recorded on this server")
        return run, ref, folder


def _parse(path: str, field: str) -> paths.CheckpointRef:
    try:
        return paths.parse(path, field)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _files(folder: Path) -> list[str]:
    return sorted(
        f.name for f in folder.iterdir() if f.is_file() and not f.name.startswith(OWN_FILES)
    )


def _next_seq(models: dict[str, Any], run: Run) -> int:
    """A model number for a copy, above those a script numbers its clients with (from 0), so
    a live session's next client never meets it."""
    folder = paths.model_folder(Path(run.run_dir), 0).parent
    taken = {int(k) for k in models} | {
        int(p.name.removeprefix("train-"))
        for p in (folder.iterdir() if folder.is_dir() else [])
        if p.name.removeprefix("train-").isdigit()
    }
    return max(taken | {COPY_SEQS - 1}) + 1


def _link_or_copy(source: str, target: str) -> None:
    """Share the bytes where the file system can (a hard link), as the hosted copy does."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
