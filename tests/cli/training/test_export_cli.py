"""`rlctl export` against a live server with a real tiny-random run: the adapter and the merged
model written where asked; a path outside the export folder exits 1 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.helpers import TINY_RUN, finish_run, processes_with, start_run, wait_for
from tests.support.live_server import LiveServer
from tests.support.rlctl import run_cli

OK, SERVER_ERROR = 0, 1


@pytest.fixture
def trained(tmp_path: Path) -> Iterator[tuple[LiveServer, str, Path]]:
    var = tmp_path / "var"
    with LiveServer(var) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        run_id = start_run(http, environment="repeat_word", total_steps=2, save_every=1, **TINY_RUN)
        assert finish_run(http, run_id)["status"] == "succeeded"
        yield live, run_id, var
    wait_for(lambda: not processes_with(var / "runs"), 30)


def test_rlctl_export_writes_the_adapter_and_the_merged_model(
    trained: tuple[LiveServer, str, Path],
) -> None:
    live, run_id, var = trained
    adapter = run_cli(live.url, "--json", "export", run_id, "--step", "1", "--path", "a")
    assert adapter.returncode == OK, adapter.stderr
    answer = json.loads(adapter.stdout)
    assert answer["step"] == 1 and answer["path"] == str(var / "exports" / "a")
    assert (var / "exports" / "a" / "adapter_model.safetensors").is_file()

    merged = run_cli(live.url, "export", run_id, "--merged")
    assert merged.returncode == OK, merged.stderr
    folder = var / "runs" / run_id / "export" / "step-2-merged"
    assert str(folder) in merged.stdout and "hf-merged" in merged.stdout
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()

    again = run_cli(live.url, "export", run_id, "--merged")
    assert again.returncode == SERVER_ERROR and "overwrite" in again.stderr
    assert run_cli(live.url, "export", run_id, "--merged", "--overwrite").returncode == OK

    outside = run_cli(live.url, "export", run_id, "--path", "/etc/rlcs-export")
    assert outside.returncode == SERVER_ERROR and "path:" in outside.stderr
    assert not Path("/etc/rlcs-export").exists()
