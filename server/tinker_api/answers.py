"""A session's records made from its requests' answers: a model ready, the tokens and loss of
a forward_backward, an optimizer step with its metrics, a checkpoint saved, tokens sampled;
each gives back what the SDK's future resolves to."""

from __future__ import annotations

import base64
import json
from typing import Any

from core.checkpoint_check import STATE_KIND
from server.tinker_api import paths
from server.tinker_api.engine_client import Message
from server.tinker_api.futures import JSON, PROTO, Outcome
from server.tinker_api.hub import SessionHub
from server.tinker_api.sessions import Model, Session, StepTally

Answer = dict[str, Any]


def model_ready(
    hub: SessionHub, session: Session, model: Model, message: Message, answer: Answer
) -> Outcome:
    info = message["json"]
    model.info = info
    model.base_model = info.get("base_model") or model.base_model
    model.lora_rank = info.get("lora_rank", model.lora_rank)
    model.ready = True
    hub.write(hub.records.add_model, session.id, model.seq, model.record())
    hub.note(
        session.run_dir,
        f"model {model.model_id}: {model.base_model}, LoRA rank {model.lora_rank}",
    )
    return json_outcome(answer)


def trained(session: Session, message: Message) -> Outcome:
    stats = message.get("stats") or {}
    if not stats.get("forward_only"):
        session.tally.loss += float(stats.get("loss") or 0.0)
        session.tally.trained_tokens += int(stats.get("tokens") or 0)
    return Outcome(PROTO, base64.b64decode(message["proto"]))


def stepped(hub: SessionHub, session: Session, message: Message) -> Outcome:
    metrics = message["json"]["metrics"]
    tally, now = session.tally, hub.clock()
    session.step += 1
    values = {
        "train/loss": tally.loss,
        "train/grad_norm": metrics.get("grad_norm"),
        "train/learning_rate": metrics.get("learning_rate"),
        "train/tokens": tally.trained_tokens,
        "sampler/tokens": tally.sampled_tokens,
        "time/step_s": now - tally.started if tally.started else None,
    }
    session.tally = StepTally(started=now)
    hub.write(hub.records.step, session.id, session.step, values)
    hub.note(
        session.run_dir,
        f"step {session.step}: loss {tally.loss:.4g}, grad norm "
        f"{metrics.get('grad_norm', float('nan')):.4g}, {tally.trained_tokens} tokens "
        f"trained, {tally.sampled_tokens} sampled",
    )
    return json_outcome({"metrics": metrics, "type": "optim_step"})


def saved(
    hub: SessionHub, session: Session, model: Model, kind: str, name: str, message: Message
) -> Outcome:
    folder = message["json"]["folder"]
    ref = paths.CheckpointRef(session.id, model.seq, kind, name)
    hub.write(hub.records.checkpoint, session.id, session.step, kind, name, folder)
    hub.note(session.run_dir, f"saved {ref.path}")
    kind_name = "save_weights" if kind == STATE_KIND else "save_weights_for_sampler"
    return json_outcome({"path": ref.path, "type": kind_name})


def sampled(session: Session, message: Message) -> Outcome:
    session.tally.sampled_tokens += int((message.get("stats") or {}).get("tokens") or 0)
    return Outcome(PROTO, base64.b64decode(message["proto"]))


def json_outcome(value: Answer) -> Outcome:
    return Outcome(JSON, json.dumps(value).encode())
