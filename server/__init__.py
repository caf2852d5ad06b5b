"""The RL control server: HTTP API, database, supervisor."""

__version__ = "0.1.0"
