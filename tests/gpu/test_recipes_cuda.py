"""Every recipe on one GPU (marked `gpu`: skipped without CUDA; scripts/gpu_check.sh runs them).

Each row trains 2 steps through `baton train` (the command users type) with every role on
the GPU (`placement.gpus_per_worker=1`, the local backend: the GPU test machine has no Ray,
scripts/gpu_check.sh's header), then checks
  * devices: every role's module has its parameters on cuda (recorded as the host builds it);
  * finite metrics, `rollout/logprob_mismatch_kl` logged and small (bf16 engine vs bf16
    trainer), the update's peak memory (`memory/peak_gib_update`) reported;
  * a checkpoint round trip: resumed from step 2 to step 3 on the GPU, and a GPU checkpoint
    resumed on the CPU.
Not here: one_step_off / async and data parallel (they need Ray), vLLM (not on that machine).
Written without a GPU at hand (the CI machine has none): first run on an H200 is owed.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from baton.cli import main
from baton.metrics import read_metrics
from baton.runs.checkpoints import list_checkpoints

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
AGENTS = REPO / "tests" / "agents"  # openai_agent.py: the gateway's agent
GPU = ["placement.auto=false", "placement.backend=local", "placement.world_size=1", "placement.gpus_per_worker=1"]
RL = ["data.prompts_per_step=4", "rollout.n=4", "data.eval_size=4", "actor.mini_batch_size=0",
      "actor.micro_batch_size=16", "trainer.progress=false", *GPU]
PPO = [*RL, "critic.mini_batch_size=0", "critic.micro_batch_size=16", "critic.pretrain_steps=1"]
DPO = ["data.prompts_per_step=4", "rollout.n=2", "data.eval_size=4", "actor.micro_batch_size=8",
       "trainer.progress=false", *GPU]
OFFLINE_DPO = ["data.path=tests/fixtures/pairs.jsonl", "data.pairs_per_step=4", "data.eval_size=2",
               "actor.micro_batch_size=8", "trainer.progress=false", *GPU]
IN_PROCESS = ["trainer.device=cuda"]
SFT = ["data.num_examples=32", "trainer.batch_size=8", "data.eval_size=4", *IN_PROCESS]
RM = ["data.num_pairs=32", "trainer.batch_size=8", *IN_PROCESS]
LORA = ["model.lora.rank=8", "model.lora.alpha=16", "actor.lr=1e-3"]
GATEWAY = ["data.source=gateway", "gateway.agent=openai_agent:solve", "agent=null", "data.task=arithmetic",
           "model.path=checkpoints/arith-sft", *RL]

ROWS = [  # (id, recipe, overrides)
    ("grpo", "grpo_arithmetic", RL),
    ("grpo-kl-reference", "grpo_arithmetic", [*RL, "algo.kl_coef=0.01"]),
    ("grpo-lora", "grpo_arithmetic", [*RL, *LORA]),
    ("ppo-critic", "ppo_arithmetic", PPO),
    ("online-dpo", "online_dpo_arithmetic", DPO),
    ("offline-dpo", "offline_dpo_arithmetic", OFFLINE_DPO),
    ("sft", "sft_arithmetic", SFT),
    ("rm", "rm_arithmetic", RM),
    ("agent-calculator", "agent_calculator", [*RL, "agent.max_turns=2"]),
    ("agent-gateway", "agent_calculator", GATEWAY),
]
MISMATCH_KL_MAX = 0.05  # bf16 engine vs bf16 trainer on a tiny model: noise, far below this


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(AGENTS))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def devices(monkeypatch) -> dict[str, set[str]]:
    """{role: device types of its module's parameters}, recorded as each role is built (and
    for SFT / RM, whose model is placed by `baton.trainers.session.in_process.place`)."""
    from baton.controller.worker import HostCore
    from baton.trainers.session import in_process

    seen: dict[str, set[str]] = {}
    create, place = HostCore.create, in_process.place

    def recording_create(self, role, cls, args, kwargs):
        out = create(self, role, cls, args, kwargs)
        inst = self.roles[role]
        module = getattr(inst, "model", None) or getattr(getattr(inst, "engine", None), "model", None)
        if isinstance(module, torch.nn.Module):
            seen[role] = {p.device.type for p in module.parameters()}
        return out

    def recording_place(model, t):
        model = place(model, t)
        seen["model"] = {p.device.type for p in model.parameters()}
        return model

    monkeypatch.setattr(HostCore, "create", recording_create)
    monkeypatch.setattr(in_process, "place", recording_place)
    for mod in ("baton.trainers.sft", "baton.trainers.reward_model"):  # imported by name there
        monkeypatch.setattr(f"{mod}.place", recording_place, raising=False)
    return seen


def _train(recipe: str, overrides: list[str], run_dir: Path, steps: int, *extra: str) -> None:
    code = main(["train", f"recipes/{recipe}.yaml", *overrides, f"trainer.run_dir={run_dir}",
                 f"trainer.steps={steps}", *extra])
    assert code == 0, (recipe, overrides, extra)


def _check(run_dir: Path, steps: int) -> list[dict]:
    """The metrics of steps 1.. (finite, up to `steps`) of a run that wrote a checkpoint."""
    lines = [r for r in read_metrics(run_dir) if r.get("step", 0) >= 1]
    assert lines and max(r["step"] for r in lines) >= steps and list_checkpoints(run_dir), run_dir
    values = [(r["step"], k, v) for r in lines for k, v in r.items() if isinstance(v, float)]
    assert all(math.isfinite(v) for _, _, v in values), [x for x in values if not math.isfinite(x[2])]
    return lines


@pytest.mark.parametrize("recipe, overrides", [pytest.param(r, o, id=i) for i, r, o in ROWS])
def test_recipe_trains_on_the_gpu_and_resumes(recipe, overrides, tmp_path, devices):
    run = tmp_path / "run"
    _train(recipe, overrides, run, 2)
    assert devices and all(kinds == {"cuda"} for kinds in devices.values()), devices
    steps = _check(run, 2)
    if any("rollout/logprob_mismatch_kl" in r for r in steps):
        kl = max(abs(r["rollout/logprob_mismatch_kl"]) for r in steps if "rollout/logprob_mismatch_kl" in r)
        assert kl < MISMATCH_KL_MAX, kl
    if recipe in ("grpo_arithmetic", "ppo_arithmetic"):
        assert all("memory/peak_gib_update" in r for r in steps if "actor/loss" in r)
        assert any("rollout/logprob_mismatch_kl" in r for r in steps)
    _train(recipe, overrides, run, 3, "trainer.resume=auto")  # the GPU checkpoint, on the GPU
    _check(run, 3)


@pytest.mark.parametrize("recipe, overrides", [
    pytest.param("grpo_arithmetic", RL, id="grpo"), pytest.param("sft_arithmetic", SFT, id="sft")])
def test_a_gpu_run_resumes_on_the_cpu(recipe, overrides, tmp_path):
    run = tmp_path / "run"
    _train(recipe, overrides, run, 2)
    on_cpu = [o for o in overrides if not o.startswith(("placement.gpus_per_worker", "trainer.device"))]
    on_cpu += ["placement.gpus_per_worker=0"] if recipe != "sft_arithmetic" else ["trainer.device=cpu"]
    _train(recipe, on_cpu, run, 3, "trainer.resume=auto")
    _check(run, 3)
