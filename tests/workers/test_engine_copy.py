"""The colocated engine's own bf16 copy of the weights (what a GPU run has: `actor.bf16`
resolves true on CUDA, fp32 master weights, `baton.workers.rollout`), checked on the CPU with
`actor.bf16=true`.

The copy is discarded after each generation so the actor's update has the memory, and is
refilled by the next sync. Calls that no sync follows must still find the trainer's weights:
an agent evaluation (greedy episodes) then the next step's rows, a redraw within a step
(dynamic sampling), an evaluation after the actor moved on without a sync. Regression: the
agent and gateway recipes died at their step after an evaluation ("50 parameters were
discarded by sleep() and not refilled").
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from baton import fields as F
from baton.agents.config import AgentConfig
from baton.agents.envs import multiplication_rows
from baton.batch import Batch, collate


@pytest.fixture(scope="module")
def roles(tmp_path_factory):
    from tests.workers.conftest import colocated_roles

    groups, pool = colocated_roles(tmp_path_factory, "actor.bf16=true")
    host = pool.backend.host
    return groups, host.roles["actor"], host.roles["rollout"]


PROMPTS = Batch(non_tensors={F.PROMPT_TEXT: ["1+2=", "3+4="], "answer": ["3", "7"]})
AGENT = asdict(AgentConfig(max_turns=2, max_tokens=20, turn_max_new_tokens=4))


def copy_matches_policy(rollout) -> bool:
    """The engine's copy holds the trainer's weights, cast to bf16."""
    engine = dict(rollout.engine.model.named_parameters())
    return all(engine[n].dtype == torch.bfloat16 and engine[n].shape == p.shape
               and torch.equal(engine[n], p.detach().to(torch.bfloat16))
               for n, p in rollout.policy.module.named_parameters())


def qkv_back_to_back(rollout) -> bool:
    """The copy is laid out for one Q|K|V matmul a layer (`baton.rollout.embedded.llama.fuse_storage`)."""
    attn = rollout.engine.model.model.layers[0].self_attn
    return attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + attn.q_proj.weight.nbytes > 0


def test_the_bf16_policy_gets_an_engine_copy_of_its_own(roles):
    _, actor, rollout = roles
    assert actor.bf16 and rollout.own_weights and rollout.engine.model is not actor.model
    assert copy_matches_policy(rollout)
    assert qkv_back_to_back(rollout)


def test_the_step_after_an_agent_evaluation_samples(roles):
    """evaluate_episodes (greedy episodes, no sync after it), then the next step's episodes."""
    groups = roles[0]
    rows = groups["rollout"].generate_episodes(collate(multiplication_rows(2, seed=1)), 0, AGENT, True)
    assert len(rows) + sum(rows.meta["agent_stats"]["dropped"].values()) == 2
    rows = groups["rollout"].generate_episodes(collate(multiplication_rows(2, seed=2)), 1, AGENT)
    assert len(rows) + sum(rows.meta["agent_stats"]["dropped"].values()) == 4
    assert all(p.numel() == 0 for p in roles[2].engine.model.parameters())  # freed again for the update


def test_a_redraw_within_a_step_samples(roles):
    """Dynamic sampling draws again before the update: two generations, no sync between."""
    groups = roles[0]
    for _ in range(2):
        assert len(groups["rollout"].generate(PROMPTS, 3)) == 4
    assert groups["rollout"].sync_weights(1, check=True)[0] < 0.1  # bf16 noise (the sync's tolerance)
    assert qkv_back_to_back(roles[2])  # laid out again after the discard


def test_an_evaluation_after_the_actor_moved_reads_the_new_weights(roles):
    """The actor's weights changed and no sync followed (the trajectory-API source syncs its
    servers, not this engine): the evaluation refills the copy, the version label stays."""
    groups, actor, rollout = roles
    label = rollout.engine.version
    with torch.no_grad():
        for p in actor.model.parameters():
            p.mul_(0.5)
    actor.policy.version += 1
    assert not copy_matches_policy(rollout)
    groups["rollout"].evaluate([{"prompt": "1+2=", "answer": "3"}], True)
    assert copy_matches_policy(rollout) and rollout.engine.version == label
