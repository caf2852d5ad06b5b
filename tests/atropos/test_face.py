"""The inference face an Atropos environment samples from (runners.doors.face), serving the
real tiny-random model on the local backend: SGLang's /generate as atroposlib's SGLangServer
sends it, and /v1 through the real openai client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from runners.doors.face import InferenceFace, serving
from runners.doors.requests import BadRequest, SamplingDefaults, sampling_from, stop_param
from runners.engine.local import LocalServiceClient
from runners.models.tiny import build_tiny_tokenizer
from tests.support.scripted_sampler import HERMES_TEMPLATE, Scripted

END = 256  # tiny-random's <|im_end|>


@pytest.fixture(scope="module")
def sampler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("face")
    service = LocalServiceClient(
        checkpoint_dir=folder / "checkpoints", models_dir=folder / "models", device="cpu"
    )
    yield service.create_sampling_client(base_model="tiny-random").result(timeout=120)
    service.close()


def make_face(sampler: Any, context: int | None = 2048) -> InferenceFace:
    face = InferenceFace(
        build_tiny_tokenizer(), SamplingDefaults(max_tokens=6), context, [END], "tiny-random"
    )
    face.set_sampler(sampler)
    return face


def test_stop_strings_or_ids_become_one_backend_stop() -> None:
    assert stop_param(None, None, [END]) == [END]
    assert stop_param([7], None, [END]) == [7, END]  # an environment's [eos_token_id] style
    assert stop_param("</answer>", [9], [END]) == ["</answer>"]  # strings win a mix
    assert stop_param(["a", "b"], None, [END]) == ["a", "b"]
    with pytest.raises(BadRequest):
        stop_param({"x": 1}, None, [END])


def test_generate_as_sglang_answers_with_logprobs_and_the_real_finish_reason(
    sampler: Any,
) -> None:
    face = make_face(sampler)

    async def scenario() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        async with serving(face) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
            auth = {"Authorization": f"Bearer {face.key}"}
            prompt = list(b"Hello there")
            # What SGLangServer sends: token ids as given, n, max_new_tokens, stop ids.
            body = {
                "input_ids": prompt,
                "sampling_params": {"n": 3, "max_new_tokens": 5, "temperature": 1.0},
                "return_logprob": True,
                "return_text_in_logprobs": False,
            }
            many = await client.post("/generate", json=body, headers=auth)
            body["sampling_params"] = {"n": 1, "max_new_tokens": 64, "temperature": 0.0}
            one = await client.post("/generate", json=body, headers=auth)
            refused = await client.post("/generate", json=body)
            health = await client.get("/health")
            assert health.json()["status"] == "ok"
            return [many, one], refused, await client.post("/generate", json={}, headers=auth)

    (many, one), refused, empty = asyncio.run(scenario())
    assert refused.status_code == 401 and face.stats.refused == 2
    assert empty.status_code == 400 and "input_ids" in empty.json()["error"]
    samples = many.json()
    assert isinstance(samples, list) and len(samples) == 3
    for sample in samples:
        info = sample["meta_info"]
        assert len(info["output_token_logprobs"]) == info["completion_tokens"] <= 5
        assert all(lp <= 0 and isinstance(t, int) for lp, t, _ in info["output_token_logprobs"])
        assert info["prompt_tokens"] == len(b"Hello there")
        last = info["output_token_logprobs"][-1][1]
        if last == END:  # the end of its turn (the 5th token may be it)
            assert info["finish_reason"] == {"type": "stop", "matched": END}
        else:
            assert info["finish_reason"] == {"type": "length", "length": 5}
            assert info["completion_tokens"] == 5
    single = one.json()
    assert isinstance(single, dict)  # n == 1: one object, as SGLang answers
    reason = single["meta_info"]["finish_reason"]
    tokens = [t for _, t, _ in single["meta_info"]["output_token_logprobs"]]
    assert (reason["type"] == "stop") == (tokens[-1] == END)
    assert face.stats.sequences == 4


def test_max_tokens_is_clamped_to_what_the_context_leaves(sampler: Any) -> None:
    face = make_face(sampler, context=16)

    async def scenario() -> tuple[dict[str, Any], int]:
        async with serving(face) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
            auth = {"Authorization": f"Bearer {face.key}"}
            params = {"max_new_tokens": 100, "temperature": 1.0, "stop": []}
            fits = await client.post(
                "/generate", json={"input_ids": [65] * 12, "sampling_params": params}, headers=auth
            )
            full = await client.post(
                "/generate", json={"input_ids": [65] * 16, "sampling_params": params}, headers=auth
            )
            return fits.json(), full.status_code

    fits, full = asyncio.run(scenario())
    assert fits["meta_info"]["completion_tokens"] <= 4
    assert full == 400


def test_chat_and_completions_through_the_openai_client(sampler: Any) -> None:
    face = make_face(sampler)

    async def scenario() -> tuple[Any, Any]:
        async with serving(face) as url:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=face.key)
            chat = await client.chat.completions.create(
                model="anything",
                messages=[{"role": "user", "content": "Name a colour."}],
                n=2,
                max_tokens=4,
                temperature=1.0,
                logprobs=True,
                extra_body={"reasoning": {"enabled": False}},  # unknown: ignored
            )
            text = await client.completions.create(
                model="anything", prompt="Count: 1 2", n=2, max_tokens=3, stop=["9"]
            )
            await client.close()
            return chat, text

    chat, text = asyncio.run(scenario())
    assert len(chat.choices) == 2
    for choice in chat.choices:
        assert choice.finish_reason in ("stop", "length")
        assert choice.message.role == "assistant"
        assert len(choice.logprobs.content) >= 1
    assert chat.usage.prompt_tokens > len("Name a colour.")  # the chat template around it
    assert len(text.choices) == 2 and all(
        c.finish_reason in ("stop", "length") for c in text.choices
    )


def test_requests_wait_while_the_local_backend_trains(sampler: Any) -> None:
    face = make_face(sampler)

    async def scenario() -> tuple[bool, int]:
        async with serving(face) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
            auth = {"Authorization": f"Bearer {face.key}"}
            body = {"input_ids": [72, 105], "sampling_params": {"max_new_tokens": 2}}
            with face.paused():
                waiting = asyncio.create_task(client.post("/generate", json=body, headers=auth))
                await asyncio.sleep(0.3)
                held = not waiting.done()
            answer = await waiting
            return held, answer.status_code

    held, status = asyncio.run(scenario())
    assert held and status == 200


def test_nothing_is_served_before_a_policy_is_loaded(tmp_path: Path) -> None:
    face = InferenceFace(build_tiny_tokenizer(), SamplingDefaults(max_tokens=4), 2048, [END], "m")

    async def scenario() -> httpx.Response:
        async with serving(face) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
            auth = {"Authorization": f"Bearer {face.key}"}
            return await client.post("/generate", json={"input_ids": [1, 2]}, headers=auth)

    answer = asyncio.run(scenario())
    assert answer.status_code == 400 and "not loaded" in answer.json()["error"]


def test_the_face_remembers_which_policy_served_each_completion(sampler: Any) -> None:
    """How an Atropos run knows how far off policy a group is (runners/atropos/trainer.py)."""
    face = make_face(sampler)
    sampling = sampling_from(
        {"n": 2, "max_tokens": 4}, face.defaults, [END], 2, 2048, "max_tokens", 8
    )

    async def scenario() -> tuple[list[Any], list[Any]]:
        face.set_sampler(sampler, 3)  # the policy after 3 optimizer steps
        first = await face.sample(list(b"Hi"), sampling)
        face.set_sampler(sampler, 4)
        second = await face.sample(list(b"Hello"), sampling)
        return first, second

    first, second = asyncio.run(scenario())
    assert {face.policy_of(list(s.tokens)) for s in first} <= {3, 4}  # 4: served again since
    assert all(face.policy_of(list(s.tokens)) == 4 for s in second)
    assert face.policy_of([1, 2, 3, 999]) is None  # never served


def test_the_face_speaks_vllms_token_ids_as_verifiers_trainers_read_them(sampler: Any) -> None:
    """v0: chat completions with return_token_ids; v1: /inference/v1/generate; /v1/models
    with max_model_len."""
    face = make_face(sampler, context=2048)

    async def scenario() -> tuple[Any, dict[str, Any], dict[str, Any], int]:
        async with serving(face) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
            openai_client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=face.key)
            chat = await openai_client.chat.completions.create(
                model="tiny-random",
                messages=[{"role": "user", "content": "Name a colour."}],
                max_completion_tokens=5,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
            await openai_client.close()
            auth = {"Authorization": f"Bearer {face.key}"}
            generated = await client.post(
                "/inference/v1/generate",
                headers=auth,
                json={
                    "model": "tiny-random",
                    "token_ids": [5, 6, 7],
                    "sampling_params": {
                        "max_tokens": 4,
                        "temperature": 1.0,
                        "stop_token_ids": [9],
                        "logprobs": 1,
                        "skip_special_tokens": False,
                    },
                },
            )
            models = await client.get("/v1/models", headers=auth)
            refused = await client.post("/inference/v1/generate", json={"token_ids": [1]})
            return chat, generated.json(), models.json(), refused.status_code

    chat, generated, models, refused = asyncio.run(scenario())
    extra = chat.model_extra or {}
    prompt_ids = extra["prompt_token_ids"]
    assert len(prompt_ids) == chat.usage.prompt_tokens
    (choice,) = chat.choices
    ids = (choice.model_extra or {})["token_ids"]
    assert 1 <= len(ids) <= 5 and len(choice.logprobs.content) == len(ids)
    (made,) = generated["choices"]
    assert generated["prompt_token_ids"] == [5, 6, 7]
    assert 1 <= len(made["token_ids"]) <= 4
    assert [e["token"] for e in made["logprobs"]["content"]] == [
        f"token_id:{t}" for t in made["token_ids"]
    ]
    assert all(e["logprob"] <= 0 for e in made["logprobs"]["content"])
    assert made["finish_reason"] in ("stop", "length")
    assert models["data"][0]["max_model_len"] == 2048
    assert refused == 401


def test_tools_are_shown_and_calls_parsed_where_the_template_has_a_tool_format() -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = HERMES_TEMPLATE
    said = 'Let me look. <tool_call>{"name": "lookup", "arguments": {"word": "cat"}}</tool_call>'
    sampler = Scripted(tokenizer, said)
    face = InferenceFace(tokenizer, SamplingDefaults(max_tokens=64), None, [END], "hermes-like")
    face.set_sampler(sampler)
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    earlier_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"word": "dog"}'},
    }
    body = {
        "messages": [
            {"role": "user", "content": "Look up cat."},
            {"role": "assistant", "content": "", "tool_calls": [earlier_call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a dog barks"},
        ],
        "tools": [tool],
    }
    answer = asyncio.run(face.chat(body))
    shown = sampler.prompts[-1]
    assert '"name": "lookup"' in shown and "<tools>" in shown  # the tools, in its template
    assert '"arguments": {"word": "dog"}' in shown  # the earlier call's arguments as an object
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "lookup", "arguments": '{"word": "cat"}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert face.stats.take()["atropos/face_tools_unsupported"] == 0


def test_a_model_without_a_tool_format_answers_text_and_is_counted() -> None:
    tokenizer = build_tiny_tokenizer()  # its template knows no tools
    said = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
    face = InferenceFace(tokenizer, SamplingDefaults(max_tokens=64), None, [END], "tiny-random")
    face.set_sampler(Scripted(tokenizer, said))
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function"}]}
    (choice,) = asyncio.run(face.chat(body))["choices"]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == said  # its text, as written
    assert face.stats.take()["atropos/face_tools_unsupported"] == 1
