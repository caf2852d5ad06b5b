"""The server's side of verifiers environments (docs/verifiers.md): finding their folders
(discovery.py), installing their own dependencies (deps.py), describing their config (config.py).
"""
