"""The engine host's answers as the SDK's futures resolve them (futures.Outcome), each told to
its session first, which records what it means: a model ready, a forward_backward's tokens and
loss, an optimizer step with its metrics, a checkpoint saved, tokens sampled."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from core.checkpoint_check import SAMPLER_KIND, STATE_KIND
from core.tinker_wire import ModelReady, Sampled, Saved, Stepped, Trained
from server.tinker_api import paths
from server.tinker_api.schemas import JsonObject
from server.tinker_api.sessions.futures import JSON, PROTO, Outcome
from server.tinker_api.sessions.session import Model, Session
from server.tinker_api.sizes import folder_bytes


def model_ready(session: Session, model: Model, ready: ModelReady, reply: JsonObject) -> Outcome:
    session.model_ready(model, ready)
    return json_outcome(reply)


def trained(session: Session, answer: Trained) -> Outcome:
    session.trained(answer)
    return Outcome(PROTO, answer.output)


def stepped(session: Session, answer: Stepped) -> Outcome:
    session.stepped(answer)
    return json_outcome({"metrics": answer.metrics, "type": "optim_step"})


KIND_NAMES = {
    STATE_KIND: "save_weights",
    SAMPLER_KIND: "save_weights_for_sampler",
    paths.EXTERNAL_KIND: "save_weights_external",
}


def saved(
    session: Session,
    model: Model,
    kind: str,
    name: str,
    answer: Saved,
    expires_at: datetime | None = None,
) -> Outcome:
    ref = paths.CheckpointRef(session.id, model.seq, kind, name)
    session.saved(kind, name, answer.folder, ref.path, expires_at)
    reply: JsonObject = {"path": ref.path, "type": KIND_NAMES[kind]}
    if kind == paths.EXTERNAL_KIND:
        reply["size_bytes"] = folder_bytes(Path(answer.folder))
    return json_outcome(reply)


def sampled(session: Session, answer: Sampled) -> Outcome:
    session.sampled(answer)
    return Outcome(PROTO, answer.output)


def json_outcome(value: JsonObject) -> Outcome:
    return Outcome(JSON, json.dumps(value).encode())
