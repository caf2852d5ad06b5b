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


def text_data(tokenizer: Any, texts: list[str], end: tuple[int, ...] = ()) -> list[types.Datum]:
    """A datum per text (its tokens, then `end`'s), all trained, logprobs 0, advantages -0.5 and
    +1 in turn; longest first, as a training pass orders its micro-batches (split in two
    contiguous halves, they are the micro-batches one client cuts with a budget of half)."""
    data = []
    for index, text in enumerate(texts):
        tokens = [*tokenizer.encode(text), *end]
        n = len(tokens) - 1
        inputs: dict[str, Any] = {
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * n,
            "advantages": [1.0 if index % 2 else -0.5] * n,
        }
        data.append(
            types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
        )
    return sorted(data, key=lambda d: -d.model_input.length)
