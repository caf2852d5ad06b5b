"""A script for the kill test: it queues 24 forward_backward calls, says so once the first is
done (the others were sent before it finished: the server holds them), and waits on the rest
until it is killed (SIGKILL: no close, no finish, no more heartbeats). Enough are queued that
a loaded machine cannot answer them all between the line and the kill (with four, it did)."""

import sys

import tinker
from tinker import types

service = tinker.ServiceClient()
training = service.create_lora_training_client("tiny-random", rank=8, seed=1).result(120)
tokens = list(range(1, 200))
data = [
    types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": [1.0] * len(tokens)},
    )
    for _ in range(64)
]
futures = [training.forward_backward(data, "cross_entropy") for _ in range(24)]
futures[0].result(600)
print(f"training {training.model_id}", flush=True)
for future in futures[1:]:
    future.result(600)
print("finished, which the test did not want", flush=True)
sys.exit(3)
