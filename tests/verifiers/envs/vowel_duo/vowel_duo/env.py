"""Two seats, one task: each answers on its own and is scored on its own (two traces an
episode), the second after the first."""

import verifiers.v1 as vf


class DuoConfig(vf.EnvConfig):
    first: vf.AgentConfig = vf.AgentConfig()
    second: vf.AgentConfig = vf.AgentConfig()
    rounds: int = 1


class DuoEnv(vf.Env[DuoConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        for _ in range(self.config.rounds):
            await agents.first.run(task)
            await agents.second.run(task)
