"""Count the vowels of a word: the task both seats of DuoEnv play."""

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
        return 1.0 / (1.0 + len((trace.last_reply or "").split()))


class DuoTaskset(vf.Taskset[DuoTask, vf.TasksetConfig]):
    def load(self) -> list[DuoTask]:
        return [
            DuoTask(
                DuoData(
                    idx=i,
                    prompt=f"How many vowels are in '{w}'?",
                    answer=sum(c in "aeiou" for c in w),
                ),
                self.config.task,
            )
            for i, w in enumerate(WORDS)
        ]
