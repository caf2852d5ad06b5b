"""A script written for the tinker SDK, run by test_sdk_versions.py under each SDK the server
serves (the project's 0.38 and the oldest protobuf-era one): the call sequence the Tinker API
tests use, through whichever surface the SDK has (0.25 hands out clients where 0.38 hands out
futures of them). Prints one JSON line of what it saw. TINKER_BASE_URL and TINKER_API_KEY name
the server; token ids only (tiny-random's tokenizer is the server's)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import tinker
from tinker import types

warnings.simplefilter("ignore")  # 0.38 deprecates what 0.25 only has
WAIT_S = 120


def ready(value: Any) -> Any:
    """A client, from a client (0.25) or a future of one (0.38)."""
    result = getattr(type(value), "result", None)
    return value.result(WAIT_S) if callable(result) else value


def datum(tokens: list[int], advantage: float) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [-4.0] * (len(tokens) - 1),
            "advantages": [advantage] * (len(tokens) - 1),
        },
    )


def main() -> None:
    service = tinker.ServiceClient()
    training = ready(service.create_lora_training_client("tiny-random", rank=4, seed=3))
    supervised = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
        loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0] * 4},
    )
    losses = []
    for _ in range(2):
        fb = training.forward_backward([supervised], "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=5e-3))
        losses.append(fb.result(WAIT_S).metrics["loss:sum"])
        step.result(WAIT_S)
    rl = training.forward_backward([datum([5, 6, 7, 8], 1.0)], "importance_sampling")
    rl_loss = rl.result(WAIT_S).metrics["loss:sum"]
    training.optim_step(types.AdamParams(learning_rate=5e-3)).result(WAIT_S)

    state = training.save_state("after").result(WAIT_S).path
    sampler_path = training.save_weights_for_sampler("after").result(WAIT_S).path
    snapshot = ready(training.save_weights_and_get_sampling_client())
    params = types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])
    prompt = types.ModelInput.from_ints([5, 6, 7])
    drawn = snapshot.sample(prompt, 2, params).result(WAIT_S)
    logprobs = snapshot.compute_logprobs(prompt).result(WAIT_S)
    saved = ready(service.create_sampling_client(model_path=sampler_path))
    again = saved.sample(prompt, 1, params).result(WAIT_S)
    resumed = ready(service.create_training_client_from_state_with_optimizer(state))
    resumed_loss = resumed.forward([supervised], "cross_entropy").result(WAIT_S)
    checkpoints = service.create_rest_client().list_checkpoints(training.model_id).result(WAIT_S)
    service_version = getattr(tinker, "__version__", "?")
    print(
        json.dumps(
            {
                "sdk": service_version,
                "losses": losses,
                "rl_loss": rl_loss,
                "samples": [list(s.tokens) for s in drawn.sequences],
                "sample_again": list(again.sequences[0].tokens),
                "logprobs": logprobs,
                "resumed_loss": resumed_loss.metrics["loss:sum"],
                "checkpoints": sorted(c.tinker_path for c in checkpoints.checkpoints),
                "paths": [state, sampler_path],
            }
        )
    )
    closing = getattr(service, "close", None)
    if callable(closing):
        ready(closing("success"))


if __name__ == "__main__":
    main()
