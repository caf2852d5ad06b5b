"""The gpu lane: the local engine on CUDA; skipped, saying so, without a CUDA GPU."""
