"""Scripts that run in the verifiers interpreter (stdlib and verifiers only)."""
