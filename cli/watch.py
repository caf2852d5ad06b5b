"""`runs watch` (a live progress bar from polling the run) and `runs logs --follow` (SSE).

Both end when the run ends, and their exit code says how: 0 succeeded or stopped, 4 failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import Any, TextIO

from cli import algorithms
from cli.client import Client, seg
from cli.exits import OK, RUN_FAILED, Unreachable
from cli.output import clean, duration, fmt, print_json_line, warn

FINISHED = frozenset({"succeeded", "failed", "stopped"})
BAR_WIDTH = 24


def exit_code_for(status: str) -> int:
    # A stop is something a person or script asked for, and the run keeps a checkpoint that
    # `runs resume` continues from: it ends the watch like success. Only `failed` is 4.
    return RUN_FAILED if status == "failed" else OK


def progress_line(run: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
    """`r-1a2b3c4d running [#####-----] 3/8 38% reward 0.3 loss 1 ETA 0:02`, with how far off
    policy, the KL to the reference and the teacher's reverse KL from `extra` when set."""
    status, step, total = run["status"], run.get("step", 0), run.get("total_steps", 0)
    progress = run.get("progress") or {}
    fraction = progress.get("fraction") or (step / total if total else 0.0)
    filled = round(BAR_WIDTH * min(1.0, fraction))
    parts = [
        run["run_id"],
        status,
        "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "]",
        f"{step}/{total}",
        f"{fraction:.0%}",
    ]
    metrics = run.get("metrics") or {}
    if metrics.get("reward_mean") is not None:
        parts.append(f"reward {fmt(metrics['reward_mean'])}")
    if metrics.get("loss") is not None:
        parts.append(f"loss {fmt(metrics['loss'])}")
    parts += algorithms.brief(extra or {})
    if status in ("running", "stopping") and progress.get("eta_s") is not None:
        parts.append(f"ETA {duration(progress['eta_s'])}")
    if run.get("stalled"):
        parts.append("STALLED")
    if status == "queued" and run.get("details"):
        parts.append(f"({run['details']})")
    return "  ".join(parts)


def watch(client: Client, args: argparse.Namespace, stream: TextIO | None = None) -> int:
    stream = stream or sys.stdout
    in_place = stream.isatty() and not args.json
    path = f"/runs/{seg(args.run)}"
    seen: tuple[Any, ...] | None = None
    width = 0
    extra: dict[str, Any] = {}
    while True:
        run = client.get(path)
        # What counts as a change for the one-line-per-change output; ETA alone is not one.
        key = (run["status"], run.get("step"), run.get("stalled"), run.get("metrics_source"))
        if not args.json and run.get("step") and (seen is None or key[1] != seen[1]):
            extra = algorithms.latest(client, run["run_id"])  # once per new step
        if args.json:
            if key != seen:
                print_json_line(run, stream)
        elif in_place:
            # A line wider than the terminal wraps, and \r then redraws only its last part.
            line = progress_line(run, extra)[: shutil.get_terminal_size().columns - 1]
            # Pad to the longest line so far: a shorter line must cover the previous one.
            width = max(width, len(line))
            stream.write("\r" + line.ljust(width))
            stream.flush()
        elif key != seen:
            stream.write(progress_line(run, extra) + "\n")
            stream.flush()
        seen = key
        if run["status"] in FINISHED:
            break
        time.sleep(args.interval)
    if in_place:
        stream.write("\n")
    if not args.json:
        _final(run["run_id"], run["status"], run, stream)
    return exit_code_for(run["status"])


def follow_logs(client: Client, args: argparse.Namespace) -> int:
    end: dict[str, Any] | None = None
    params = {"tail": args.tail, "follow": "true"}
    for kind, data in client.events(f"/runs/{seg(args.run)}/logs", params):
        if kind == "line":
            # The server sends a bare CR inside a line as a break between data lines, which
            # arrive joined by LF; a log line never holds an LF, so this is the line exactly.
            line = data.replace("\n", "\r")
            if args.json:
                print_json_line({"event": "line", "data": line})
            else:
                sys.stdout.write(clean(line) + "\n")
                sys.stdout.flush()
        elif kind == "end":
            end = json.loads(data)
            break
    if end is None:
        raise Unreachable("the log stream ended before the run did (did the server stop?)")
    if args.json:
        print_json_line({"event": "end", "data": end})
    else:
        # Stderr, so that `rlctl runs logs R --follow > train.log` captures only the log.
        _final(end.get("run_id", args.run), end["status"], end, sys.stderr)
    return exit_code_for(end["status"])


def _final(run_id: str, status: str, info: dict[str, Any], stream: TextIO) -> None:
    line = f"run {run_id} {status}"
    if info.get("step") is not None:
        line += f" at step {info['step']}/{info.get('total_steps')}"
    if info.get("failure_kind"):
        line += f" ({info['failure_kind']})"
    if info.get("exit_code") not in (None, 0):
        line += f", exit code {info['exit_code']}"
    stream.write(line + "\n")
    if status == "failed" and info.get("details"):
        warn(str(info["details"]))
