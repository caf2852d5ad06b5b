"""The argparse tree of `rlctl`: subcommands, their options, and the handler each one calls."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cli import commands, db, engine, export, infer, mcp, rollouts, runs, sweeps, watch, webhooks
from cli.client import DEFAULT_URL, Client
from cli.exits import EPILOG
from cli.values import assignment, positive_float

Handler = Callable[[Client, argparse.Namespace], int]
Group = argparse._SubParsersAction  # argparse exposes no public name for it

RUN_STATUSES = ["queued", "starting", "running", "stopping", "succeeded", "failed", "stopped"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlctl",
        description="Command-line client for the RL control server (environments, config, "
        "training runs, test inference).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser)
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add(top, "health", commands.health, "server liveness, version, backend and counts")
    add(
        top,
        "engine",
        engine.show,
        "the engine hosts: each one's device, memory, models, lanes, clients",
    )
    _envs_parser(top)
    _config_parser(top)
    _runs_parser(top)
    _sweeps_parser(top)
    webhooks.register(top, add)
    export.register(top, add)
    mcp.register(top, add)
    _infer_parser(top)
    _db_parser(top)
    return parser


def _envs_parser(top: Group) -> None:
    envs = top.add_parser("envs", help="list, select and inspect environments")
    env_cmds = envs.add_subparsers(dest="envs_command", metavar="ACTION", required=True)
    add(env_cmds, "list", commands.envs_list, "list discovered environments")
    add(env_cmds, "select", commands.envs_select, "select an environment").add_argument("name")
    add(env_cmds, "show", commands.envs_show, "show an environment's config").add_argument("name")


def _config_parser(top: Group) -> None:
    config = top.add_parser("config", help="show or edit the config of an environment")
    config_cmds = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = add(config_cmds, "show", commands.config_show, "show the selected environment's config")
    show.add_argument("--env", help="this environment instead of the selected one")
    set_ = add(
        config_cmds,
        "set",
        commands.config_set,
        "set one field (VALUE is parsed as JSON when it parses, else taken as a string)",
    )
    set_.add_argument("field")
    set_.add_argument("value", metavar="VALUE", help="e.g. 8, true, 0.001, '{\"a\":1}', gpt2")
    set_.add_argument("--env", help="this environment instead of the selected one")


def _db_parser(top: Group) -> None:
    db_p = top.add_parser("db", help="the database itself (run where the server runs)")
    db_cmds = db_p.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    add(db_cmds, "upgrade", db.upgrade, "bring the schema to the newest migration")


def _leaf_options() -> argparse.ArgumentParser:
    # Leaf parsers accept --json too (`rlctl runs list --json`); SUPPRESS keeps a leaf that
    # was not given it from resetting the global flag.
    leaf = argparse.ArgumentParser(add_help=False)
    leaf.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON out")
    return leaf


_LEAF = _leaf_options()


def add(group: Group, name: str, func: Handler, help: str) -> argparse.ArgumentParser:
    sub = group.add_parser(name, help=help, description=help, parents=[_LEAF])
    sub.set_defaults(func=func)
    return sub


def _global_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the server's JSON as is (for scripts)"
    )
    parser.add_argument("--url", help=f"server address (default: $RLCS_URL or {DEFAULT_URL})")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        help="seconds to wait for an answer (default 30; 600 for infer)",
    )


def _runs_parser(top: Group) -> None:
    runs_p = top.add_parser("runs", help="start, list, watch and stop training runs")
    cmds = runs_p.add_subparsers(dest="runs_command", metavar="ACTION", required=True)
    _run_lifecycle_commands(cmds)
    _run_attempt_commands(cmds)
    _run_output_commands(cmds)


def _run_lifecycle_commands(cmds: Group) -> None:
    """start, list, status, stop, wait."""
    start = add(cmds, "start", runs.start, "start a run of the selected (or --env) environment")
    start.add_argument("--env", help="environment (default: the selected one)")
    _set_option(start)
    start.add_argument("--idempotency-key", help="a repeated start with the same key is one run")

    list_ = add(cmds, "list", runs.list_, "list runs, newest first")
    list_.add_argument("--status", choices=RUN_STATUSES)
    list_.add_argument("--env", help="only runs of this environment")
    list_.add_argument(
        "--source",
        choices=("api", "tinker-api"),
        help="only runs started through our API, or only Tinker SDK sessions",
    )
    list_.add_argument("--limit", type=int, default=None, help="at most this many (server: 100)")

    add(cmds, "status", runs.status, "a run's status, progress and metrics").add_argument("run")
    add(cmds, "stop", runs.stop, "stop a run (idempotent)").add_argument("run")

    wait = add(cmds, "wait", runs.wait, "block until a run finishes (or reaches a step)")
    wait.add_argument("run")
    wait.add_argument(
        "--until", default="terminal", help="terminal (default), or step:N (step N recorded)"
    )
    _at_most_option(wait)


def _run_attempt_commands(cmds: Group) -> None:
    """resume and fork: a new attempt, or a new run, from a run's checkpoint."""
    resume = add(cmds, "resume", runs.resume, "a new attempt from the last state checkpoint")
    resume.add_argument("run")
    _set_option(resume)
    resume.add_argument(
        "--step", type=int, help="resume from the state checkpoint of this step instead"
    )
    resume.add_argument(
        "--force", action="store_true", help="resume even if --set changes the config hash"
    )

    fork = add(cmds, "fork", runs.fork, "a new run from a run's checkpoint, with --set changes")
    fork.add_argument("run")
    _set_option(fork)
    fork.add_argument(
        "--step", type=int, help="start from the state checkpoint of this step (default last)"
    )


