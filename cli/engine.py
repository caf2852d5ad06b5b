"""`rlctl engine`: the engine host as it is now (GET /engine): its pid, the base models it holds,
the adapters in its samplers' slots, its clients and its decode queue."""

from __future__ import annotations

import argparse
import time

from cli.client import Client
from cli.exits import OK
from cli.output import print_json, say, table


def show(client: Client, args: argparse.Namespace) -> int:
    engine = client.get("/engine")
    if args.json:
        print_json(engine)
        return OK
    if not engine.get("running"):
        say(f"no engine host running (it starts on first need); its log: {engine.get('log')}")
        return OK
    up = time.time() - float(engine.get("started_at") or time.time())
    say(
        f"engine host pid {engine['pid']}, up {up / 60:.0f} min; "
        f"{engine.get('adapters_resident', 0)} adapter(s) in its slots, "
        f"{engine.get('decode_queue', 0)} sample request(s) waiting; log: {engine.get('log')}"
    )
    budget = engine.get("memory_budget_bytes")
    bases = [[b["name"], f"{b['bytes'] / 2**20:.0f} MiB", b["users"]] for b in engine["bases"]]
    held = f" (budget {budget / 2**30:.1f} GiB)" if budget else ""
    say(f"\nBASE MODELS{held}")
    say(table(["NAME", "SIZE", "USERS"], bases) if bases else "  none loaded")
    clients = [
        [c["client"], c["role"], c["pid"], c["models"], c["samplers"], c["jobs"]]
        for c in engine["clients"]
    ]
    say("\nCLIENTS")
    say(table(["CLIENT", "ROLE", "PID", "MODELS", "SAMPLERS", "JOBS"], clients))
    return OK
