"""`runs ...`: start, list, inspect, wait on, stop, resume and fork runs; logs, metrics,
history, checkpoints.

`runs watch` and `runs logs --follow` live in cli/watch.py.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from cli import algorithms
from cli.client import Client, seg
from cli.exits import OK, RUN_FAILED, WAIT_TIMED_OUT, UsageError
from cli.output import duration, fmt, pairs, print_json, say, steps, table
from cli.watch import follow_logs

WAIT_CHUNK_S = 300.0  # one server-side wait (the server caps them at 600 s)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return dict(args.set or [])


def start(client: Client, args: argparse.Namespace) -> int:
    body = _overrides(args)
    if args.env:
        if body.get("environment", args.env) != args.env:
            raise UsageError("--env and --set environment=... disagree; give one")
        body["environment"] = args.env
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    answer = client.post("/runs", body, headers=headers)
    if args.json:
        print_json(answer)
        return OK
    say(f"{answer['run_id']}  {answer['status']}")
    say(f"  follow it: rlctl runs watch {answer['run_id']}")
    return OK


def list_(client: Client, args: argparse.Namespace) -> int:
    params = {
        "status": args.status,
        "environment": args.env,
        "source": args.source,
        "limit": args.limit,
    }
    runs = client.get("/runs", params)
    if args.json:
        print_json(runs)
        return OK
    if not runs:
        say("no runs")
        return OK
    rows = [_list_row(r) for r in runs]
    say(table(RUN_COLUMNS, rows))
    return OK


RUN_COLUMNS = [
    "RUN",
    "ENVIRONMENT",
    "STATUS",
    "STEP",
    "ATTEMPT",
    "SOURCE",
    "COST",
    "CREATED",
    "FINISHED",
]


def _list_row(run: dict[str, Any]) -> list[Any]:
    """A run's row in `runs list`, in RUN_COLUMNS' order."""
    return [
        run["run_id"],
        run["environment"],
        run["status"] + (f" ({run['failure_kind']})" if run.get("failure_kind") else ""),
        steps(run),
        run.get("attempt"),
        run.get("source", "api"),
        cost_cell(run.get("cost")),
        run.get("created_at"),
        run.get("finished_at"),
    ]


def status(client: Client, args: argparse.Namespace) -> int:
    run = client.get(f"/runs/{seg(args.run)}")
    if args.json:
        print_json(run)
        return OK
    say(pairs(_status_items(client, run)))
    # Details (a queue position, a crash's log tail) span lines: print them as they are.
    if run.get("details"):
        say("details:")
        say("  " + str(run["details"]).replace("\n", "\n  "))
    return OK


def _status_items(client: Client, run: dict[str, Any]) -> list[tuple[str, Any]]:
    """`runs status`'s label-value pairs: who the run is, where it stands, what it measured."""
    progress = run.get("progress") or {}
    fraction = progress.get("fraction") or 0.0
    per_step = progress.get("time_per_step_s")
    items: list[tuple[str, Any]] = [
        ("run", run["run_id"]),
        ("environment", run["environment"]),
        ("status", f"{run['status']} (attempt {run.get('attempt')})"),
        ("source", run.get("source", "api")),
        *([("name", run["display_name"])] if run.get("display_name") else []),
        ("step", f"{steps(run)} ({fraction:.0%})" if run.get("total_steps") else steps(run)),
        ("eta", f"{duration(progress.get('eta_s'))} ({fmt(per_step)} s/step)"),
    ]
    metrics = {k: v for k, v in (run.get("metrics") or {}).items() if k != "step"}
    items += [(k, v) for k, v in metrics.items()]
    items += cost_items(run.get("cost"))
    if run.get("step"):
        items += algorithms.items(algorithms.latest(client, run["run_id"]))
    items += [
        ("metrics from", run.get("metrics_source")),
        ("wandb", run.get("wandb_url")),
        ("weights", run.get("weights_path")),
        ("created", run.get("created_at")),
        ("started", run.get("started_at")),
        ("finished", run.get("finished_at")),
    ]
    if run.get("stalled"):
        items.append(("STALLED", run.get("stall_details")))
    if run.get("failure_kind"):
        items.append(("failure", run["failure_kind"]))
    if run.get("exit_code") is not None:
        items.append(("exit code", run["exit_code"]))
    return items


def cost_cell(cost: dict[str, Any] | None) -> str | None:
    """A list's COST: the money where a price applies, else the device time and tokens."""
    if not cost:
        return None
    if cost.get("money") is not None:
        return money(cost["money"], cost.get("currency"))
    if cost.get("device_s") is None and cost.get("tokens") is None:
        return None
    return f"{duration(cost.get('device_s'))}, {count(cost.get('tokens'))} tok"


