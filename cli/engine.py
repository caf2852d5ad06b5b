"""`rlctl engine`: this machine's engine hosts as they are now (GET /engine), each with its device,
pid and uptime, memory against its budget, base models, training lanes, slots, queue and clients."""

from __future__ import annotations

import argparse
import time
from typing import Any

from cli.client import Client
from cli.exits import OK
from cli.output import duration, pairs, print_json, say, table

INDENT = "  "


def show(client: Client, args: argparse.Namespace) -> int:
    engine = client.get("/engine")
    if args.json:
        print_json(engine)
        return OK
    hosts = engine.get("hosts", [])
    running = sum(1 for host in hosts if host.get("running"))
    say(f"engine hosts of {engine.get('node')}: {len(hosts)}, {running} running")
    now = time.time()
    for host in hosts:
        say()
        say("\n".join(host_lines(host, now)))
    return OK


def host_lines(host: dict[str, Any], now: float) -> list[str]:
    """One host: its heading, then (when it runs) its facts and tables, indented."""
    title = f"HOST {host['name']}  {host['device']}"
    if not host.get("running"):
        # A host starts when a run, a Tinker session or an inference first needs it.
        return [f"{title}  not running (it starts on first need)", f"{INDENT}log  {host['log']}"]
    up = now - float(host.get("started_at") or now)
    facts = [
        ("pid", f"{host['pid']}, up {duration(up)}"),
        ("memory", memory(host)),
        ("slots", f"{host.get('adapters_resident', 0)} adapter(s) in its samplers' slots"),
        ("queue", f"{host.get('decode_queue', 0)} sample request(s) waiting"),
        ("log", host["log"]),
    ]
    lines = [f"{title}  running", pairs(facts, INDENT)]
    for heading, block in (
        ("BASE MODELS", bases_table(host)),
        ("TRAINING LANES", lanes_table(host)),
        ("CLIENTS", clients_table(host, now)),
    ):
        lines += ["", f"{INDENT}{heading}", indent(block)]
    return lines


def memory(host: dict[str, Any]) -> str:
    """The host's resident memory, its GPU's total and free memory (on a GPU), its budget."""
    parts = [f"{size(host.get('rss_bytes'))} resident"]
    if host.get("device_bytes") is not None:
        total, free = size(host["device_bytes"]), size(host.get("device_free_bytes"))
        parts.append(f"GPU {total}, {free} free")
    parts.append(f"budget {size(host.get('memory_budget_bytes'))}")
    return "; ".join(parts)


def bases_table(host: dict[str, Any]) -> str:
    rows = [
        [b["name"], size(b["bytes"]), b["users"], "loaded" if b.get("loaded", True) else "loading"]
        for b in host.get("bases", [])
    ]
    return table(["NAME", "SIZE", "USERS", "STATE"], rows) if rows else "none loaded"


def lanes_table(host: dict[str, Any]) -> str:
    rows = [
        [lane["base"], lane["lane"], lane["training"], lane["waiting"]]
        for lane in host.get("lanes", [])
    ]
    return table(["BASE", "LANE", "TRAINING", "WAITING"], rows) if rows else "none"


def clients_table(host: dict[str, Any], now: float) -> str:
    rows = [
        [
            c["client"],
            c["role"],
            c["pid"],
            c["models"],
            c["samplers"],
            c["jobs"],
            ",".join(c.get("bases") or []) or None,
            duration(now - c["connected_at"]),
        ]
        for c in host.get("clients", [])
    ]
    heads = ["CLIENT", "ROLE", "PID", "MODELS", "SAMPLERS", "JOBS", "BASES", "CONNECTED"]
    return table(heads, rows) if rows else "none"


def size(n: float | None) -> str:
    """Bytes for people: KiB under a MiB (tiny-random's weights), MiB under a GiB, else GiB."""
    if n is None:
        return "-"
    if n < 2**20:
        return f"{n / 2**10:.0f} KiB"
    if n < 2**30:
        return f"{n / 2**20:.0f} MiB"
    return f"{n / 2**30:.1f} GiB"


def indent(block: str) -> str:
    return "\n".join(f"{INDENT}{line}" for line in block.splitlines())
