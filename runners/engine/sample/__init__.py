"""The sampling wing of the local engine: requests batched into decode steps on a packed copy
of the base model, many adapters per step."""
