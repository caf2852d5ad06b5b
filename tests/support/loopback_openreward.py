"""A small real OpenReward environment, served by the SDK's own Server on 127.0.0.1 in a thread."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from openreward.environments import Environment, Server, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel

from tests.support.live_server import free_port

MAX_NUMBER = 16
MAX_GUESSES = 6


class GuessParams(BaseModel):
    guess: int


class GuessEnv(Environment):
    """Find a number from 1 to 16 with higher/lower hints; one tool, `guess`."""

    def __init__(self, task_spec: dict | None = None, secrets: dict | None = None) -> None:
        super().__init__(task_spec or {})
        self.target = int((task_spec or {})["target"])
        self.guesses = 0

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        rng = random.Random(split)
        return [{"target": rng.randint(1, MAX_NUMBER)} for _ in range(5)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"Find the hidden number from 1 to {MAX_NUMBER} with `guess`.")]

    @tool
    async def guess(self, params: GuessParams) -> ToolOutput:
        """Guess the number; the answer says higher, lower or correct."""
        self.guesses += 1
        if params.guess == self.target:
            return ToolOutput(blocks=[TextBlock(text="Correct!")], reward=1.0, finished=True)
        hint = "higher" if self.target > params.guess else "lower"
        text = f"The number is {hint} than {params.guess}."
        return ToolOutput(
            blocks=[TextBlock(text=text)], reward=0.0, finished=self.guesses >= MAX_GUESSES
        )


class AnswerParams(BaseModel):
    answer: str


class QuizEnv(Environment):
    """One question; a `hint` tool, and the model's plain reply is its answer (terminal tool)."""

    def __init__(self, task_spec: dict | None = None, secrets: dict | None = None) -> None:
        super().__init__(task_spec or {})
        self.solution = str((task_spec or {})["solution"])

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"question": "What is 6 times 7?", "solution": "42"}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="What is 6 times 7? Reply with the number only.")]

    @tool
    async def hint(self) -> ToolOutput:
        """A hint about the question."""
        return ToolOutput(blocks=[TextBlock(text="It is between 40 and 45.")], reward=0.0)

    @terminal
    @tool
    async def answer(self, params: AnswerParams) -> ToolOutput:
        """The final answer."""
        correct = params.answer.strip() == self.solution
        return ToolOutput(
            blocks=[TextBlock(text="Correct" if correct else "Wrong")],
            reward=1.0 if correct else 0.0,
            finished=True,
        )


@contextmanager
def serve(env_classes: list[type[Environment]] | None = None) -> Iterator[str]:
    """Serve the environments on a free loopback port; yields the base URL; stops on exit."""
    port = free_port()
    app = Server(env_classes or [GuessEnv, QuizEnv]).app
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the loopback OpenReward server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
