"""Datums for the sequence losses (gspo, stable_reinforce) built as tinker-cookbook 0.6.1
builds them, with the provenance of what was sampled."""

from __future__ import annotations

from tinker import types


def rl_datum(
    prompt: list[int], seq: types.SampledSequence, advantage: float, logprobs=None
) -> types.Datum:
    """As tinker_cookbook/recipes/rl_loop.py builds it: prompt + sampled[:-1] in, targets 0 on
    prompt positions then the sampled tokens, and `with_sampled_provenance`'s spans."""
    ob_len = len(prompt) - 1
    n = len(seq.tokens)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(prompt + seq.tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": [0] * ob_len + seq.tokens,
            "logprobs": [0.0] * ob_len + list(seq.logprobs if logprobs is None else logprobs),
            "advantages": [0.0] * ob_len + [advantage] * n,
        },
    )
    sid = seq.sequence_id
    return datum.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sid, length=len(prompt)),
            types.SampledProvenanceSpan(sequence_id=sid, length=n - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=len(prompt) - 1),
            types.SampledProvenanceSpan(sequence_id=sid, length=n),
        ],
    )
