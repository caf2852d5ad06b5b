"""`rlctl` against a live server (fake runner; tiny-random for inference).

Every subcommand runs at least once as a subprocess (`python -m cli`, RLCS_URL set); the
other output format of a command runs in-process. Checks `--json` output and exit codes.
"""

from __future__ import annotations

import io
import json
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import pytest

from cli import watch as watch_mod
from cli.main import main
from cli.values import parse_value
from tests.cli.conftest import Rlctl
from tests.support.helpers import wait_for
from tests.support.live_server import LiveServer, free_port
from tests.support.rlctl import Result, run_cli
from tests.support.standins.loopback import JsonHandler, serving

OK, SERVER_ERROR, USAGE, UNREACHABLE, RUN_FAILED = 0, 1, 2, 3, 4
T = TypeVar("T")
R = TypeVar("R")


def parallel(call: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """Independent commands at once: each is an interpreter start, and they add up."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(call, items))


def ok_json(result: Result) -> Any:
    assert result.returncode == OK, result.stderr
    return json.loads(result.stdout)


def start_run(rlctl: Rlctl, *extra: str) -> str:
    return ok_json(rlctl("--json", "runs", "start", *extra))["run_id"]


def wait_running(server: LiveServer, run_id: str, timeout: float = 15.0) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        run = httpx.get(f"{server.url}/runs/{run_id}").json()
        return run if run["status"] == "running" and run["pid"] and run["step"] >= 1 else None

    return wait_for(running, timeout)


def main_result(capsys: pytest.CaptureFixture[str], *args: str) -> Result:
    """`main(args)` in-process, for cases that never reach a server."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return Result(list(args), code, out, err)


# Without a server.


def test_help_documents_commands_and_exit_codes() -> None:
    result = run_cli("http://127.0.0.1:9", "--help")
    assert result.returncode == OK
    for text in ("exit codes:", "RLCS_URL", "RLCS_API_TOKEN", "health", "envs", "runs", "infer"):
        assert text in result.stdout


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for result in parallel(lambda args: run_cli("http://127.0.0.1:9", *args), [[], ["runs", "x"]]):
        assert result.returncode == USAGE and "error" in result.stderr and not result.stdout
    for args in [
        ["runs", "start", "--set", "no_equals_sign"],
        ["runs", "watch", "r-00000000", "--interval", "0"],
        ["runs", "list", "--status", "sleeping"],
        ["config", "set", "group_size"],
        ["infer"],
        ["infer", "a prompt", "--items", "2"],
        ["--url", "ftp://example.invalid", "health"],
    ]:
        result = main_result(capsys, *args)
        assert result.returncode == USAGE, (args, result.stderr)
        assert "error" in result.stderr and result.stdout == "", args


def test_unreachable_server_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    result = run_cli(closed, "health")
    assert result.returncode == UNREACHABLE and result.stdout == ""
    assert "cannot reach the server" in result.stderr and closed in result.stderr
    for args in (["--json", "runs", "list"], ["runs", "logs", "r-00000000", "-f"]):
        result = main_result(capsys, "--url", closed, *args)
        assert result.returncode == UNREACHABLE and closed in result.stderr


def test_value_parsing() -> None:
    assert parse_value("8") == 8
    assert parse_value("true") is True
    assert parse_value("0.001") == 0.001
    assert parse_value('{"a": 1}') == {"a": 1}
    assert parse_value("null") is None
    assert parse_value("gpt2") == "gpt2"
    assert parse_value("Org/Model-135M") == "Org/Model-135M"
    assert parse_value("NaN") == "NaN"  # not JSON: sent as a string, never as a bare NaN


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Polls:
    """Stands in for the client: answers GET /runs/{id} from a script of states, and its
    history with what a run that samples ahead with a KL penalty records."""

    def __init__(self, *states: tuple[str, int]) -> None:
        self.states = list(states)
        self.step = 0

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        if path.endswith("/history"):
            row = {"step": self.step, "sampler/steps_off_policy_max": 1.0, "kl/reference": 0.02}
            return {"rows": [row]}
        status, step = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        self.step = step
        return {
            "run_id": "r-0000abcd",
            "status": status,
            "step": step,
            "total_steps": 4,
            "metrics": {"reward_mean": step / 4, "loss": 0.5},
            "progress": {"fraction": step / 4, "eta_s": 4.0 - step},
            "stalled": False,
        }


def test_watch_redraws_one_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    args = type("Args", (), {"run": "r-0000abcd", "interval": 0.001, "json": False})()
    out = _Terminal()
    polls = _Polls(("queued", 0), ("running", 1), ("running", 3), ("failed", 3))
    assert watch_mod.watch(polls, args, out) == RUN_FAILED  # type: ignore[arg-type]
    text = out.getvalue()
    assert text.count("\r") == 4 and text.count("\n") == 2
    assert (
        "[######------------------]  1/4  25%  reward 0.25  loss 0.5  off-policy 1  kl 0.02  "
        "ETA 0:03" in text
    )
    assert text.rstrip().endswith("run r-0000abcd failed at step 3/4")

    monkeypatch.setenv("COLUMNS", "40")  # a narrow terminal: lines are cut, never wrapped
    out = _Terminal()
    assert watch_mod.watch(_Polls(("succeeded", 4)), args, out) == OK  # type: ignore[arg-type]
    assert max(len(part) for part in out.getvalue().split("\r")[1].splitlines()) == 39

    plain = io.StringIO()  # not a terminal: one line per change, no carriage returns
    polls = _Polls(("running", 1), ("running", 1), ("running", 2), ("stopped", 2))
    assert watch_mod.watch(polls, args, plain) == OK  # type: ignore[arg-type]
    lines = plain.getvalue().splitlines()
    assert "\r" not in plain.getvalue() and len(lines) == 4, lines
    assert lines[-1] == "run r-0000abcd stopped at step 2/4"


class _TokenCheck(JsonHandler):
    """Answers GET like the server with RLCS_API_TOKEN=s3cret (only what this test needs)."""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        allowed = self.headers.get("Authorization") == "Bearer s3cret"
        self.answer(
            200 if allowed else 401, [] if allowed else {"detail": "Missing or wrong token."}
        )


def test_token_is_sent_as_bearer(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's own token check has its tests; here: what the CLI sends, and its hint.
    with serving(_TokenCheck) as standin:
        url = standin.url
        right = run_cli(url, "--json", "envs", "list", RLCS_API_TOKEN="s3cret")
        assert right.returncode == OK and json.loads(right.stdout) == []
        monkeypatch.delenv("RLCS_API_TOKEN", raising=False)
        missing = main_result(capsys, "--url", url, "envs", "list")
        assert missing.returncode == SERVER_ERROR and "HTTP 401" in missing.stderr
        assert "set RLCS_API_TOKEN" in missing.stderr
        monkeypatch.setenv("RLCS_API_TOKEN", "nope")
        wrong = main_result(capsys, "--url", url, "envs", "list")
        assert wrong.returncode == SERVER_ERROR and "HTTP 401" in wrong.stderr


# Against the live server.


def test_health(rlctl: Rlctl, rlctl_in: Rlctl, server: LiveServer) -> None:
    human = rlctl("health")
    assert human.returncode == OK and human.stdout.startswith("ok")
    assert server.url in human.stdout and "active_runs" in human.stdout
    assert ok_json(rlctl_in("--json", "health"))["status"] == "ok"
    assert ok_json(rlctl_in("health", "--json"))["environments"] >= 1


def test_envs(rlctl: Rlctl, rlctl_in: Rlctl) -> None:
    table, selected, shown = parallel(
        lambda args: rlctl(*args),
        [
            ["envs", "list"],
            ["envs", "select", "arithmetic", "--json"],
            ["--json", "envs", "show", "guess_number"],
        ],
    )
    assert table.returncode == OK
    header = table.stdout.splitlines()[0].split()
    assert header == ["NAME", "CLASS", "FRAMEWORK", "IMPORTABLE", "DESCRIPTION"]
    assert "ArithmeticEnv" in table.stdout
    assert ok_json(selected)["selected"] == "arithmetic"
    assert "group_size" in ok_json(selected)["config"]
    config = ok_json(shown)
    assert config["environment"] == "guess_number" and "max_turns" in config["configurable_fields"]

    listed = ok_json(rlctl_in("envs", "list", "--json"))
    assert {"arithmetic", "guess_number"} <= {e["name"] for e in listed}
    assert rlctl_in("envs", "select", "arithmetic").stdout.startswith("selected arithmetic")
    assert "max_turns" in rlctl_in("envs", "show", "guess_number").stdout
    typo = rlctl_in("envs", "select", "arithmatic")
    assert typo.returncode == SERVER_ERROR and typo.stdout == ""
    assert "HTTP 404" in typo.stderr and "Did you mean arithmetic" in typo.stderr


def test_config(rlctl: Rlctl, rlctl_in: Rlctl) -> None:
    rlctl_in("envs", "select", "arithmetic")
    answer = ok_json(rlctl("--json", "config", "set", "group_size", "6"))
    assert answer["configurable_fields"]["group_size"] == 6
    bad = rlctl("config", "set", "group_size", "0")
    assert bad.returncode == SERVER_ERROR and bad.stdout == ""
    assert "HTTP 422" in bad.stderr and "group_size" in bad.stderr and "(got 0)" in bad.stderr
    shown = ok_json(rlctl("config", "show", "--json"))
    assert shown["environment"] == "arithmetic" and shown["configurable_fields"]["group_size"] == 6

    for field, text, value in [
        ("wandb_name", "my run", "my run"),
        ("learning_rate", "0.001", 0.001),
        ("use_wandb", "false", False),
        ("loss_fn", "ppo", "ppo"),  # clip thresholds are PPO's keys
        ("loss_fn_config", '{"clip_low_threshold": 0.8}', {"clip_low_threshold": 0.8}),
    ]:
        answer = ok_json(rlctl_in("--json", "config", "set", field, text))
        assert answer["configurable_fields"][field] == value, field
    human = rlctl_in("config", "set", "group_size", "8")
    assert human.returncode == OK and "group_size = 8" in human.stdout
    table = rlctl_in("config", "show")
    assert "locked" in table.stdout and "tokenizer_name" in table.stdout

    # --env edits another environment through PUT, leaving the selected one alone.
    other = ok_json(rlctl_in("config", "set", "max_turns", "6", "--env", "guess_number", "--json"))
    assert other["environment"] == "guess_number"
    assert other["configurable_fields"]["max_turns"] == 6
    again = ok_json(rlctl_in("--json", "config", "show", "--env", "guess_number"))
    assert again["configurable_fields"]["max_turns"] == 6
    fields = ok_json(rlctl_in("--json", "config", "show"))["configurable_fields"]
    assert "max_turns" not in fields and fields["group_size"] == 8
    unknown = rlctl_in("config", "set", "no_such_field", "1", "--env", "guess_number")
    assert unknown.returncode == SERVER_ERROR and "no_such_field" in unknown.stderr


def test_start_with_env_and_follow_logs(rlctl: Rlctl, rlctl_in: Rlctl) -> None:
    run_id = start_run(rlctl_in, "--env", "guess_number", "--set", "total_steps=4")
    follow = rlctl("runs", "logs", run_id, "--follow")
    assert follow.returncode == OK, follow.stderr
    assert follow.stdout.splitlines()[-5:] == ["step 1", "step 2", "step 3", "step 4", "done"]
    assert f"run {run_id} succeeded" in follow.stderr  # the log alone on stdout

    follow_json = rlctl_in("runs", "logs", run_id, "-f", "--json")
    events = [json.loads(line) for line in follow_json.stdout.splitlines()]
    assert events[-1]["event"] == "end" and events[-1]["data"]["status"] == "succeeded"
    assert {"event": "line", "data": "done"} in events

    listed = ok_json(rlctl_in("--json", "runs", "list", "--env", "guess_number"))
    assert [r["run_id"] for r in listed] == [run_id]
    clash = rlctl_in("runs", "start", "--env", "guess_number", "--set", "environment=arithmetic")
    assert clash.returncode == USAGE and "disagree" in clash.stderr


def test_stopped_run_exits_0_and_failed_run_exits_4(
    rlctl: Rlctl, rlctl_in: Rlctl, server: LiveServer
) -> None:
    rlctl_in("envs", "select", "arithmetic")
    to_stop = start_run(rlctl_in, "--set", "total_steps=300")
    to_kill = start_run(rlctl_in, "--set", "total_steps=300")
    wait_running(server, to_stop)
    victim = wait_running(server, to_kill)

    assert rlctl_in("runs", "stop", to_stop).stdout.split()[0] == to_stop
    os.kill(victim["pid"], signal.SIGKILL)  # a crash, as far as the server can tell
    stop_watch, kill_watch = parallel(
        lambda args: rlctl(*args),
        [
            ["runs", "watch", to_stop, "--interval", "0.2"],
            ["runs", "watch", to_kill, "--interval", "0.2", "--json"],
        ],
    )
    assert stop_watch.returncode == OK, stop_watch.stderr
    assert f"run {to_stop} stopped" in stop_watch.stdout
    assert kill_watch.returncode == RUN_FAILED, kill_watch.stderr
    states = [json.loads(line) for line in kill_watch.stdout.splitlines()]
    assert states[-1]["status"] == "failed" and states[-1]["failure_kind"]
    follow = rlctl_in("runs", "logs", to_kill, "--follow", "--tail", "1")
    assert follow.returncode == RUN_FAILED and f"run {to_kill} failed" in follow.stderr


def test_the_cost_column_shows_money_else_time_and_tokens() -> None:
    from cli.runs import cost_cell

    assert cost_cell({"money": 12.345, "currency": "EUR"}) == "12.35 EUR"
    assert cost_cell({"money": 0.000123456, "currency": "USD"}) == "0.0001235 USD"
    assert cost_cell({"money": None, "device_s": 75.0, "tokens": 12_345}) == "1:15, 12.3k tok"
    assert cost_cell({"money": None, "device_s": None, "tokens": None}) is None
    assert cost_cell(None) is None


def test_a_tinker_session_shows_its_steps_without_a_total() -> None:
    from cli.output import steps

    assert steps({"step": 3, "total_steps": 10}) == "3/10"
    assert steps({"step": 5, "total_steps": 0, "source": "tinker-api"}) == "5"
