"""`webhooks ...`: add a receiver of run and sweep events, list and remove them, and read a
webhook's deliveries."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cli.client import Client, seg
from cli.exits import OK
from cli.output import pairs, print_json, say, table

# As the server names them (POST /webhooks refuses any other).
EVENTS = [
    "run.started",
    "run.step",
    "run.succeeded",
    "run.failed",
    "run.stopped",
    "run.stalled",
    "sweep.finished",
]
DELIVERY_STATUSES = ["pending", "delivered", "failed"]


def add(client: Client, args: argparse.Namespace) -> int:
    body = {"url": args.receiver, "events": args.event, "step_every": args.step_every}
    answer = client.post("/webhooks", body)
    if args.json:
        print_json(answer)
        return OK
    say(
        pairs(
            [
                ("webhook", answer["webhook_id"]),
                ("url", answer["url"]),
                ("events", ", ".join(answer["events"])),
                ("step every", answer["step_every"]),
                ("secret", answer["secret"]),
            ]
        )
    )
    say("Keep the secret: it is shown only now. Check X-RLCS-Signature with it (docs/webhooks.md).")
    return OK


def list_(client: Client, args: argparse.Namespace) -> int:
    hooks = client.get("/webhooks")
    if args.json:
        print_json(hooks)
        return OK
    if not hooks:
        say("no webhooks")
        return OK
    rows = [
        [h["webhook_id"], h["url"], ",".join(h["events"]), h["step_every"], h["created_at"]]
        for h in hooks
    ]
    say(table(["WEBHOOK", "URL", "EVENTS", "STEP EVERY", "CREATED"], rows))
    return OK


def rm(client: Client, args: argparse.Namespace) -> int:
    answer = client.request("DELETE", f"/webhooks/{seg(args.webhook)}")
    if args.json:
        print_json(answer)
    else:
        say(f"{answer['webhook_id']}  deleted")
    return OK


def deliveries(client: Client, args: argparse.Namespace) -> int:
    params = {"status": args.status, "limit": args.limit}
    answer = client.get(f"/webhooks/{seg(args.webhook)}/deliveries", params)
    if args.json:
        print_json(answer)
        return OK
    if not answer:
        say("no deliveries")
        return OK
    rows = [
        [
            d["id"],
            d["event"],
            d["order_key"],
            d["status"],
            d["attempts"],
            d.get("last_status_code"),
            d.get("last_error"),
            d.get("delivered_at") or d.get("next_attempt_at"),
        ]
        for d in answer
    ]
    headers = ["DELIVERY", "EVENT", "FOR", "STATUS", "TRIES", "HTTP", "ERROR", "DONE/NEXT"]
    say(table(headers, rows))
    return OK


def register(top: argparse._SubParsersAction, leaf: Callable[..., argparse.ArgumentParser]) -> None:
    """The `webhooks` subcommands, each made by `leaf` (cli.parser.add)."""
    hooks = top.add_parser("webhooks", help="receive run and sweep events at a URL (signed)")
    cmds = hooks.add_subparsers(dest="webhooks_command", metavar="ACTION", required=True)
    new = leaf(cmds, "add", add, "add a webhook; prints its signing secret (only this once)")
    # Not `url`: that is the global --url (the server's address).
    new.add_argument(
        "receiver",
        metavar="URL",
        help="http(s) URL: loopback, or a host in RLCS_WEBHOOK_ALLOWED_HOSTS",
    )
    new.add_argument(
        "--event",
        action="append",
        required=True,
        choices=EVENTS,
        help="an event to send (repeatable)",
    )
    new.add_argument(
        "--step-every", type=int, default=1, metavar="N", help="run.step every N steps (default 1)"
    )
    leaf(cmds, "list", list_, "list webhooks")
    leaf(cmds, "rm", rm, "remove a webhook (its pending deliveries are dropped)").add_argument(
        "webhook"
    )
    sent = leaf(cmds, "deliveries", deliveries, "a webhook's deliveries, newest first")
    sent.add_argument("webhook")
    sent.add_argument("--status", choices=DELIVERY_STATUSES)
    sent.add_argument("--limit", type=int, default=None, help="at most this many (server: 100)")
