"""A datum's provenance spans read against the recorded sequences (`stable_reinforce`).

Each span claims that a run of the datum's tokens is a run of a recorded sequence's prompt or
sampled tokens (`Datum.with_provenance`). The claims are checked token by token, and the
sampler's logprobs are read for the targets that are sampled tokens. Targets attributed to a
prompt are checked for their place only: they train nothing (advantage 0), and clients put
placeholders there (the cookbook's rl_loop sends target 0 on prompt positions).
"""

from __future__ import annotations

import numpy as np
import torch
from tinker import types

from runners.engine.recorded_sequences import SequenceStore, UnknownSequence
from runners.engine.train.losses import RECORDED_LOGPROBS, RECORDED_MASK

Span = types.PromptProvenanceSpan | types.SampledProvenanceSpan


def recorded_inputs(
    datum: types.Datum,
    where: str,
    sequences: SequenceStore,
    targets: torch.Tensor,
    advantages: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The sampler's logprob of each target and a mask of the targets that are sampled tokens,
    once both span lists match the recorded tokens; ValueError naming the first mismatch."""
    if datum.model_input_spans is None or datum.loss_fn_input_spans is None:
        raise ValueError(
            f"{where}: loss 'stable_reinforce' needs provenance on every datum: build it with "
            "Datum.with_provenance(...), naming the SampledSequence.sequence_id of samples from "
            "a sampling client made with record_stability_info=True"
        )
    _read_spans(
        f"{where}.model_input_spans",
        datum.model_input_spans,
        np.asarray(datum.model_input.to_ints()),
        sequences,
        prompt_tokens_checked=True,
    )
    logprobs, sampled = _read_spans(
        f"{where}.loss_fn_input_spans",
        datum.loss_fn_input_spans,
        targets.numpy(),
        sequences,
        prompt_tokens_checked=False,
    )
    stray = np.flatnonzero((advantages.numpy() != 0) & ~sampled)
    if len(stray):
        i = int(stray[0])
        raise ValueError(
            f"{where}.loss_fn_inputs['advantages'][{i}] is {float(advantages[i]):g} on a target "
            "that is no sampled token (its span names a prompt): stable_reinforce trains "
            "sampled tokens only, so give prompt positions advantage 0"
        )
    return {
        RECORDED_LOGPROBS: torch.from_numpy(logprobs),
        RECORDED_MASK: torch.from_numpy(sampled.astype(np.float32)),
    }


def _read_spans(
    where: str,
    spans: list[Span],
    tokens: np.ndarray,
    sequences: SequenceStore,
    *,
    prompt_tokens_checked: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Walk the runs over `tokens`: each must name recorded positions, and hold the recorded
    tokens (prompt runs: when `prompt_tokens_checked`). Returns the sampler logprob at each
    position (0 off sampled runs) and where the sampled runs are."""
    covered = sum(span.length for span in spans)
    if covered != len(tokens):
        raise ValueError(
            f"{where}: the runs cover {covered} positions, the field has {len(tokens)}; "
            "they must tile it exactly"
        )
    logprobs = np.zeros(len(tokens), dtype=np.float32)
    sampled = np.zeros(len(tokens), dtype=bool)
    position = 0
    for j, span in enumerate(spans):
        try:
            recorded = sequences.get(span.sequence_id)
        except UnknownSequence as exc:
            raise UnknownSequence(f"{where}[{j}]: {exc}") from None
        is_sampled = isinstance(span, types.SampledProvenanceSpan)
        source, part = (
            (recorded.tokens, "sampled tokens") if is_sampled else (recorded.prompt, "prompt")
        )
        end = span.offset + span.length
        if end > len(source):
            raise ValueError(
                f"{where}[{j}]: positions [{span.offset}, {end}) of sequence "
                f"{span.sequence_id!r}'s {part}, which has {len(source)}"
            )
        claimed, actual = tokens[position : position + span.length], source[span.offset : end]
        differ = np.flatnonzero(claimed != actual)
        if len(differ) and (is_sampled or prompt_tokens_checked):
            k = int(differ[0])
            raise ValueError(
                f"{where}[{j}]: the datum's token {int(claimed[k])} at position {position + k} "
                f"is not what sequence {span.sequence_id!r} recorded at {part} position "
                f"{span.offset + k} ({int(actual[k])}); a span names the tokens as sampled"
            )
        if is_sampled:
            logprobs[position : position + span.length] = recorded.logprobs[span.offset : end]
            sampled[position : position + span.length] = True
        position += span.length
    return logprobs, sampled
