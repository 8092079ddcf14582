"""A multi-turn verifiers (0.4, `verifiers.v1`) environment written as a user would: the sums
of recipes/envs/vf_sums.py, but a wrong answer is told "no" and asked again (up to `TRIES`
answers). The taskset's `Env` subclass drives the turns (`interaction.turn(text)`: the env
speaks, the model answers); the task's own `@vf.reward` (the last answer is right) scores the
episode. recipes/envs/grpo_verifiers_multiturn.yaml trains on it through baton's gateway
(`gateway.agent: baton.envs.verifiers_env:episode`); tests/envs/test_verifiers_env.py runs it."""

from __future__ import annotations

import verifiers.v1 as vf

from recipes.envs.vf_sums import Sums

TRIES = 2  # answers per episode


class RetryConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()  # the one seat: the policy


class RetryEnv(vf.Env[RetryConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as talk:
            segment = await talk.turn()  # the task's prompt opens; the model answers
            for _ in range(TRIES - 1):
                if segment.terminated or segment.last_reply.strip() == task.data.answer:
                    break
                segment = await talk.turn(f"no. {task.data.prompt}")


__all__ = ["Sums", "RetryEnv"]  # verifiers' loaders: the Taskset and the Env subclass
