"""The OpenAI face (`/v1`): models and chat completions over base models and runs' checkpoints,
answered in OpenAI's shapes (errors included), sampled by the inference worker."""
