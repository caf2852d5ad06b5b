"""Count the vowels of a word: the task both seats of DuoEnv play, from a taskset without end."""

from collections.abc import Iterator
from itertools import count

import verifiers.v1 as vf

WORDS = ["banana", "kiwi", "apple"]


class DuoData(vf.TaskData):
    answer: int


class DuoTask(vf.Task[DuoData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def right(self, trace: vf.Trace) -> float:
        return 1.0 if str(self.data.answer) in (trace.last_reply or "") else 0.0

    @vf.reward(weight=0.2)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 / (1.0 + len(trace.last_reply or "") / 10.0)  # by characters


class DuoTaskset(vf.Taskset[DuoTask, vf.TasksetConfig]):
    """Without end, as seeded game tasksets are: word after word, round and round."""

    INFINITE = True

    def load(self) -> Iterator[DuoTask]:
        for i in count():
            word = WORDS[i % len(WORDS)]
            answer = sum(c in "aeiou" for c in word)
            yield DuoTask(
                DuoData(idx=i, prompt=f"How many vowels are in '{word}'?", answer=answer),
                self.config.task,
            )
