"""Test inference scored by an environment: `python -m runners.infer`, the inference client the
server starts, where environment code runs (never in an engine host)."""
