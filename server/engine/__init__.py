"""The engine host as the server sees it: one connection for the Tinker API, /v1 and test
inference (link.py), and GET /engine (the host's pid, bases, adapters, clients and queues)."""
