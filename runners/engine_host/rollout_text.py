"""What a Tinker session's requests said, as text for its run's rollouts (DESIGN §14): each
sequence a sampler drew (its prompt, its completion, how it stopped, the sampler's mean
logprob) and each datum a forward_backward trained on (the part it trained, with the mean
advantage it carried). Decoded here, where the tokenizer is; the server records them. No
reward: the server never sees one."""

from __future__ import annotations

from typing import Any

import numpy as np
from tinker import types

from core.tinker_wire import RolloutText

MAX_CHARS = 8000  # of one prompt or completion: a record is for reading, not for replay
MAX_RECORDS = 1024  # of one request: a step keeps far fewer (rollouts_per_step)


def samples(tokenizer: Any, prompt: list[int], response: types.SampleResponse) -> list[RolloutText]:
    prompt_text = _text(tokenizer, prompt)
    out = []
    for sequence in response.sequences[:MAX_RECORDS]:
        tokens = list(sequence.tokens)
        logprobs = sequence.logprobs
        out.append(
            RolloutText(
                prompt=prompt_text,
                completion=_text(tokenizer, tokens),
                prompt_tokens=len(prompt),
                completion_tokens=len(tokens),
                finish_reason=sequence.stop_reason,
                logprob_mean=float(np.mean(logprobs)) if logprobs else None,
            )
        )
    return out


def datums(tokenizer: Any, data: list[types.Datum]) -> list[RolloutText]:
    """Each datum split where its training starts: what it was given before the first target
    it trains (weights above 0, or a sampled token: a nonzero advantage or sampler logprob),
    and the targets it trains, with their mean advantage."""
    out = []
    for datum in data[:MAX_RECORDS]:
        inputs = datum.model_input.to_ints()
        targets = _array(datum, "target_tokens")
        trained = _trained(datum, len(inputs))
        first = int(np.argmax(trained)) if trained.any() else len(inputs)
        advantages = _array(datum, "advantages")
        advantage = (
            float(advantages[trained].mean()) if advantages is not None and trained.any() else None
        )
        completion = targets[trained].tolist() if targets is not None else []
        out.append(
            RolloutText(
                prompt=_text(tokenizer, inputs[: first + 1]),
                completion=_text(tokenizer, completion),
                prompt_tokens=min(first + 1, len(inputs)),
                completion_tokens=len(completion),
                advantage=advantage,
            )
        )
    return out


def _trained(datum: types.Datum, length: int) -> np.ndarray:
    mask = np.zeros(length, dtype=bool)
    for key in ("weights", "advantages", "logprobs"):
        values = _array(datum, key)
        if values is not None and values.shape == (length,):
            mask |= values != 0
    return mask


def _array(datum: types.Datum, key: str) -> np.ndarray | None:
    tensor = datum.loss_fn_inputs.get(key)
    return None if tensor is None else np.asarray(tensor.to_numpy()).reshape(-1)


def _text(tokenizer: Any, tokens: list[int]) -> str:
    text = str(tokenizer.decode(tokens, skip_special_tokens=False))
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…"
