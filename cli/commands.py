"""`health`, `envs ...` and `config ...`: one HTTP call each, printed as a table or as JSON."""

from __future__ import annotations

import argparse
from typing import Any

from cli.client import Client, seg
from cli.exits import OK
from cli.output import fmt, pairs, print_json, say, table
from cli.values import parse_value


def health(client: Client, args: argparse.Namespace) -> int:
    answer = client.get("/health")
    if args.json:
        print_json(answer)
        return OK
    say(f"{answer.get('status')}  {client.url}")
    say(pairs((k, v) for k, v in answer.items() if k != "status"))
    return OK


def envs_list(client: Client, args: argparse.Namespace) -> int:
    envs = client.get("/environments")
    if args.json:
        print_json(envs)
        return OK
    rows = []
    for env in envs:
        # importable is null until the server has tried to import the file.
        importable = {True: "yes", False: "NO", None: "?"}[env.get("importable")]
        description = env.get("description") or ""
        if env.get("error"):
            description = f"{description} [error: {env['error']}]"
        framework = env.get("framework") or "rlcs"
        rows.append([env["name"], env.get("class_name"), framework, importable, description])
    say(table(["NAME", "CLASS", "FRAMEWORK", "IMPORTABLE", "DESCRIPTION"], rows))
    return OK


def envs_select(client: Client, args: argparse.Namespace) -> int:
    answer = client.post(f"/environments/{seg(args.name)}/select")
    if args.json:
        print_json(answer)
        return OK
    say(f"selected {answer['selected']} ({answer.get('file_path')})")
    say("  its config: rlctl config show")
    return OK


def envs_show(client: Client, args: argparse.Namespace) -> int:
    return _print_config(client.get(f"/environments/{seg(args.name)}/config"), args)


def config_show(client: Client, args: argparse.Namespace) -> int:
    path = f"/environments/{seg(args.env)}/config" if args.env else "/config"
    return _print_config(client.get(path), args)


def config_set(client: Client, args: argparse.Namespace) -> int:
    value = parse_value(args.value)
    if args.env:
        path = f"/environments/{seg(args.env)}/config"
        answer = client.put(path, {"values": {args.field: value}})
    else:
        answer = client.post("/config", {"field": args.field, "value": value})
    if args.json:
        print_json(answer)
        return OK
    stored = answer.get("configurable_fields", {}).get(args.field, value)
    say(
        f"{answer['environment']}: {args.field} = {fmt(stored)} "
        f"(config version {answer.get('version')})"
    )
    return OK


def _print_config(answer: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        print_json(answer)
        return OK
    say(
        f"environment {answer['environment']}  version {answer.get('version')}  "
        f"updated {fmt(answer.get('updated_at'))}"
    )
    say(table(["FIELD", "VALUE"], sorted(answer.get("configurable_fields", {}).items())))
    locked = answer.get("locked_fields") or {}
    if locked:
        say("\nlocked (decided by the server):")
        say(pairs(sorted(locked.items()), indent="  "))
    return OK
