"""Datums to target logprobs and a loss: validation, padded micro-batches, forward (+ backward).

Position i of a datum's model_input predicts target_tokens[i]; sequences are right-padded,
grouped by length under a token budget, and gradients accumulate across micro-batches.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from tinker import types
from torch import nn
from torch.utils.checkpoint import checkpoint

from runners.engine.lora import LanguageModel
from runners.engine.padding import right_pad
from runners.engine.recorded_sequences import SequenceStore
from runners.engine.train.losses import check_input_keys, compute_loss, get_loss_spec, loss_metrics
from runners.engine.train.provenance import recorded_inputs


@dataclass
class DatumBatch:
    """Validated datums: token ids, targets and the other loss inputs, one entry per datum."""

    tokens: list[list[int]]
    targets: list[torch.Tensor]
    inputs: list[dict[str, torch.Tensor]]


def validate_data(
    data: list[types.Datum],
    loss_fn: str,
    vocab: int,
    max_positions: int | None,
    sequences: SequenceStore | None = None,
) -> DatumBatch:
    """Check every datum against the loss (keys, lengths, token ranges; for a loss that reads
    recorded sequences, its spans against `sequences`) before any work."""
    if not data:
        raise ValueError("data is empty: give at least one Datum")
    spec = get_loss_spec(loss_fn)
    batch = DatumBatch([], [], [])
    for i, datum in enumerate(data):
        where = f"data[{i}]"
        tokens = _checked_tokens(datum, where, vocab, max_positions)
        check_input_keys(loss_fn, datum.loss_fn_inputs, where=f"{where}.loss_fn_inputs")
        inputs = _per_token_inputs(datum, where, len(tokens))
        targets = inputs.pop("target_tokens")
        if targets.is_floating_point():
            raise ValueError(f"{where}.loss_fn_inputs['target_tokens'] must be int64")
        if int(targets.min()) < 0 or int(targets.max()) >= vocab:
            raise ValueError(f"{where} has target_tokens outside [0, {vocab})")
        for key in spec.ignored:
            inputs.pop(key, None)
        for key, fill in spec.optional.items():
            if key not in inputs:
                inputs[key] = fill(inputs)
        if spec.reads_recorded:
            if sequences is None:
                raise ValueError(f"loss {loss_fn!r} needs recorded sequences; none are kept here")
            inputs.update(recorded_inputs(datum, where, sequences, targets, inputs["advantages"]))
        batch.tokens.append(tokens)
        batch.targets.append(targets.long())
        batch.inputs.append({k: v.float() for k, v in inputs.items()})
    return batch


def _checked_tokens(
    datum: types.Datum, where: str, vocab: int, max_positions: int | None
) -> list[int]:
    """The datum's token ids: not empty, in the vocabulary, within the model's context."""
    tokens = datum.model_input.to_ints()
    if not tokens:
        raise ValueError(f"{where}.model_input is empty")
    if min(tokens) < 0 or max(tokens) >= vocab:
        raise ValueError(f"{where}.model_input has token ids outside [0, {vocab})")
    if max_positions is not None and len(tokens) > max_positions:
        raise ValueError(
            f"{where} has {len(tokens)} tokens; this model's context is {max_positions}"
        )
    return tokens


def _per_token_inputs(datum: types.Datum, where: str, length: int) -> dict[str, torch.Tensor]:
    """The datum's loss inputs as tensors, each checked to hold one entry per token."""
    inputs: dict[str, torch.Tensor] = {}
    for key, value in datum.loss_fn_inputs.items():
        tensor = value.to_torch()
        if tensor.dim() != 1 or tensor.numel() != length:
            raise ValueError(
                f"{where}.loss_fn_inputs[{key!r}] has shape {tuple(tensor.shape)}; "
                f"expected ({length},), one entry per model_input token"
            )
        inputs[key] = tensor
    return inputs


def microbatches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Datum indices grouped longest first so each padded micro-batch fits the token budget."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


# Rows of hidden states turned into logits at a time: [chunk, vocab] float32 at most.
LOGIT_CHUNK_ROWS = 1024


def target_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module) -> torch.Tensor:
    """log p(target) for each row of `hidden` [N, H], by chunks of rows; with gradients on,
    each chunk's logits are recomputed in backward rather than kept (no [N, vocab] tensor)."""
    pieces = []
    for begin in range(0, len(hidden), LOGIT_CHUNK_ROWS):
        rows = slice(begin, begin + LOGIT_CHUNK_ROWS)
        if torch.is_grad_enabled():
            piece = checkpoint(
                _chunk_logprobs, hidden[rows], targets[rows], head, use_reentrant=False
            )
        else:
            piece = _chunk_logprobs(hidden[rows], targets[rows], head)
        pieces.append(piece)
    return torch.cat(pieces)


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module) -> torch.Tensor:
    logits = head(hidden).float()
    picked = logits.gather(-1, targets[:, None])[:, 0]
    return picked - torch.logsumexp(logits, dim=-1)