def _run_output_commands(cmds: Group) -> None:
    """What a run wrote: its log, metrics, checkpoints, rollouts, a live view."""
    logs = add(cmds, "logs", runs.logs, "a run's log (the last lines, or --follow it)")
    logs.add_argument("run")
    logs.add_argument("--tail", type=int, default=100, help="last N lines (default 100)")
    logs.add_argument(
        "--follow", "-f", action="store_true", help="stream new lines until the run ends"
    )

    add(cmds, "metrics", runs.metrics, "final or latest metrics, weights path").add_argument("run")
    history = add(cmds, "history", runs.history, "per-step metric history")
    history.add_argument("run")
    history.add_argument("--keys", help="comma-separated metric keys, e.g. reward/mean,train/loss")
    history.add_argument("--limit", type=int, default=None, help="at most this many rows")
    add(cmds, "checkpoints", runs.checkpoints, "a run's checkpoints").add_argument("run")
    rollouts.register(cmds, add)

    watch_p = add(cmds, "watch", watch.watch, "a live progress bar until the run ends")
    watch_p.add_argument("run")
    watch_p.add_argument(
        "--interval", type=positive_float, default=2.0, help="seconds between polls (default 2)"
    )


def _sweeps_parser(top: Group) -> None:
    sweeps_p = top.add_parser("sweeps", help="start a grid of runs and compare their results")
    cmds = sweeps_p.add_subparsers(dest="sweeps_command", metavar="ACTION", required=True)
    start = add(cmds, "start", sweeps.start, "a run for every combination of the --grid values")
    start.add_argument("--env", help="environment (default: the selected one)")
    start.add_argument(
        "--grid",
        action="append",
        type=sweeps.grid_axis,
        metavar="KEY=V1,V2",
        help="a field and its values (repeatable; every combination is a run)",
    )
    _set_option(start)
    start.add_argument(
        "--metric", default="reward_mean", help="picks the best run (default reward_mean)"
    )
    start.add_argument("--goal", choices=["max", "min"], default="max")
    start.add_argument("--max-runs", type=int, help="allow more runs than 100")
    start.add_argument("--idempotency-key", help="a repeated start with the same key is one sweep")
    list_ = add(cmds, "list", sweeps.list_, "list sweeps, newest first")
    list_.add_argument("--limit", type=int, default=None, help="at most this many (server: 100)")
    add(cmds, "show", sweeps.show, "each run's result side by side, the best run").add_argument(
        "sweep"
    )
    wait = add(cmds, "wait", sweeps.wait, "block until every run of a sweep has finished")
    wait.add_argument("sweep")
    _at_most_option(wait)
    add(cmds, "stop", sweeps.stop, "stop every unfinished run of a sweep").add_argument("sweep")


def _infer_parser(top: Group) -> None:
    infer_p = add(
        top,
        "infer",
        infer.infer,
        "sample a model or a run's adapter on prompts (or --items tasks) and score the answers",
    )
    infer_p.add_argument("prompts", nargs="*", metavar="PROMPT")
    infer_p.add_argument("--env", help="environment that scores (default: the selected one)")
    infer_p.add_argument("--model", help="model (default: the environment's model_name)")
    infer_p.add_argument("--run", help="sample this run's trained adapter")
    infer_p.add_argument(
        "--step", type=int, help="the run's checkpoint at this step (default last)"
    )
    infer_p.add_argument("--items", type=int, help="N tasks drawn from the environment instead")
    infer_p.add_argument("--max-tokens", type=int, help="default 256")
    infer_p.add_argument("--temperature", type=float, help="default 1.0")
    infer_p.add_argument("--seed", type=int, help="seed of the drawn tasks and the sampling")


def _at_most_option(parser: argparse.ArgumentParser) -> None:
    # Not --timeout: that is the global per-request one.
    parser.add_argument(
        "--at-most",
        dest="wait_s",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="give up after this many seconds (exit 5; default 3600)",
    )


def _set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        type=assignment,
        metavar="KEY=VALUE",
        help="config override (repeatable; VALUE parsed as in `config set`)",
    )
