"""Test inference and chat completions on a model: the jobs the engine host answers for the
server's /test/inference and /v1 (runners/engine_host/inference.py runs them)."""
