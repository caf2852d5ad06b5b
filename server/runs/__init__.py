"""Runs as the API sees them: create (frozen config), list, read, stop, resume, fork, wait, logs,
metrics (W&B or the database) and export."""
