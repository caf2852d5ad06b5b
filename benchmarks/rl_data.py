"""The training data of the benchmarks' RL steps: what was sampled, to train on with the
importance-sampling loss."""

from __future__ import annotations

from typing import Any

from tinker import types


def importance_data(prompts: list[list[int]], responses: list[Any]) -> list[types.Datum]:
    """A datum per sample (`responses[i]` sampled from `prompts[i]`): the sampler's logprobs,
    advantages +1 and -1 in turn (a group's mean is about zero, as after a baseline)."""
    data = []
    for prompt, response in zip(prompts, responses, strict=True):
        for i, sequence in enumerate(response.sequences):
            full, pad = prompt + list(sequence.tokens), [0.0] * (len(prompt) - 1)
            # Plain lists: the Datum turns them into its TensorData (its type says TensorData).
            inputs: dict[str, Any] = {
                "target_tokens": full[1:],
                "logprobs": pad + list(sequence.logprobs),
                "advantages": pad + [1.0 if i % 2 else -1.0] * len(sequence.tokens),
            }
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs
                )
            )
    return data
