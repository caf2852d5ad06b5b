"""`rlctl`: a command-line client for the RL control server's HTTP API.

A thin client: every command is one or a few HTTP calls; the server does the work.
"""
