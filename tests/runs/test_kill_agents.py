"""Kill anywhere on the agent paths (issue 49): `baton train` with `data.source: agent` (the
guess env's episodes, several turns each, batched through the colocated engine) and
`data.source: gateway` (an agent written with the official `openai` client, served by the
in-process gateway), SIGKILLed and resumed with `trainer.resume=auto`; their ledgers equal an
uninterrupted run's.

    agent     deterministic (seeded turns, one engine call per turn over every parked
              episode, in the episodes' order): every step's metrics line is equal too
    gateway   ledgers only, each step's ids as a set: the agents' requests reach the engine
              over HTTP and are batched by arrival (`InProcessEngine`'s 2 ms window), so
              which requests share an engine call, and so the sampled tokens, depend on
              timing, and a step's groups are in the order their sessions finished (seen:
              5 of 14 steps in another order after 5 kills); the prompts each step trains
              are the sampler's and so must be equal
    *-ahead   the same with trainer.mode=one_step_off: the episodes of step s+1 run in the
              generator (on Ray) while step s trains; the checkpoint holds the admitted rows

All slow: one kill takes 2 min (agent) and 2.5 min (gateway) on 2 busy cores (an
uninterrupted run and the killed run's lives, each a `baton train` process that loads a
model), past the default run's budget; five kills take longer. Kill seeds are printed
(BATON_KILL_SEED=N replays one).
"""

from __future__ import annotations

import pytest
from kill_anywhere import REPO, check_killed

MODEL = str(REPO / "checkpoints/arith-sft")
SMALL = ["data.prompts_per_step=2", "data.eval_size=4", "rollout.n=4", "actor.micro_batch_size=8",
         "actor.mini_batch_size=8", "actor.lr=1e-3", "trainer.progress=false", "trainer.eval_every=0",
         f"model.path={MODEL}", "placement.auto=false", "placement.threads_per_worker=1"]
AGENT = [str(REPO / "recipes/agent_guess.yaml"), *SMALL, "agent.max_turns=3"]
GATEWAY = [str(REPO / "recipes/agent_calculator.yaml"), *SMALL, "data.source=gateway", "agent=null",
           "gateway.agent=tests.agents.openai_agent:solve", "data.task=arithmetic"]

pytest.importorskip("openai")


PATHS = {"agent": (AGENT, True), "gateway": (GATEWAY, False),  # (argv, every step's metrics equal)
         "agent-ahead": ([*AGENT, "trainer.mode=one_step_off"], True),
         "gateway-ahead": ([*GATEWAY, "trainer.mode=one_step_off"], False)}


KILLS = {1: dict(steps=5, save_every=2, span=3), 5: dict(steps=14, save_every=3, span=1)}  # the run for k kills


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("kills", KILLS)
@pytest.mark.parametrize("path", PATHS)
def test_kills(tmp_path, path, kills):
    base, same = PATHS[path]
    check_killed(tmp_path, path, base, kills=kills, same_metrics=same, **KILLS[kills])
