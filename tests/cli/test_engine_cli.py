"""`rlctl engine` against a stand-in server that answers GET /engine with two hosts: one running
on a GPU (bases, one still loading; lanes; clients), one not running. The answer is built with
the server's own schema, so a change of GET /engine's shape shows here."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cli.main import main
from tests.support.engine_answers import RUN, two_hosts
from tests.support.rlctl import run_cli
from tests.support.standins.loopback import JsonHandler, serving


class _Engine(JsonHandler):
    """Answers GET /engine with `two_hosts`, as the server would."""

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        found = self.path == "/engine"
        self.answer(
            200 if found else 404, two_hosts(time.time()) if found else {"detail": "Not Found"}
        )


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    with serving(_Engine) as standin:
        yield standin.url


def section(out: str, host: str) -> list[str]:
    """The lines of `host`'s block in `rlctl engine`'s output (from its HOST line to the next)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"HOST {host} "))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("HOST ")), None)
    return lines[start:end]


def block(lines: list[str], heading: str) -> list[str]:
    """The lines under `heading` (its table, header first) up to the next blank line."""
    start = lines.index(f"  {heading}") + 1
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def row(lines: list[str], first: str) -> list[str]:
    """The cells of the table row that starts with `first` (tables are aligned on spaces)."""
    (found,) = [line.split() for line in lines if line.split()[:1] == [first]]
    return found


def test_every_host_is_shown_with_its_device_memory_bases_lanes_and_clients(
    stand_in: str,
) -> None:
    result = run_cli(stand_in, "engine")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("engine hosts of box: 2, 1 running\n")

    gpu = section(result.stdout, "box/0")
    assert gpu[0] == "HOST box/0  cuda:0  running"
    facts = {line.split()[0]: line.split(None, 1)[1] for line in gpu[1:6]}
    assert facts["pid"] in ("4242, up 12:34", "4242, up 12:35")  # a second may tick between
    assert facts["memory"] == "2.5 GiB resident; GPU 140.0 GiB, 100.0 GiB free; budget 63.0 GiB"
    assert facts["slots"].startswith("3 adapter(s)") and facts["queue"].startswith("5 sample")
    assert facts["log"] == "/srv/var/engine/box/0/host.log"

    bases = block(gpu, "BASE MODELS")
    assert bases[0].split() == ["NAME", "SIZE", "USERS", "STATE"]
    assert row(bases, "Qwen/Qwen3-8B")[1:] == ["16.0", "GiB", "3", "loaded"]
    assert row(bases, "tiny-random")[1:] == ["354", "KiB", "1", "loading"]
    lanes = block(gpu, "TRAINING LANES")
    assert lanes[0].split() == ["BASE", "LANE", "TRAINING", "WAITING"]
    assert [line.split() for line in lanes[1:]] == [
        ["Qwen/Qwen3-8B", "0", "yes", "2"],
        ["Qwen/Qwen3-8B", "1", "no", "0"],
    ]
    clients = block(gpu, "CLIENTS")
    assert clients[0].split()[:7] == [
        "CLIENT",
        "ROLE",
        "PID",
        "MODELS",
        "SAMPLERS",
        "JOBS",
        "BASES",
    ]
    assert len(clients) == 2 and row(clients, "run")[1:8] == [
        RUN,
        "run",
        "5151",
        "1",
        "2",
        "0",
        "Qwen/Qwen3-8B",
    ]

    idle = section(result.stdout, "box/1")
    assert idle[0] == "HOST box/1  gpu 1  not running (it starts on first need)"
    assert idle[1].split() == ["log", "/srv/var/engine/box/1/host.log"]
    assert len(idle) == 2  # nothing else of a host that is not running


def test_json_prints_the_answer_as_is(
    stand_in: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLCS_API_TOKEN", raising=False)
    capsys.readouterr()
    assert main(["--url", stand_in, "engine", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert timeless(answer) == timeless(two_hosts(time.time()))


def timeless(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer less its clock readings (the clock moves between two answers)."""
    for host in answer["hosts"]:
        host["started_at"] = None
        for client in host["clients"]:
            client["connected_at"] = None
    return answer
