"""Multi-turn groups through `baton api`: an AgentEnvironment (what `baton env --env
baton.agents.api_env:agent_environment` runs) collects calculator episodes from a real model
behind `baton serve` (RemoteEngine over HTTP, as in `baton env`), pushes them over HTTP to a real trajectory API, and the trainer's rows have the observation
holes, the per-turn rewards (from the per-sequence `overrides`, which an Atropos client
ignores) and logprobs that the trainer recomputes exactly."""

from pathlib import Path

import torch

from baton import fields as F
from baton.agents.api_env import AgentEnvironment
from baton.models.load import load_model, load_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.remote import RemoteEngine
from baton.rollout.server import ServerThread, build_app
from baton.services.api import build_api_app
from baton.services.client import APIClient
from baton.services.groups import groups_to_batch
from baton.workers.sequences import response_logprobs

MODEL = str(Path(__file__).resolve().parents[2] / "checkpoints/calc-sft")  # stage 1: always calls the tool


def test_multi_turn_groups_through_the_api(tmp_path):
    model, tok = load_model(MODEL).eval(), load_tokenizer(MODEL)
    env = AgentEnvironment(tok, group_size=2, temperature=1.0)
    env.setup()
    with ServerThread(build_app(EmbeddedEngine(model, tok), tok, "m")) as serve:
        group = env.collect(env.next_item(), RemoteEngine(serve.url))
    assert all(len(o["turn_ends"]) >= 2 for o in group.overrides)  # called the tool, then answered
    with ServerThread(build_api_app(str(tmp_path / "api.sqlite"))) as srv:
        trainer, envc = APIClient(srv.url, name="trainer"), APIClient(srv.url, name="env")
        trainer.register(batch_size=2, max_token_len=512)
        trainer.batch()  # the trainer has started
        env_id = envc.register_env(name="calc", group_size=2, max_token_length=512)["env_id"]
        envc.push(group.to_scored_data(env_id))
        got = trainer.batch()["batch"]
    rows = groups_to_batch(got, tok, tok.pad_token_id, 2)
    mask = rows[F.RESPONSE_MASK].bool()
    assert (~mask[:, :-1] & mask[:, 1:]).any(1).all()  # a policy turn after the tool's answer
    assert torch.allclose(rows[F.TOKEN_REWARDS].sum(1), rows[F.REWARDS])
    ends = mask & ~torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1)
    assert (rows[F.TOKEN_REWARDS][~ends] == 0).all()
    with torch.no_grad():
        lp = response_logprobs(model, rows)[0]
    assert (lp.double() - rows[F.ROLLOUT_LOGPROBS].double())[mask].abs().max() < 1e-4
