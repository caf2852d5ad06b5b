"""The OpenAI-compatible endpoint through the real `openai` client against a live server: a
short tiny-random run's checkpoints listed and chatted with (n, logprobs, a step, stop
strings, a stream, vLLM's token ids), vLLM's token-in `/inference/v1/generate`, bad input in
OpenAI's error shape, and the bearer token as api_key."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from core.model_names import TINY_RANDOM_CONTEXT
from tests.support.helpers import SAVING_TINY_RUN, finish_run, run_of, start_run, wait_for
from tests.support.live_server import LiveServer

TOKEN = "openai-compat-test-token-0123456789"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
HI = [{"role": "user", "content": "Repeat this word: apple"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    var: Path = tmp_path_factory.mktemp("openai") / "var"
    env = {"RLCS_API_TOKEN": TOKEN, "RLCS_MAX_CONCURRENT_RUNS": "1"}
    with LiveServer(var, **env) as live:
        yield live


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def runs(api: httpx.Client) -> dict[str, str]:
    """A trained run (sampler checkpoints at steps 1 and 2) and one stopped while queued
    behind it (no checkpoint at all)."""
    trained = start_run(api, **SAVING_TINY_RUN)
    wait_for(lambda: run_of(api, trained)["status"] == "running", 60)
    queued = start_run(api, **SAVING_TINY_RUN)
    stopped = api.post(f"/runs/{queued}/stop")
    assert stopped.status_code == 200 and stopped.json()["status"] == "stopped", stopped.text
    assert finish_run(api, trained)["status"] == "succeeded"
    steps = [(c["step"], c["kind"]) for c in api.get(f"/runs/{trained}/checkpoints").json()]
    assert (1, "sampler") in steps and (2, "sampler") in steps
    assert api.get(f"/runs/{queued}/checkpoints").json() == []
    return {"trained": trained, "empty": queued}


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, timeout=120) as c:
        yield c


def test_models_lists_the_base_model_and_each_checkpoint(client, runs) -> None:
    run = runs["trained"]
    models = {m.id: m for m in client.models.list().data}
    assert {"tiny-random", run, f"{run}@step-1", f"{run}@step-2"} <= set(models)
    assert runs["empty"] not in models  # nothing to sample yet
    assert models[run].object == "model" and models[run].owned_by == "rlcs"
    assert models[run].created > 0
    extra = {"root": "tiny-random", "parent": run, "max_model_len": TINY_RANDOM_CONTEXT}
    assert models[f"{run}@step-1"].model_extra == extra


def test_completion_with_n_and_logprobs(client, runs) -> None:
    run = runs["trained"]
    answer = client.chat.completions.create(
        model=run, messages=HI, max_tokens=6, n=2, logprobs=True, seed=3
    )
    assert answer.object == "chat.completion" and answer.model == run
    assert answer.id.startswith("chatcmpl-")
    assert [c.index for c in answer.choices] == [0, 1]
    for choice in answer.choices:
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length")
        entries = choice.logprobs.content
        assert 1 <= len(entries) <= 6
        assert all(e.logprob <= 0 and e.top_logprobs == [] for e in entries)
    assert answer.usage.completion_tokens <= 12
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert answer.usage.prompt_tokens > len("Repeat this word: apple")  # the chat template's


def test_a_step_checkpoint_and_a_missing_step(client, runs) -> None:
    run = runs["trained"]
    answer = client.chat.completions.create(model=f"{run}@step-1", messages=HI, max_tokens=4)
    assert answer.model == f"{run}@step-1" and answer.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model=f"{run}@step-9", messages=HI, max_tokens=4)
    assert "no checkpoint at step 9" in caught.value.message and "1, 2" in caught.value.message
    assert caught.value.code == "model_not_found"


def test_seeded_text_the_stream_and_a_stop_string_agree(client, runs) -> None:
    run = runs["trained"]
    # A seed whose completion runs to max_tokens (a random model may end its turn early).
    for seed in range(20):
        settings = dict(model=run, messages=HI, max_tokens=32, temperature=1.0, seed=seed)
        whole = client.chat.completions.create(**settings)
        if whole.choices[0].finish_reason == "length":
            break
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 32
    assert client.chat.completions.create(**settings).choices[0].message.content == text

    chunks = list(
        client.chat.completions.create(
            **settings, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta]
    content = [p for p in pieces if p]
    assert "".join(content) == text
    assert len(content) > 1  # sent as decoded, not in one piece at the end
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 32

    # A stop string cuts the text where it first occurs, whole or streamed.
    stop = next(ch for ch in text[1:] if ch != "\ufffd")  # not a byte of a split character
    cut = text.index(stop)
    stopped = client.chat.completions.create(**settings, stop=[stop, "never-seen-stop"])
    assert stopped.choices[0].message.content == text[:cut]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(**settings, stop=stop, stream=True)
    events = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in events) == text[:cut]
    assert events[-1].choices[0].finish_reason == "stop"


def test_min_tokens_and_ignore_eos_decode_exact_lengths(client, runs) -> None:
    """vLLM's options, as benchmarks send them: every choice decodes its whole limit, and the
    usage counts what was decoded."""
    for model in ("tiny-random", runs["trained"]):
        answer = client.chat.completions.create(
            model=model,
            messages=HI,
            max_tokens=12,
            n=3,
            seed=5,
            extra_body={"min_tokens": 12, "ignore_eos": True},
        )
        assert [c.finish_reason for c in answer.choices] == ["length"] * 3
        assert answer.usage.completion_tokens == 36
    # min_tokens alone: no choice ends before it (the end of turn cannot be drawn).
    held = client.chat.completions.create(
        model="tiny-random", messages=HI, max_tokens=10, n=4, seed=1, extra_body={"min_tokens": 7}
    )
    assert held.usage.completion_tokens >= 4 * 7
    assert all(c.finish_reason in ("stop", "length") for c in held.choices)


def test_a_stream_whose_client_leaves_frees_the_worker(client, api: httpx.Client) -> None:
    """SmolLM2 on the CPU tells a long story slowly enough to leave in the middle of it (with
    ignore_eos, so that the story cannot end on its own first)."""
    story = [{"role": "user", "content": "Tell me a very long story about a river."}]
    stream = client.chat.completions.create(
        model=SMOLLM2,
        messages=story,
        max_tokens=4000,
        temperature=0.7,
        seed=1,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = iter(stream)
    wait_for(lambda: next(pieces).choices[0].delta.content, 120)  # the story is under way
    stream.close()
    left = time.monotonic()
    # The server tells the engine host while the story is still being decoded (the host logs
    # a cancel only for the request in progress), so the next request does not wait for it.
    (host,) = api.get("/engine").json()["hosts"]
    log = Path(host["log"])
    wait_for(lambda: "cancelled" in log.read_text())
    answer = client.chat.completions.create(model=SMOLLM2, messages=story, max_tokens=2)
    assert answer.choices[0].message.content
    assert time.monotonic() - left < 20  # the request's budget is 24 s


def test_a_request_is_answered_while_another_is_still_decoding(client, runs) -> None:
    """Requests do not queue behind each other: a short one sent while a long stream is under
    way joins the worker's decode batch and is answered before the stream ends (one at a
    time, it would start only after)."""
    long = client.chat.completions.create(
        model="tiny-random",
        messages=HI,
        max_tokens=1500,
        seed=2,
        stream=True,
        extra_body={"min_tokens": 1500, "ignore_eos": True},
    )
    pieces = iter(long)
    wait_for(lambda: next(pieces).choices[0].delta.content, 60)  # the stream is under way
    ended = threading.Event()
    reasons: list[str | None] = []

    def read_to_the_end() -> None:
        reasons.extend(p.choices[0].finish_reason for p in pieces if p.choices)
        ended.set()

    reader = threading.Thread(target=read_to_the_end)
    reader.start()
    short = client.chat.completions.create(model="tiny-random", messages=HI, max_tokens=3)
    still_decoding = not ended.is_set()
    reader.join(120)
    assert short.choices[0].message.content is not None
    assert still_decoding
    assert reasons[-1] == "length"


def test_token_ids_back_from_chat_and_the_same_tokens_from_generate(client, runs, api) -> None:
    """vLLM's return_token_ids (what verifiers' v0 trainers read): the prompt's ids and each
    choice's, a logprob for every id; the same prompt ids and seed through vLLM's generate
    (what its v1 trainers send) sample the same tokens with the same logprobs."""
    run = runs["trained"]
    chat = client.chat.completions.create(
        model=run,
        messages=HI,
        max_completion_tokens=6,
        n=2,
        logprobs=True,
        seed=11,
        extra_body={"return_token_ids": True},
    )
    prompt_ids = chat.model_extra["prompt_token_ids"]
    assert len(prompt_ids) == chat.usage.prompt_tokens
    ids = [choice.model_extra["token_ids"] for choice in chat.choices]
    assert sum(len(i) for i in ids) == chat.usage.completion_tokens
    for choice, tokens in zip(chat.choices, ids, strict=True):
        assert 1 <= len(tokens) <= 6 and len(choice.logprobs.content) == len(tokens)

    body = {
        "model": run,
        "token_ids": prompt_ids,
        "sampling_params": {
            "temperature": 1.0,
            "max_tokens": 6,
            "n": 2,
            "seed": 11,
            "logprobs": 1,
            "skip_special_tokens": False,
            "stop_token_ids": [],
        },
    }
    answer = api.post("/inference/v1/generate", json=body)
    assert answer.status_code == 200, answer.text
    generated = answer.json()
    assert generated["prompt_token_ids"] == prompt_ids
    assert [c["token_ids"] for c in generated["choices"]] == ids
    for choice, chatted in zip(generated["choices"], chat.choices, strict=True):
        entries = choice["logprobs"]["content"]
        assert [e["token"] for e in entries] == [f"token_id:{t}" for t in choice["token_ids"]]
        expected = [e.logprob for e in chatted.logprobs.content]
        assert [e["logprob"] for e in entries] == pytest.approx(expected, abs=1e-5)
        assert choice["finish_reason"] == chatted.finish_reason

    plain = client.chat.completions.create(model=run, messages=HI, max_tokens=2)
    assert plain.model_extra.get("prompt_token_ids") is None  # only when asked


def test_bad_input_to_generate_names_the_field(api) -> None:
    good = {"model": "tiny-random", "token_ids": [1, 2, 3]}
    assert api.post("/inference/v1/generate", json=good).status_code == 200
    for bad, param in (
        ({"token_ids": [1, 10**9]}, "token_ids"),  # past the vocabulary: the sampler's check
        ({"token_ids": [-1]}, "token_ids"),
        ({"token_ids": []}, "token_ids"),
        ({"sampling_params": {"logprobs": 5}}, "logprobs"),
        ({"sampling_params": {"min_p": 0.1}}, "min_p"),
        ({"sampling_params": {"best_of": 2}}, "best_of"),
        ({"sampling_params": {"max_tokens": 4, "min_tokens": 5}}, "sampling_params.min_tokens"),
    ):
        answer = api.post("/inference/v1/generate", json={**good, **bad})
        assert answer.status_code == 400, answer.text
        assert param in answer.json()["error"]["message"], answer.text
    missing = api.post("/inference/v1/generate", json={**good, "model": "gpt-4o"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    streamed = api.post(
        "/v1/chat/completions",
        json={"model": "tiny-random", "messages": HI, "stream": True, "return_token_ids": True},
    )
    assert streamed.status_code == 400 and "leave out stream" in streamed.text


def test_bad_input_in_openai_error_shape(client, runs, server: LiveServer) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    error = caught.value
    assert "'gpt-4o'" in error.message and "/v1/models" in error.message
    assert error.code == "model_not_found" and error.param == "model"
    assert error.type == "invalid_request_error"

    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model=runs["empty"], messages=HI)
    assert "no sampler checkpoint" in caught.value.message

    for bad, param in (
        ({"n": 9}, "n"),
        ({"temperature": 5}, "temperature"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"extra_body": {"min_tokens": -1}}, "min_tokens"),
        ({"extra_body": {"min_tokens": 9}, "max_tokens": 8}, "min_tokens"),
        ({"extra_body": {"ignore_eos": "sometimes"}}, "ignore_eos"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="tiny-random", messages=HI, **bad)
        assert caught.value.status_code == 400
        assert param in caught.value.message, caught.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny-random", messages=[])

    # A body that is not even JSON text: still OpenAI's shape, naming the cause.
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for body in (b"\x80{}", b"[" * 100_000, b"not json"):
        raw = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers=auth)
        assert raw.status_code == 400, raw.text
        assert "not valid JSON" in raw.json()["error"]["message"], raw.text

    # The rest of the API keeps its own error shape.
    plain = httpx.get(f"{server.url}/runs/r-00000000", headers={"Authorization": f"Bearer {TOKEN}"})
    assert plain.status_code == 404 and "detail" in plain.json()


def test_the_token_is_the_api_key(server: LiveServer) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as caught:
            wrong.models.list()
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="tiny-random", messages=HI)
    assert caught.value.body["type"] == "authentication_error"
    assert "RLCS_API_TOKEN" in caught.value.message