# Base dtypes that run under CUDA autocast in their own dtype: the float32 adapter (master
# weights) then runs its matmuls in that dtype too. A float16 base also scales its loss
# (loss_scale.py, training.py): fp16's range is narrow where bf16's is float32's.
_AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def autocast_dtype(device: torch.device, model: LanguageModel) -> torch.dtype | None:
    """The autocast dtype of `model`'s training passes: its base's half dtype on CUDA, else
    None (no autocast)."""
    base_dtype = model.get_output_embeddings().weight.dtype
    if device.type == "cuda" and base_dtype in _AUTOCAST_DTYPES:
        return base_dtype
    return None


def _autocast(half: torch.dtype | None) -> torch.autocast:
    """CUDA autocast in the base's half dtype (`autocast_dtype`); None: off."""
    return torch.autocast("cuda", dtype=half or torch.bfloat16, enabled=half is not None)


def _adapter_inputs_kept(model: LanguageModel, autocast: bool) -> contextlib.AbstractContextManager:
    """Under autocast, peft's cast of each LoRA layer's input to the adapter's float32 is
    turned off: autocast casts it straight back to the half dtype for the matmul, so those two
    copies of every activation change no number (the operands are the same half values)."""
    if not autocast:
        return contextlib.nullcontext()
    from peft.helpers import disable_input_dtype_casting

    return disable_input_dtype_casting(model)


def merged(key: str, before: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    """A metric over micro-batches, by its name's reduction (as the SDK merges chunks): the
    larger for a max, else the sum."""
    if before is None:
        return value
    return torch.maximum(before, value) if key.endswith(":max") else before + value


def run_loss(
    model: LanguageModel,
    batch: DatumBatch,
    loss_fn: str,
    config: dict[str, float],
    *,
    backward: bool,
    pad_id: int,
    token_budget: int,
    loss_scale: float = 1.0,
) -> types.ForwardBackwardOutput:
    """Target logprobs and the summed loss; with `backward`, gradients are added to .grad,
    times `loss_scale` (a float16 trainer's; the loss and metrics reported are unscaled)."""
    device = next(model.parameters()).device
    lengths = [len(t) for t in batch.tokens]
    logprobs: list[torch.Tensor | None] = [None] * len(lengths)
    total = torch.zeros((), device=device)
    sums: dict[str, torch.Tensor] = {}  # the loss's own metrics, summed over micro-batches
    half = autocast_dtype(device, model)
    with _adapter_inputs_kept(model, half is not None):
        for group in microbatches(lengths, token_budget):
            sizes = [lengths[i] for i in group]
            with torch.set_grad_enabled(backward), _autocast(half):
                token_lp, inputs = _group_logprobs(model, batch, group, pad_id, device)
                loss = compute_loss(loss_fn, token_lp, inputs, config, sizes)
            if backward:
                # The scale goes on the loss, before any half-precision gradient exists.
                (loss * loss_scale if loss_scale != 1.0 else loss).backward()
            total += loss.detach()
            for key, value in loss_metrics(loss_fn, token_lp, inputs, config).items():
                sums[key] = merged(key, sums.get(key), value)
            for i, piece in zip(group, token_lp.detach().split(sizes), strict=True):
                logprobs[i] = piece
    return types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord",
        loss_fn_outputs=_per_datum_logprobs(logprobs, lengths),
        metrics={"loss:sum": float(total), **{key: float(v) for key, v in sums.items()}},
    )


def _group_logprobs(
    model: LanguageModel, batch: DatumBatch, group: list[int], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A micro-batch's target logprobs (datum `group[0]`'s positions, then the next datum's)
    and its loss inputs, on `device`."""
    ids, real = right_pad([batch.tokens[i] for i in group], pad_id)
    targets = torch.cat([batch.targets[i] for i in group]).to(device)
    # Right padding needs no mask: causal attention keeps pads out of real positions.
    hidden = model.get_decoder()(input_ids=ids.to(device), use_cache=False).last_hidden_state
    # Row-major selection keeps datum order: datum group[0]'s positions, then the next.
    head = model.get_output_embeddings()
    token_lp = target_logprobs(hidden[real.to(device).bool()], targets, head)
    inputs = {
        key: torch.cat([batch.inputs[i][key] for i in group]).to(device)
        for key in batch.inputs[group[0]]
    }
    return token_lp, inputs


def _per_datum_logprobs(
    logprobs: list[torch.Tensor | None], lengths: list[int]
) -> list[dict[str, types.TensorData]]:
    """Each datum's target logprobs as a loss output: one transfer to the host for the whole
    call, then split per datum."""
    flat = torch.cat([lp for lp in logprobs if lp is not None]).float().cpu().numpy()
    outputs: list[dict[str, types.TensorData]] = []
    offset = 0
    for n in lengths:
        outputs.append({"logprobs": types.TensorData.from_numpy(flat[offset : offset + n])})
        offset += n
    return outputs
