"""/v1/chat/completions for a run trained on Tinker: the worker samples through the SDK's
sampling client on the run's checkpoint (the loopback stand-in records what it was sent), and
the real `openai` client reads the answer, whole and streamed."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from runners.episodes.render import Renderer
from runners.models.tiny import build_tiny_tokenizer
from server.app import create_app
from tests.hosted_tinker.conftest import TEST_KEY
from tests.support.helpers import finish_run, start_run
from tests.support.settings import make_settings
from tests.support.standins.tinker_standin import TinkerStandin, token_logprob

TOKENIZER = build_tiny_tokenizer()
MARKERS = Renderer(TOKENIZER).stop_token_ids()
ANSWER = "apple pie"
MESSAGES = [
    {"role": "system", "content": "Answer with one word."},
    {"role": "user", "content": "Repeat this word: apple"},
]


def pie_sampler(prompt: list[int], index: int, params) -> list[int]:
    return TOKENIZER.encode(ANSWER, add_special_tokens=False) + [TOKENIZER.eos_token_id]


@pytest.fixture
def standin_pie():
    with TinkerStandin(
        expected_api_key=TEST_KEY, sample_fn=pie_sampler, extra_models=("tiny-random",)
    ) as server:
        yield server


def test_chat_with_a_tinker_run_goes_through_its_sampling_client(
    tmp_path: Path, standin_pie: TinkerStandin
) -> None:
    settings = make_settings(tmp_path, tinker_api_key=TEST_KEY, tinker_base_url=standin_pie.url)
    with TestClient(create_app(settings)) as api:
        run = start_run(
            api,
            environment="repeat_word",
            model_name="tiny-random",
            total_steps=1,
            group_size=2,
            batch_size=1,
            max_token_length=8,
            save_every=1,
            steps_per_eval=0,
            use_wandb=False,
        )
        assert finish_run(api, run)["status"] == "succeeded"
        checkpoint = [
            c for c in api.get(f"/runs/{run}/checkpoints").json() if c["kind"] == "sampler"
        ]
        path = checkpoint[-1]["path"]
        assert path.startswith("tinker://")
        # The openai client over the app's own transport (no socket needed for the server).
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=api)
        answer = client.chat.completions.create(
            model=run,
            messages=MESSAGES,
            max_tokens=16,
            temperature=0.5,
            top_p=0.9,
            seed=7,
            n=2,
            stop=["pie"],
            logprobs=True,
        )
        streamed = list(client.chat.completions.create(model=run, messages=MESSAGES, stream=True))

    session = standin_pie.bodies("create_sampling_session")[-1]
    assert session["model_path"] == path
    sent = standin_pie.bodies("asample")[-2]
    expected = TOKENIZER.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert sent["prompt"]["chunks"][0]["tokens"] == TOKENIZER.encode(
        expected, add_special_tokens=False
    )
    assert sent["num_samples"] == 2
    params = sent["sampling_params"]
    assert params["max_tokens"] == 16 and params["seed"] == 7
    assert params["temperature"] == pytest.approx(0.5) and params["top_p"] == pytest.approx(0.9)
    # One stop list cannot mix strings and ids: with a stop string the markers go as text.
    assert params["stop"] == ["pie"] + [TOKENIZER.decode([m]) for m in MARKERS]
    assert "<|im_end|>" in params["stop"]

    assert len(answer.choices) == 2
    words = TOKENIZER.encode("apple ", add_special_tokens=False)
    for choice in answer.choices:
        assert choice.message.content == "apple " and choice.finish_reason == "stop"
        assert [e.token for e in choice.logprobs.content] == list("apple ")
        assert [e.logprob for e in choice.logprobs.content] == pytest.approx(
            [token_logprob(t) for t in words]
        )
    assert answer.usage.completion_tokens == 2 * (len(ANSWER) + 1)  # the eos token counts

    # No stop string: the whole answer, the end of turn as "stop"; streamed in OpenAI chunks.
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == ANSWER
    assert streamed[-1].choices[0].finish_reason == "stop"
    # Without stop strings, the end-of-turn markers go as token ids.
    assert standin_pie.bodies("asample")[-1]["sampling_params"]["stop"] == MARKERS
