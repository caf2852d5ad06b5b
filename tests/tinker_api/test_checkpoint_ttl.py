"""A checkpoint's time to live, with the clock injected: kept until it passes, then its folder
and row are deleted by the sweep (TinkerWeights.expire), and a time to live removed keeps it.
No live server: the records and the folders, as the server's sweeper sees them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from core import schema
from core.checkpoint_check import SAMPLER_RECORD, STATE_RECORD
from core.db import make_engine
from server.errors import BadRequest, Forbidden
from server.tinker_api.downloads import DownloadSigner
from server.tinker_api.sessions.records import SessionRecords
from server.tinker_api.weights import TinkerWeights


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def saved(records: SessionRecords, run_id: str, run_dir: Path, name: str, kind: str) -> Path:
    folder = run_dir / "tinker" / "train-0" / name / kind
    folder.mkdir(parents=True)
    (folder / (STATE_RECORD if kind == "state" else SAMPLER_RECORD)).write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    records.add_model(run_id, 0, {"model_id": f"{run_id}:train:0", "base_model": "tiny-random"})
    records.checkpoint(run_id, 0, kind, name, str(folder))
    return folder


def test_checkpoints_go_once_their_time_to_live_passes(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'rlcs.db'}")
    schema.upgrade(engine)
    records = SessionRecords(engine, tmp_path / "runs")
    run_id, run_dir = records.create({"sdk_version": "0.38.0"})
    clock = Clock()
    weights = TinkerWeights(records, DownloadSigner(), now=clock)
    short = saved(records, run_id, run_dir, "short", "state")
    kept = saved(records, run_id, run_dir, "kept", "sampler")
    model_id = f"{run_id}:train:0"

    weights.set_ttl(model_id, "weights/short", 3600)
    weights.set_ttl(model_id, "sampler_weights/kept", 7200)
    weights.set_ttl(model_id, "sampler_weights/kept", None)  # removed again: kept for good
    with pytest.raises(BadRequest, match="ttl_seconds: 59 is out of bounds"):
        weights.set_ttl(model_id, "weights/short", 59)

    clock.now += timedelta(minutes=59)
    assert weights.expire() == []
    assert short.is_dir()
    clock.now += timedelta(minutes=2)
    assert weights.expire() == [f"tinker://{model_id}/weights/short"]
    assert not short.parent.exists() and kept.is_dir()
    assert [row.name for row in records.checkpoints([run_id])] == ["kept"]
    clock.now += timedelta(days=3650)
    assert weights.expire() == []


def test_a_download_signature_outside_ascii_is_refused_not_a_crash() -> None:
    signer = DownloadSigner(clock=lambda: 100.0)
    url, expires = signer.url("http://127.0.0.1", "traces/abc")
    good = url.rpartition("signature=")[2]
    signer.check("traces/abc", int(expires), good)  # the server's own signature passes
    with pytest.raises(Forbidden, match="signature"):
        signer.check("traces/abc", int(expires), "*\U000f4d7d\x9bÇàT")
