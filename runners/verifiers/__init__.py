"""A verifiers environment as a run or a test inference plays it (docs/verifiers.md)."""
