"""`export RUN`: write a run's checkpoint as a Hugging Face folder (the LoRA adapter, or the
model merged) on the server's machine, and print where."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cli.client import Client, seg
from cli.exits import OK
from cli.output import pairs, print_json, say

# A merge of a larger model, or a Tinker download, can take minutes; the server bounds it.
EXPORT_TIMEOUT_S = 900.0


def export(client: Client, args: argparse.Namespace) -> int:
    body = {
        "checkpoint_step": args.step,
        "merged": args.merged,
        "path": args.path,
        "overwrite": args.overwrite,
        "include_rollouts": args.with_rollouts,
    }
    answer = client.post(
        f"/runs/{seg(args.run)}/export", body, timeout=max(client.timeout, EXPORT_TIMEOUT_S)
    )
    if args.json:
        print_json(answer)
        return OK
    say(
        pairs(
            [
                ("run", answer["run_id"]),
                ("step", answer["step"]),
                ("format", answer["format"]),
                ("base model", answer.get("base_model")),
                ("path", answer["path"]),
                ("files", ", ".join(answer["files"])),
            ]
        )
    )
    return OK


def register(top: argparse._SubParsersAction, leaf: Callable[..., argparse.ArgumentParser]) -> None:
    """The `export` command, made by `leaf` (cli.parser.add)."""
    cmd = leaf(
        top, "export", export, "write a run's checkpoint as a Hugging Face folder (on the server)"
    )
    cmd.add_argument("run", metavar="RUN", help="a run id such as r-3f9c2a1b")
    cmd.add_argument(
        "--step", type=int, default=None, metavar="N", help="this checkpoint (default: newest)"
    )
    cmd.add_argument("--merged", action="store_true", help="the base model with the adapter merged")
    cmd.add_argument(
        "--path", default=None, metavar="P", help="a folder inside the server's RLCS_EXPORT_DIR"
    )
    cmd.add_argument("--overwrite", action="store_true", help="replace a folder that holds files")
    cmd.add_argument(
        "--with-rollouts",
        action="store_true",
        help="add rollouts.jsonl: every episode the run recorded",
    )
