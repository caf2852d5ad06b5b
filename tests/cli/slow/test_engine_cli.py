"""`rlctl engine` against a live server with two engine hosts on the CPU (RLCS_ENGINE_HOSTS=2):
both shown while none runs, then the one an inference on tiny-random started, with its base."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli import OK, ok_json
from tests.cli.test_engine_cli import block, row, section
from tests.support.live_server import LiveServer
from tests.support.rlctl import run_cli


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    var_dir = tmp_path_factory.mktemp("cli-engine") / "var"
    with LiveServer(var_dir, RLCS_DEVICE="cpu", RLCS_ENGINE_HOSTS="2") as live:
        yield live


def test_every_host_then_the_one_an_inference_started(two_hosts: LiveServer) -> None:
    url = two_hosts.url
    node = ok_json(run_cli(url, "--json", "engine"))["node"]
    idle = run_cli(url, "engine")
    assert idle.returncode == OK, idle.stderr
    assert idle.stdout.startswith(f"engine hosts of {node}: 2, 0 running")
    for index in (0, 1):
        lines = section(idle.stdout, f"{node}/{index}")
        assert lines[0] == f"HOST {node}/{index}  cpu  not running (it starts on first need)"
        log = Path(lines[1].split(None, 1)[1])
        assert log.name == "host.log" and log.is_relative_to(two_hosts.var_dir)

    prompt = (
        "What is 2 + 2?",
        "--env",
        "arithmetic",
        "--model",
        "tiny-random",
        "--max-tokens",
        "4",
    )
    answer = run_cli(url, "--json", "infer", *prompt, timeout=300)
    assert ok_json(answer)["model"] == "tiny-random"

    shown = run_cli(url, "engine")
    assert shown.returncode == OK, shown.stderr
    assert shown.stdout.startswith(f"engine hosts of {node}: 2, 1 running")
    (host,) = [
        section(shown.stdout, f"{node}/{i}")
        for i in (0, 1)
        if f"HOST {node}/{i}  cpu  running" in shown.stdout
    ]
    facts = {line.split()[0]: line.split(None, 1)[1] for line in host[1:6]}
    assert facts["pid"].split(",")[0].isdigit()
    assert " resident; budget " in facts["memory"] and "GPU" not in facts["memory"]
    *_, users, state = row(block(host, "BASE MODELS"), "tiny-random")
    assert int(users) >= 1 and state == "loaded"
    assert row(block(host, "CLIENTS"), "inference")[1] == "inference"
