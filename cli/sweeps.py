"""`sweeps ...`: start a grid of runs, list sweeps, show one's results side by side, wait
for it, stop it."""

from __future__ import annotations

import argparse
from typing import Any

from cli.client import Client, seg
from cli.exits import OK, WAIT_TIMED_OUT, UsageError
from cli.output import fmt, print_json, say, table
from cli.runs import server_wait
from cli.values import parse_value


def grid_axis(text: str) -> tuple[str, list[Any]]:
    """argparse type for `--grid key=v1,v2,...` (each value parsed as in `config set`), or
    `--grid 'key=[...]'` with a JSON list."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key or not values:
        raise argparse.ArgumentTypeError(f"expected key=v1,v2,..., got {text!r}")
    parsed = parse_value(values)
    if isinstance(parsed, list):
        return key, parsed
    return key, [parse_value(v.strip()) for v in values.split(",")]


def start(client: Client, args: argparse.Namespace) -> int:
    if not args.grid:
        raise UsageError("give at least one --grid key=v1,v2,...")
    body: dict[str, Any] = {
        "base": dict(args.set or []),
        "grid": dict(args.grid),
        "metric": args.metric,
        "goal": args.goal,
    }
    if args.env:
        body["environment"] = args.env
    if args.max_runs is not None:
        body["max_runs"] = args.max_runs
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    answer = client.post("/sweeps", body, headers=headers)
    if args.json:
        print_json(answer)
        return OK
    say(f"{answer['sweep_id']}  {len(answer['run_ids'])} runs queued")
    say(f"  wait for it: rlctl sweeps wait {answer['sweep_id']}")
    return OK


def list_(client: Client, args: argparse.Namespace) -> int:
    sweeps = client.get("/sweeps", {"limit": args.limit})
    if args.json:
        print_json(sweeps)
        return OK
    if not sweeps:
        say("no sweeps")
        return OK
    rows = [
        [
            s["sweep_id"],
            s["environment"],
            s["status"],
            f"{s['runs_finished']}/{s['runs_total']}",
            f"{s['goal']} {s['metric']}",
            s["created_at"],
        ]
        for s in sweeps
    ]
    say(table(["SWEEP", "ENVIRONMENT", "STATUS", "FINISHED", "BEST BY", "CREATED"], rows))
    return OK


def show(client: Client, args: argparse.Namespace) -> int:
    sweep = client.get(f"/sweeps/{seg(args.sweep)}")
    if args.json:
        print_json(sweep)
    else:
        _print(sweep)
    return OK


def wait(client: Client, args: argparse.Namespace) -> int:
    """Block until every run of the sweep has finished, in server-side waits."""
    sweep = server_wait(client, f"/sweeps/{seg(args.sweep)}/wait", {}, args.wait_s)
    if args.json:
        print_json(sweep)
    else:
        _print(sweep)
    return OK if sweep["condition_met"] else WAIT_TIMED_OUT


def stop(client: Client, args: argparse.Namespace) -> int:
    answer = client.post(f"/sweeps/{seg(args.sweep)}/stop")
    if args.json:
        print_json(answer)
        return OK
    say(f"{answer['sweep_id']}: asked {len(answer['runs'])} unfinished runs to stop")
    return OK


def _print(sweep: dict[str, Any]) -> None:
    say(
        f"{sweep['sweep_id']}  {sweep['environment']}  {sweep['status']}  "
        f"{sweep['runs_finished']}/{sweep['runs_total']} finished"
    )
    rows = [
        [
            r["run_id"],
            " ".join(f"{k}={fmt(v)}" for k, v in r["overrides"].items()) or "-",
            r["status"],
            f"{r['step']}/{r['total_steps']}",
            fmt(r["value"]),
        ]
        for r in sweep["runs"]
    ]
    say(table(["RUN", "OVERRIDES", "STATUS", "STEP", sweep["metric"].upper()], rows))
    best = sweep.get("best")
    if best:
        so_far = "" if best["final"] else " so far"
        by = f"{sweep['goal']} {sweep['metric']}"
        say(f"best{so_far} ({by}): {best['run_id']} = {fmt(best['value'])}")
        say(f"  fork it: rlctl runs fork {best['run_id']} --set total_steps=...")
