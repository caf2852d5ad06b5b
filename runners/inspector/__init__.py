"""`python -m runners.inspector`: import one environment file in a process of its own and
answer questions about its config class over a line protocol."""
