"""Datums to target logprobs and a loss: validation, padded micro-batches, forward (+ backward).

Position i of a datum's model_input predicts target_tokens[i]; sequences are right-padded,
grouped by length under a token budget, and gradients accumulate across micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tinker import types
from torch import nn

from runners.backends.losses import check_input_keys, compute_loss


@dataclass
class DatumBatch:
    """Validated datums: token ids, targets and the other loss inputs, one entry per datum."""

    tokens: list[list[int]]
    targets: list[torch.Tensor]
    inputs: list[dict[str, torch.Tensor]]


def validate_data(
    data: list[types.Datum], loss_fn: str, vocab: int, max_positions: int | None
) -> DatumBatch:
    """Check every datum against the loss (keys, lengths, token ranges) before any work."""
    if not data:
        raise ValueError("data is empty: give at least one Datum")
    batch = DatumBatch([], [], [])
    for i, datum in enumerate(data):
        where = f"data[{i}]"
        tokens = datum.model_input.to_ints()
        if not tokens:
            raise ValueError(f"{where}.model_input is empty")
        if min(tokens) < 0 or max(tokens) >= vocab:
            raise ValueError(f"{where}.model_input has token ids outside [0, {vocab})")
        if max_positions is not None and len(tokens) > max_positions:
            raise ValueError(
                f"{where} has {len(tokens)} tokens; this model's context is {max_positions}"
            )
        check_input_keys(loss_fn, datum.loss_fn_inputs, where=f"{where}.loss_fn_inputs")
        inputs: dict[str, torch.Tensor] = {}
        for key, value in datum.loss_fn_inputs.items():
            tensor = value.to_torch()
            if tensor.dim() != 1 or tensor.numel() != len(tokens):
                raise ValueError(
                    f"{where}.loss_fn_inputs[{key!r}] has shape {tuple(tensor.shape)}; "
                    f"expected ({len(tokens)},), one entry per model_input token"
                )
            inputs[key] = tensor
        targets = inputs.pop("target_tokens")
        if targets.is_floating_point():
            raise ValueError(f"{where}.loss_fn_inputs['target_tokens'] must be int64")
        if int(targets.min()) < 0 or int(targets.max()) >= vocab:
            raise ValueError(f"{where} has target_tokens outside [0, {vocab})")
        batch.tokens.append(tokens)
        batch.targets.append(targets.long())
        batch.inputs.append({k: v.float() for k, v in inputs.items()})
    return batch


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


def run_loss(
    model: nn.Module,
    batch: DatumBatch,
    loss_fn: str,
    config: dict[str, float],
    *,
    backward: bool,
    pad_id: int,
    token_budget: int,
) -> types.ForwardBackwardOutput:
    """Target logprobs and the summed loss; with `backward`, gradients are added to .grad."""
    device = next(model.parameters()).device
    outputs: list[dict[str, types.TensorData]] = [{} for _ in batch.tokens]
    total = 0.0
    for group in microbatches([len(t) for t in batch.tokens], token_budget):
        width = max(len(batch.tokens[i]) for i in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        targets = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):
            n = len(batch.tokens[i])
            ids[row, :n] = torch.tensor(batch.tokens[i])
            targets[row, :n] = batch.targets[i]
        with torch.set_grad_enabled(backward):
            # Right padding needs no mask: causal attention keeps pads out of real positions.
            logits = model(input_ids=ids.to(device), use_cache=False).logits
            vocab = logits.shape[-1]
            token_lp = -F.cross_entropy(
                logits.float().reshape(-1, vocab),
                targets.to(device).reshape(-1),
                reduction="none",
            ).view(len(group), width)
            pieces = [token_lp[row, : len(batch.tokens[i])] for row, i in enumerate(group)]
            inputs = {
                key: torch.cat([batch.inputs[i][key] for i in group]).to(device)
                for key in batch.inputs[group[0]]
            }
            loss = compute_loss(loss_fn, torch.cat(pieces), inputs, config)
        if backward:
            loss.backward()
        total += float(loss.detach())
        for piece, i in zip(pieces, group, strict=True):
            lp = piece.detach().float().cpu().numpy()
            outputs[i] = {"logprobs": types.TensorData.from_numpy(lp)}
    return types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={"loss:sum": total}
    )