def cost_items(cost: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """`runs status`'s lines on what the run spent, and what that cost."""
    if not cost:
        return []
    device_s, cpu_s = cost.get("device_s"), cost.get("cpu_s")
    held = f"{duration(device_s)} ({fmt(device_s)} s)" if device_s is not None else "-"
    if cost.get("device"):
        held += f" on {cost['device']}"
    if cpu_s is not None:
        held += f", {fmt(cpu_s)} CPU s"
    tokens = ", ".join(
        f"{count(cost.get(f'tokens_{kind}'))} {kind}" for kind in ("prefill", "sampled", "trained")
    )
    priced = cost.get("money") is not None
    spent = money(cost["money"], cost.get("currency")) if priced else cost.get("note")
    items: list[tuple[str, Any]] = [("device time", held), ("tokens", tokens), ("cost", spent)]
    if priced and cost.get("note"):
        items.append(("cost note", cost["note"]))
    if cost.get("basis"):
        items.append(("priced by", cost["basis"]))
    return items


def money(amount: float, currency: str | None) -> str:
    """Cents from a unit up, four significant digits below (a tiny run costs fractions)."""
    shown = f"{amount:.2f}" if amount >= 1 else f"{amount:.4g}"
    return f"{shown} {currency or ''}".rstrip()


def count(tokens: int | None) -> str:
    if tokens is None:
        return "-"
    for size, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if tokens >= size:
            return f"{tokens / size:.3g}{unit}"
    return str(tokens)


def wait(client: Client, args: argparse.Namespace) -> int:
    """Block until the run finishes (or reaches --until step:N), in server-side waits of at
    most WAIT_CHUNK_S each, so no proxy or client timeout cuts a long wait short."""
    run = server_wait(client, f"/runs/{seg(args.run)}/wait", {"until": args.until}, args.wait_s)
    if args.json:
        print_json(run)
    else:
        say(f"{run['run_id']}  {run['status']}  step {steps(run)}")
    if not run["condition_met"]:
        return WAIT_TIMED_OUT
    return RUN_FAILED if run["status"] == "failed" else OK


def server_wait(client: Client, path: str, params: dict[str, Any], wait_s: float) -> dict[str, Any]:
    """GET a wait route (`condition_met` in its answer) until the condition holds or `wait_s`
    has passed, in server-side waits of at most WAIT_CHUNK_S each."""
    deadline = time.monotonic() + wait_s
    while True:
        left = max(0.0, deadline - time.monotonic())
        chunk = min(left, WAIT_CHUNK_S)
        answer = client.request(
            "GET", path, params={**params, "timeout": chunk}, timeout=chunk + client.timeout
        )
        if answer["condition_met"] or left <= chunk:
            return answer


def stop(client: Client, args: argparse.Namespace) -> int:
    answer = client.post(f"/runs/{seg(args.run)}/stop")
    if args.json:
        print_json(answer)
    else:
        say(f"{answer['run_id']}  {answer['status']}")
    return OK


def resume(client: Client, args: argparse.Namespace) -> int:
    body = {**_overrides(args), **({"force": True} if args.force else {})}
    if args.step is not None:
        body["checkpoint_step"] = args.step
    answer = client.post(f"/runs/{seg(args.run)}/resume", body)
    if args.json:
        print_json(answer)
        return OK
    say(
        f"{answer['run_id']}  {answer['status']}  attempt {answer.get('attempt')} "
        f"from step {answer.get('resume_step')} ({answer.get('resume_from')})"
    )
    return OK


def fork(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = _overrides(args)
    if args.step is not None:
        body["checkpoint_step"] = args.step
    answer = client.post(f"/runs/{seg(args.run)}/fork", body)
    if args.json:
        print_json(answer)
        return OK
    say(
        f"{answer['run_id']}  {answer['status']}  (fork of {answer['parent_run_id']} at step "
        f"{answer['parent_step']})"
    )
    say(f"  follow it: rlctl runs watch {answer['run_id']}")
    return OK


def logs(client: Client, args: argparse.Namespace) -> int:
    if args.follow:
        return follow_logs(client, args)
    answer = client.get(f"/runs/{seg(args.run)}/logs", {"tail": args.tail})
    if args.json:
        print_json(answer)
        return OK
    for line in answer.get("lines", []):
        say(line)
    return OK


def metrics(client: Client, args: argparse.Namespace) -> int:
    answer = client.get(f"/runs/{seg(args.run)}/metrics")
    if args.json:
        print_json(answer)
        return OK
    final = "final" if answer.get("final") else "latest"
    say(
        f"{answer['run_id']}  {answer['status']}  step {steps(answer)}"
        f"  ({final}, from {answer.get('metrics_source')})"
    )
    summary = {k: v for k, v in (answer.get("metrics") or {}).items() if k != "step"}
    say(pairs(summary.items(), indent="  "))
    if answer.get("latest"):
        say("latest step:")
        say(pairs(sorted(answer["latest"].items()), indent="  "))
    checkpoints = answer.get("checkpoints") or []
    say(
        pairs(
            [
                ("wandb", answer.get("wandb_url")),
                ("weights", answer.get("weights_path")),
                ("checkpoints", len(checkpoints)),
                ("history rows", len(answer.get("history") or [])),
            ]
        )
    )
    if answer.get("metrics_note"):
        say(f"note: {answer['metrics_note']}")
    return OK


def history(client: Client, args: argparse.Namespace) -> int:
    params = {"keys": args.keys, "limit": args.limit}
    answer = client.get(f"/runs/{seg(args.run)}/history", params)
    if args.json:
        print_json(answer)
        return OK
    rows = answer.get("rows") or []
    if not rows:
        say("no metrics recorded yet")
        return OK
    keys = list(answer.get("keys") or [])
    if not keys:  # all keys: in the order they first appear, which is the runner's order
        keys = list(dict.fromkeys(k for row in rows for k in row if k != "step"))
    say(table(["step", *keys], [[row.get("step"), *(row.get(k) for k in keys)] for row in rows]))
    return OK


def checkpoints(client: Client, args: argparse.Namespace) -> int:
    answer = client.get(f"/runs/{seg(args.run)}/checkpoints")
    if args.json:
        print_json(answer)
        return OK
    if not answer:
        say("no checkpoints")
        return OK
    rows = [[c["step"], c["kind"], c["name"], c["path"], c.get("created_at")] for c in answer]
    say(table(["STEP", "KIND", "NAME", "PATH", "CREATED"], rows))
    return OK
