"""Scripts that run in the Atropos interpreter, by path (stdlib, pydantic and atroposlib only)."""
