"""Count the vowels of a word: a v1 taskset of our own, built in memory (verifiers.v1 as 0.3
ships it): a task, its data, a stop after one turn, a reward and a config field."""

import verifiers.v1 as vf

WORDS = ["banana", "kiwi", "apple", "orange"]


class VowelData(vf.TaskData):
    answer: int


class VowelTask(vf.Task[VowelData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def right(self, trace: vf.Trace) -> float:
        return 1.0 if str(self.data.answer) in (trace.last_reply or "") else 0.0

    @vf.reward(weight=0.2)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 / (1.0 + len(trace.last_reply or "") / 10.0)  # by characters


class VowelConfig(vf.TasksetConfig):
    """How many of the words to ask about."""

    words: int = 4


class VowelTaskset(vf.Taskset[VowelTask, VowelConfig]):
    def load(self) -> list[VowelTask]:
        return [
            VowelTask(
                VowelData(
                    idx=i,
                    prompt=f"How many vowels are in '{w}'?",
                    answer=sum(c in "aeiou" for c in w),
                ),
                self.config.task,
            )
            for i, w in enumerate(WORDS[: self.config.words])
        ]
