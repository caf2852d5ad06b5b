"""Launching and watching runs: the supervisor (and its leadership among servers), the launchers
that start runner processes (local subprocesses or Ray jobs), and how an exit is settled."""
