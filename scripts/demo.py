"""`make demo`: start the server, train SmolLM2 on repeat_word for a few minutes, show it learn.

Talks to the server only over HTTP, as a user would. With --url it uses a server that is
already running instead of starting one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {
    "total_steps": 12,
    "group_size": 4,
    "batch_size": 4,
    "learning_rate": 5e-4,
    "lora_rank": 8,
    "max_token_length": 8,
    "save_every": 0,
    "steps_per_eval": 0,
    "use_wandb": False,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="use this running server instead of starting one")
    parser.add_argument("--model", default=None, help="default: the environment's (SmolLM2)")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        server, url = start_server()
    try:
        return demo(httpx.Client(base_url=url, timeout=120), args.model)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


def demo(http: httpx.Client, model: str | None) -> int:
    say("Selecting the environment 'repeat_word' (reward: character overlap with the word)")
    check(http.post("/environments/repeat_word/select"))
    for field, value in {**SETTINGS, **({"model_name": model} if model else {})}.items():
        check(http.post("/config", json={"field": field, "value": value}))
    config = check(http.get("/config"))["configurable_fields"]
    say(
        f"Model {config['model_name']}, {config['total_steps']} steps of "
        f"{config['batch_size']} words x {config['group_size']} tries, LoRA rank "
        f"{config['lora_rank']}, learning rate {config['learning_rate']}"
    )
    run = check(http.post("/runs", json={}))
    run_id = run["run_id"]
    say(f"Started run {run_id}; following its log (the first start converts SmolLM2 once)")
    end = follow(http, run_id)
    results = check(http.get(f"/runs/{run_id}/metrics"))
    rewards = [row["reward/mean"] for row in results["history"] if "reward/mean" in row]
    say(f"Run {run_id} ended {end['status']}.")
    if rewards:
        say(f"Mean reward: first step {rewards[0]:.3f} -> last step {rewards[-1]:.3f}")
    say(f"Trained LoRA weights: {results['weights_path']}")
    if end["status"] != "succeeded":
        say(f"Details: {end.get('details')}")
        return 1
    answer = check(
        http.post(
            "/test/inference",
            json={
                "run_id": run_id,
                "prompts": ["Repeat this word: river", "Repeat this word: maple"],
                "max_tokens": 8,
                "temperature": 0.0,
            },
        )
    )
    for result in answer["results"]:
        say(f"  {result['prompt']!r} -> {result['response']!r} (score {result['score']:.2f})")
    return 0


def follow(http: httpx.Client, run_id: str) -> dict:
    """Print the run's step lines as they come; return the final event."""
    params = {"follow": "true", "tail": 0}
    with http.stream("GET", f"/runs/{run_id}/logs", params=params, timeout=None) as stream:
        kind = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
                if kind == "end":
                    return json.loads(data)
                if data.startswith(("step ", "checkpoint ", "run ")) or "ERROR" in data:
                    print(f"    {data}", flush=True)
    raise SystemExit("the log stream ended without a final event")


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    var = ROOT / "var" / "demo"
    var.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "RLCS_HOST": "127.0.0.1",
        "RLCS_PORT": str(port),
        "RLCS_VAR_DIR": str(var),
        "RLCS_MODELS_DIR": str(ROOT / "var" / "models"),  # shared with `make serve`
    }
    env.pop("TINKER_API_KEY", None)  # the demo shows the local backend
    log = (var / "server.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "server"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                say(f"Server up at {url} (data in {var})")
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start; see {var / 'server.log'}")


def check(resp: httpx.Response) -> dict:
    if resp.status_code != 200:
        raise SystemExit(
            f"{resp.request.method} {resp.request.url.path}: HTTP {resp.status_code}: {resp.text}"
        )
    return resp.json()


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
