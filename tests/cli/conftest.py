"""A live server with the fake runner for the CLI tests, and ways to run `rlctl` against it.

`rlctl` runs `python -m cli` as a subprocess, as a user or a script would; `rlctl_in` calls
`cli.main.main` in this process (same output and exit code, no interpreter start), for the
second output format of a command already run as a subprocess.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest

from cli.main import main
from tests.support.live_server import LiveServer
from tests.support.rlctl import Result, run_cli

FAKE_RUNNER = "tests.support.fake_runners.runner"

Rlctl = Callable[..., Result]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    var_dir = tmp_path_factory.mktemp("cli") / "var"
    with LiveServer(
        var_dir,
        RLCS_RUNNER_MODULE=FAKE_RUNNER,
        FAKE_RUNNER_STEP_S="0.1",
        FAKE_RUNNER_MODE="steps",
        RLCS_MAX_CONCURRENT_RUNS="4",
        RLCS_STOP_GRACE_S="3",
        RLCS_PRICE_DEVICE_HOUR="3.6",  # a fake step's 0.1 device seconds cost 0.0001
    ) as live:
        yield live


@pytest.fixture
def rlctl(server: LiveServer) -> Rlctl:
    def call(*args: str, **env: str) -> Result:
        return run_cli(server.url, *args, **env)

    return call


@pytest.fixture
def rlctl_in(
    server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Rlctl:
    monkeypatch.setenv("RLCS_URL", server.url)
    monkeypatch.delenv("RLCS_API_TOKEN", raising=False)

    def call(*args: str) -> Result:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return call
