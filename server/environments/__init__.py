"""Environments: discovery by reading source, the catalog, inspectors (environment code runs in
subprocesses), stored and versioned configs, and the model check."""
