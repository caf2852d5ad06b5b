"""`runs rollouts RUN`: what a run's model said, from its recorded episodes (a table, each
episode in full with --full, or each step's record with --steps)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from cli.client import Client, seg
from cli.exits import OK
from cli.output import clean, print_json, say, table

PREVIEW = 60  # characters of a completion in the table


def rollouts(client: Client, args: argparse.Namespace) -> int:
    if args.steps:
        return _steps(client, args)
    params = {
        "step": args.step,
        "group": args.group,
        "min_reward": args.min_reward,
        "max_reward": args.max_reward,
        "limit": args.limit,
        "cursor": args.cursor,
    }
    page = client.get(f"/runs/{seg(args.run)}/rollouts", params)
    if args.json:
        print_json(page)
        return OK
    items = page["items"]
    if not items:
        say("no recorded episodes match")
    elif args.full:
        for item in items:
            _episode(item)
    else:
        rows = [
            [
                i["step"],
                i["group"],
                i["index"],
                i["reward"],
                i["advantage"],
                i["finish_reason"],
                i["completion_tokens"],
                i["completion"][:PREVIEW],
            ]
            for i in items
        ]
        headers = ["STEP", "GROUP", "#", "REWARD", "ADVANTAGE", "FINISH", "TOKENS", "COMPLETION"]
        say(table(headers, rows))
    if page.get("next_cursor"):
        say(f"more: --cursor {page['next_cursor']}")
    return OK


def _episode(item: dict[str, Any]) -> None:
    say(
        f"== step {item['step']} group {item['group']} #{item['index']}  reward "
        f"{item['reward']}  advantage {item['advantage']}  {item['finish_reason'] or ''}"
    )
    for segment in item["segments"]:
        who = "model" if segment["role"] == "model" else "env"
        say(f"[{who}] {clean(segment['text'])}")


def _steps(client: Client, args: argparse.Namespace) -> int:
    answer = client.get(f"/runs/{seg(args.run)}/rollouts/steps")
    if args.json:
        print_json(answer)
        return OK
    say(
        f"{answer['run_id']}: {answer['rollouts_per_step']} episodes per step kept, "
        f"{answer['size_bytes'] / 1e6:.2f} of {answer['rollouts_max_mb']:g} MB used"
    )
    rows = [
        [
            s["step"],
            s["sampled"],
            s["recorded"],
            s["kept"],
            s["reward_mean"],
            s["reward_min"],
            s["reward_max"],
            s["note"],
        ]
        for s in answer["steps"]
    ]
    headers = ["STEP", "SAMPLED", "RECORDED", "KEPT", "REWARD", "MIN", "MAX", "NOTE"]
    say(table(headers, rows) if rows else "no steps recorded yet")
    return OK


def register(
    cmds: argparse._SubParsersAction, leaf: Callable[..., argparse.ArgumentParser]
) -> None:
    """`runs rollouts`, made by `leaf` (cli.parser.add)."""
    cmd = leaf(cmds, "rollouts", rollouts, "what a run's model said: its recorded episodes")
    cmd.add_argument("run", metavar="RUN", help="a run id such as r-3f9c2a1b")
    cmd.add_argument("--step", type=int, help="only this step")
    cmd.add_argument("--group", type=int, help="only this group of the step")
    cmd.add_argument("--min-reward", type=float, help="only rewards at least this")
    cmd.add_argument("--max-reward", type=float, help="only rewards at most this")
    cmd.add_argument("--limit", type=int, help="episodes per page (server: 100)")
    cmd.add_argument("--cursor", help="the next page (as the last one said)")
    cmd.add_argument(
        "--full", action="store_true", help="each episode whole, the env's and model's text apart"
    )
    cmd.add_argument("--steps", action="store_true", help="each step's record instead")
