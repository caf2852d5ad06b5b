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

from runners.engine.recorded_sequences import RecordedSequence, SequenceStore, UnknownSequence
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
    _check_advantages(where, advantages, sampled)
    return {
        RECORDED_LOGPROBS: torch.from_numpy(logprobs),
        RECORDED_MASK: torch.from_numpy(sampled.astype(np.float32)),
    }


def _check_advantages(where: str, advantages: torch.Tensor, sampled: np.ndarray) -> None:
    """ValueError at the first nonzero advantage on a target that is no sampled token."""
    stray = np.flatnonzero((advantages.numpy() != 0) & ~sampled)
    if len(stray):
        i = int(stray[0])
        raise ValueError(
            f"{where}.loss_fn_inputs['advantages'][{i}] is {float(advantages[i]):g} on a target "
            "that is no sampled token (its span names a prompt): stable_reinforce trains "
            "sampled tokens only, so give prompt positions advantage 0"
        )


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
        label = f"{where}[{j}]"
        recorded, actual = _recorded_run(label, span, sequences)
        run = slice(position, position + span.length)
        is_sampled = isinstance(span, types.SampledProvenanceSpan)
        if is_sampled or prompt_tokens_checked:
            _check_run(label, span, tokens[run], actual, position)
        if is_sampled:
            logprobs[run] = recorded.logprobs[span.offset : span.offset + span.length]
            sampled[run] = True
        position += span.length
    return logprobs, sampled


def _part(span: Span) -> str:
    """What of its sequence a span names, for messages."""
    return "sampled tokens" if isinstance(span, types.SampledProvenanceSpan) else "prompt"


def _recorded_run(
    label: str, span: Span, sequences: SequenceStore
) -> tuple[RecordedSequence, np.ndarray]:
    """The recorded sequence `span` names and the run of its tokens (sampled or prompt) the
    span claims; `label`: the span's place, for errors."""
    try:
        recorded = sequences.get(span.sequence_id)
    except UnknownSequence as exc:
        raise UnknownSequence(f"{label}: {exc}") from None
    is_sampled = isinstance(span, types.SampledProvenanceSpan)
    source = recorded.tokens if is_sampled else recorded.prompt
    end = span.offset + span.length
    if end > len(source):
        raise ValueError(
            f"{label}: positions [{span.offset}, {end}) of sequence "
            f"{span.sequence_id!r}'s {_part(span)}, which has {len(source)}"
        )
    return recorded, source[span.offset : end]


def _check_run(
    label: str, span: Span, claimed: np.ndarray, actual: np.ndarray, position: int
) -> None:
    """ValueError at the first of the datum's tokens (`claimed`, from `position`) that is not
    the recorded one (`actual`)."""
    differ = np.flatnonzero(claimed != actual)
    if len(differ):
        k = int(differ[0])
        raise ValueError(
            f"{label}: the datum's token {int(claimed[k])} at position {position + k} "
            f"is not what sequence {span.sequence_id!r} recorded at {_part(span)} position "
            f"{span.offset + k} ({int(actual[k])}); a span names the tokens as sampled"
        )
