"""What a sample request may ask of its prompt besides each token's logprob, read from the same
prefill: the top-k tokens at each position (`topk_prompt_logprobs`), the logprobs of tokens it
names (`target_prompt_logprobs`) and draws from the model at each position
(`prompt_alt_tokens_k`), as tinker's SampleResponse carries them. Row i of every matrix is
prompt position i + 1, scored from the tokens before it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tinker import types
from tinker.types.topk_logprobs import TopkLogprobs

MASK_TOKEN, MASK_LOGPROB = 0, -99999.0  # tinker's sentinel for a top-k row left out


@dataclass(frozen=True)
class PromptScoring:
    topk: int = 0
    targets: types.TensorData | None = None  # int64 [len(prompt) - 1, K]; -1 asks nothing
    alt_k: int = 0
    temperature: float = 1.0
    seed: int = 0

    @property
    def wanted(self) -> bool:
        return bool(self.topk or self.targets is not None or self.alt_k)


def scoring(
    prompt_length: int,
    vocab: int,
    *,
    topk: int,
    targets: Any,
    alt_k: int,
    temperature: float,
    seed: int,
) -> PromptScoring | None:
    """The request's asks, checked against its prompt (ValueError naming the field)."""
    for name, value in (("topk_prompt_logprobs", topk), ("prompt_alt_tokens_k", alt_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if topk > vocab:
        raise ValueError(f"topk_prompt_logprobs: {topk} is more than the vocabulary ({vocab})")
    target = _targets(targets, prompt_length, vocab) if targets is not None else None
    asked = PromptScoring(topk, target, alt_k, temperature, seed)
    return asked if asked.wanted else None


def score(
    log_probs: torch.Tensor, prompt: list[int], asked: PromptScoring, last_n: int
) -> dict[str, Any]:
    """SampleResponse's fields for `asked`, from the prompt's next-token log-probabilities
    (`log_probs`: [len(prompt) - 1, vocab], row i predicting prompt[i + 1]); `last_n` > 0
    scores only the last n positions for top-k, as for prompt logprobs."""
    out: dict[str, Any] = {}
    if asked.topk:
        values, ids = log_probs.topk(asked.topk, dim=-1)
        token_ids = np.full((len(prompt), asked.topk), MASK_TOKEN, dtype=np.int32)
        logprobs = np.full((len(prompt), asked.topk), MASK_LOGPROB, dtype=np.float32)
        token_ids[1:], logprobs[1:] = ids.cpu().numpy(), values.cpu().numpy()
        if last_n > 0:
            token_ids[: max(0, len(prompt) - last_n)] = MASK_TOKEN
            logprobs[: max(0, len(prompt) - last_n)] = MASK_LOGPROB
        out["topk_prompt_logprobs_np"] = TopkLogprobs(token_ids=token_ids, logprobs=logprobs)
    if asked.targets is not None:
        out["target_prompt_logprobs"] = _target_logprobs(log_probs, asked.targets)
    if asked.alt_k:
        out["prompt_alt_tokens"] = _alt_tokens(log_probs, asked)
    return out


def _targets(raw: Any, prompt_length: int, vocab: int) -> types.TensorData:
    where = "target_prompt_logprobs"
    try:
        tensor = raw if isinstance(raw, types.TensorData) else types.TensorData(**raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not a tensor ({exc})") from None
    shape = tensor.shape or []
    if tensor.dtype != "int64" or len(shape) != 2 or shape[0] != prompt_length - 1:
        raise ValueError(
            f"{where}: give an int64 tensor of shape [len(prompt) - 1, K] = "
            f"[{prompt_length - 1}, K]; got {tensor.dtype} {shape}"
        )
    ids = np.asarray(tensor.data, dtype=np.int64)
    if len(ids) and (ids.min() < -1 or ids.max() >= vocab):
        raise ValueError(f"{where}: token ids must lie in [0, {vocab}), or be -1 for none")
    return tensor


def _target_logprobs(log_probs: torch.Tensor, targets: types.TensorData) -> types.TensorData:
    """Each named id's logprob at its row, 0.0 where -1 asked nothing; the same layout."""
    shape = list(targets.shape or [])
    ids = np.asarray(targets.data, dtype=np.int64)
    if targets.sparse_crow_indices is not None and targets.sparse_col_indices is not None:
        crow = np.asarray(targets.sparse_crow_indices, dtype=np.int64)
        rows = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
    else:
        rows = np.repeat(np.arange(shape[0]), shape[1])
    picked = np.zeros(len(ids), dtype=np.float32)
    asked = ids >= 0
    if asked.any():
        index = torch.as_tensor(rows[asked], device=log_probs.device)
        token = torch.as_tensor(ids[asked], device=log_probs.device)
        picked[asked] = log_probs[index, token].float().cpu().numpy()
    return types.TensorData(
        data=picked.reshape(shape) if targets.sparse_crow_indices is None else picked,
        dtype="float32",
        shape=shape,
        sparse_crow_indices=targets.sparse_crow_indices,
        sparse_col_indices=targets.sparse_col_indices,
    )


def _alt_tokens(log_probs: torch.Tensor, asked: PromptScoring) -> types.PromptAltTokens:
    """k independent draws at every position, at the request's temperature (greedy at 0),
    with the model's own logprob of each."""
    if asked.temperature <= 0:
        ids = log_probs.argmax(dim=-1, keepdim=True).expand(-1, asked.alt_k)
    else:
        generator = torch.Generator(device=log_probs.device).manual_seed(asked.seed)
        probs = torch.softmax(log_probs.float() / asked.temperature, dim=-1)
        ids = torch.multinomial(probs, asked.alt_k, replacement=True, generator=generator)
    values = log_probs.gather(-1, ids)
    tokens = ids.cpu().numpy().astype(np.int64)
    return types.PromptAltTokens(
        tokens=types.TensorData(data=tokens, dtype="int64", shape=list(tokens.shape)),
        logprobs=types.TensorData(
            data=values.float().cpu().numpy(), dtype="float32", shape=list(tokens.shape)
        ),
    )
