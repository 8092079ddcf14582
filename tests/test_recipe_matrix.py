"""What users run is what CI runs: every recipe under recipes/ and every combination the README
and docs/ show runs a few steps through `baton train` (the command users type), under the
default placement (`placement.auto` on, as on a user's machine) and with `placement.auto=false`,
and ends with finite metrics and a checkpoint that resumes.

Placement chooses where, never what: for every row the two placements resolve to the same
config outside the `placement:` section (checked for every row, cheaply). Where they also
place the roles alike with as many threads (the tiny models here run in one process on a small
machine; auto's one thread is what `threads_per_worker: 0`, torch's default, gives under the
suite's workers: `_as_run`), one run covers both; where they differ, both run.

The start-failure matrix: for each recipe family a missing model dir, a wrong type, an
unknown key and a missing user module are one line and exit 2, before anything is written,
under both placements.

Golden first steps: each row's first 3 steps' key metrics (loss, reward, KL, grad norm, the
critic's returns and fit) from the run above, compared with tests/golden/first_steps/ROW.json
(`_check_golden`; nothing is run for it). A change that moves them updates the files in the
same commit, saying why: regenerate with

    BATON_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -n 0 tests/test_recipe_matrix.py -k test_recipe_runs_under_both_placements

(add `-k ROW` for one row). Tolerance, relative 1e-3 (absolute 1e-5 near 0): the runs are
fp32 and seeded, bit for bit the same run to run on one CPU; another CPU's kernels (AVX2
vs AVX-512: other reduction orders) round differently, about 1e-7 relative per op, and three
optimizer steps amplify that (Adam's first step is lr * g / |g|, sensitive for a near-zero
g). Measured on this AVX-512 machine against ATen, MKL and oneDNN forced to AVX2
(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2), all 15
compared rows: 140 of 272 values differ, by at most 1.8e-5 relative where |value| >= 1e-3
and 6.7e-7 absolute below (losses near 0); the tolerance is 55x and 15x those, and far
below what a semantic change moves (a sign, a dropped term or another sample moves these
metrics by > 1e-2). Rows excluded (GOLDEN_SKIP) say why.

Rows that need Ray (a generator ahead, data parallel) are marked `ray` (one Ray per session).
The API recipes run through `baton launch` (the trajectory API, a `baton serve` server and
`baton env` beside the trainer) with the default placement in the trainer it starts; their
resume and the GSM8K recipe (math-verify) run under `slow`, as do the Ray rows that repeat
what a default row already covers (one_step_off without LoRA, async, PPO one_step_off, split
placement).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baton.cli import main
from baton.config import to_dict
from baton.metrics import read_metrics
from baton.runs.checkpoints import list_checkpoints
from baton.trainers.algorithms import load_recipe

REPO = Path(__file__).resolve().parents[1]
AGENTS = REPO / "tests" / "agents"  # openai_agent.py: the README's gateway agent, complete

RL = ["data.prompts_per_step=2", "rollout.n=2", "data.eval_size=2", "actor.mini_batch_size=0",
      "actor.micro_batch_size=4", "trainer.progress=false"]
PPO = [*RL, "critic.mini_batch_size=0", "critic.micro_batch_size=4", "critic.pretrain_steps=1"]
DPO = ["data.prompts_per_step=2", "rollout.n=2", "data.eval_size=2", "actor.micro_batch_size=4",
       "trainer.progress=false"]
OFFLINE_DPO = ["data.path=tests/fixtures/pairs.jsonl", "data.pairs_per_step=4", "data.eval_size=2", "actor.micro_batch_size=4", "trainer.progress=false"]
SFT = ["data.num_examples=16", "trainer.batch_size=4", "data.eval_size=2"]
RM = ["data.num_pairs=16", "trainer.batch_size=4"]
AGENT = [*RL, "agent.max_turns=2"]
GATEWAY = ["data.source=gateway", "gateway.agent=openai_agent:solve", "agent=null", "data.task=arithmetic",
           "model.path=checkpoints/arith-sft", *RL]
LORA = ["model.lora.rank=8", "model.lora.alpha=16", "actor.lr=1e-3"]  # the README's LoRA line


def _tiny_llama_chat() -> str:
    """A tiny random Llama with tied embeddings and GQA (SmolLM2-135M-Instruct's architecture)
    and a tokenizer with a chat template: the real-model recipe's row runs on it (the real model
    runs in CI's real-model job: scripts/ci_real_model.sh). Built once per machine, atomically."""
    import tempfile

    from baton.models.make import make_tiny_checkpoint

    path = Path(tempfile.gettempdir()) / "baton-tests-tiny-llama-chat-v1"
    if not (path / "config.json").is_file():
        make_tiny_checkpoint(path, preset="0.2m", family="llama")
    return str(path)


SMOLLM2 = [*RL, f"model.path={_tiny_llama_chat()}", "rollout.max_new_tokens=8", "algo.overlong_buffer=4"]

# (id, recipe, overrides, marks): every recipe, then the combinations the docs show
ROWS = [
    ("grpo", "grpo_arithmetic", RL, ()),
    ("grpo-lora", "grpo_arithmetic", [*RL, *LORA], ()),
    ("grpo-kl-loss", "grpo_arithmetic", [*RL, "algo.kl_coef=0.01"], ()),
    ("grpo-dapo", "grpo_arithmetic", [*RL, "algo.dynamic_sampling=true"], ()),
    ("grpo-smollm2", "grpo_smollm2", SMOLLM2, ()),  # the real-model recipe, on a tiny Llama of its family
    ("grpo-reinforce-pp", "grpo_arithmetic", [*RL, "algo.advantage=reinforce_pp", "algo.gamma=0.9"], ()),
    ("grpo-one-step-off", "grpo_arithmetic", [*RL, "trainer.mode=one_step_off"], ("ray", "slow")),  # reduced: +lora
    ("grpo-one-step-off-lora", "grpo_arithmetic", [*RL, *LORA, "trainer.mode=one_step_off"], ("ray",)),
    ("grpo-async", "grpo_arithmetic", [*RL, "trainer.mode=async", "trainer.max_staleness=2",
                                       "algo.off_policy=decoupled_ppo"], ("ray", "slow")),
    ("grpo-data-parallel", "grpo_arithmetic", [*RL, "placement.backend=ray", "placement.world_size=2"], ("ray",)),
    ("grpo-split-reward", "grpo_arithmetic", [*RL, "placement.backend=ray", "placement.pools.aux=1",
                                              "placement.roles.reward=aux"], ("ray", "slow")),
    ("distill", "distill_arithmetic", RL, ()),  # GKD's forward KL over the teacher's distribution
    ("distill-sampled", "distill_arithmetic", [*RL, "algo.distill_loss=advantage", "actor.epochs=1"], ()),
    ("ppo-critic", "ppo_arithmetic", PPO, ()),
    ("ppo-kl-in-reward", "ppo_arithmetic", [*PPO, "algo.kl_in_reward=true"], ()),
    ("ppo-one-step-off", "ppo_arithmetic", [*PPO, "trainer.mode=one_step_off"], ("ray", "slow")),
    ("online-dpo", "online_dpo_arithmetic", DPO, ()),
    ("offline-dpo", "offline_dpo_arithmetic", OFFLINE_DPO, ()),
    ("rm", "rm_arithmetic", RM, ()),
    ("sft", "sft_arithmetic", SFT, ()),
    ("sft-calc-format", "agent_calculator_sft", SFT, ()),
    ("sft-calc-mixed", "agent_calculator_sft_mixed", SFT, ()),
    ("agent-calculator", "agent_calculator", AGENT, ()),
    ("agent-guess", "agent_guess", AGENT, ()),
    ("agent-gateway", "agent_calculator", GATEWAY, ()),
]


GOLDEN = REPO / "tests" / "golden" / "first_steps"
GOLDEN_STEPS = (1, 2, 3)  # steps 1-2, then 3 after the resume
GOLDEN_RTOL, GOLDEN_ATOL = 1e-3, 1e-5  # see the module docstring
GOLDEN_KEYS = ("actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/approx_kl", "actor/kl", "actor/entropy",
               "critic/vf_loss", "critic/grad_norm", "critic/returns_mean", "critic/explained_var",
               "reward/mean", "reward/std", "kl_reward/kl", "dpo/kl", "rewards/margins", "rewards/accuracies",
               "sft/loss", "sft/grad_norm", "rm/loss", "rm/grad_norm", "rm/accuracy", "distill/reverse_kl",
               "actor/distill_loss")
GOLDEN_SKIP = {  # row -> why its first steps are not compared
    "agent-gateway": "the agent's sessions run concurrently: which request the engine samples first varies",
    "grpo-one-step-off-lora": "Ray worker processes; the generator's timing decides nothing, but untested here",
    "grpo-data-parallel": "Ray worker processes (two ranks); not compared",
}


def _first_steps(run_dir: Path) -> dict[str, dict[str, float]]:
    """{step: {key: value}} of GOLDEN_KEYS in the run's metrics.jsonl (the last line of a step
    wins: the resumed run's step 3)."""
    out: dict[str, dict[str, float]] = {}
    for r in read_metrics(run_dir):
        if r.get("step") in GOLDEN_STEPS:
            out[str(r["step"])] = {k: r[k] for k in GOLDEN_KEYS if isinstance(r.get(k), (int, float))}
    return out


def _check_golden(row_id: str, run_dir: Path) -> None:
    """The row's first steps against tests/golden/first_steps/ROW.json (module docstring)."""
    if row_id in GOLDEN_SKIP:
        return
    got, path = _first_steps(run_dir), GOLDEN / f"{row_id}.json"
    regenerate = (f"regenerate with BATON_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -n 0 tests/test_recipe_matrix.py "
                  f"-k 'test_recipe_runs_under_both_placements and {row_id}' and commit {path.relative_to(REPO)} "
                  f"saying why the numbers moved")
    if os.environ.get("BATON_UPDATE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    if not path.is_file():
        pytest.fail(f"no golden first steps for row {row_id!r}: {regenerate}")
    want = json.loads(path.read_text())
    assert set(got) == set(want), f"steps {sorted(got)} vs golden {sorted(want)}; {regenerate}"
    moved = [f"step {s} {k}: {got[s].get(k)} (golden {v})" for s in want for k, v in want[s].items()
             if k not in got[s] or not math.isclose(got[s][k], v, rel_tol=GOLDEN_RTOL, abs_tol=GOLDEN_ATOL)]
    moved += [f"step {s} {k}: new key" for s in got for k in got[s] if k not in want[s]]
    assert not moved, f"row {row_id}: the first steps moved:\n  " + "\n  ".join(moved) + f"\nIf intended, {regenerate}"


def _mark(row):
    rid, recipe, overrides, marks = row
    return pytest.param(recipe, overrides, id=rid, marks=[getattr(pytest.mark, m) for m in marks])


@pytest.fixture(autouse=True)
def _as_a_user(monkeypatch):
    """From the repository root, placement.auto as `baton train` has it for users (the suite
    turns it off elsewhere: BATON_PLACEMENT_AUTO=0), the torch threads a local run sets put
    back afterwards."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(AGENTS))
    monkeypatch.delenv("BATON_PLACEMENT_AUTO", raising=False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _algorithm(recipe: str) -> str:
    import yaml

    return (yaml.safe_load((REPO / "recipes" / f"{recipe}.yaml").read_text()) or {}).get("algorithm", "grpo")


def _resolved(recipe: str, overrides: list[str]) -> dict:
    import io

    return to_dict(load_recipe(_algorithm(recipe), f"recipes/{recipe}.yaml", overrides, say=io.StringIO()))


def _train(recipe: str, overrides: list[str], run_dir: Path, steps: int, *extra: str) -> None:
    code = main(["train", f"recipes/{recipe}.yaml", *overrides, f"trainer.run_dir={run_dir}",
                 f"trainer.steps={steps}", *extra])
    assert code == 0, (recipe, overrides, extra)


def _check_run(run_dir: Path, steps: int) -> None:
    lines = [r for r in read_metrics(run_dir) if "step" in r]
    assert {r["step"] for r in lines} >= set(range(1, steps + 1)), lines
    for r in lines:
        bad = {k: v for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, (r["step"], bad)
    assert list_checkpoints(run_dir), "no checkpoint written"


def _run_and_resume(recipe: str, overrides: list[str], run_dir: Path) -> None:
    """2 steps, then resumed from their checkpoint to a third."""
    _train(recipe, overrides, run_dir, 2)
    _check_run(run_dir, 2)
    _train(recipe, overrides, run_dir, 3, "trainer.resume=auto")
    _check_run(run_dir, 3)


def _as_run(placement: dict | None) -> dict | None:
    """The placement as it runs here: `threads_per_worker: 0` is torch's default, which leaves a
    process's threads as they are, i.e. torch.get_num_threads() of this process and of the Ray
    workers it starts (one under the suite's workers, OMP_NUM_THREADS=1). Auto's 1 then places
    alike, and one run covers both; where the default is more (a run with -n 0 on a bigger
    machine), both run."""
    if placement and placement.get("threads_per_worker") == 0:
        return {**placement, "threads_per_worker": torch.get_num_threads()}
    return placement


@pytest.mark.parametrize("recipe, overrides", [_mark(r) for r in ROWS])
def test_recipe_runs_under_both_placements(recipe, overrides, tmp_path, request):
    default = _resolved(recipe, overrides)
    placed = "placement" in default  # sft and rm run in one process: no placement section
    off = _resolved(recipe, [*overrides, "placement.auto=false"]) if placed else dict(default)
    placement_default, placement_off = _as_run(default.pop("placement", None)), _as_run(off.pop("placement", None))
    assert default == off, "placement.auto changed what the recipe computes"
    _run_and_resume(recipe, overrides, tmp_path / "default")
    own = tmp_path / "default"  # the recipe's own placement: what the golden first steps hold
    if placement_default != placement_off:  # placed otherwise here: the recipe's own placement runs too
        own = tmp_path / "auto-false"
        _run_and_resume(recipe, [*overrides, "placement.auto=false"], own)
    # against the recipe's own placement, the same on every machine (auto may choose data-parallel
    # ranks on a bigger one, which sample with their own seeds)
    _check_golden(request.node.callspec.id, own)


VLLM_ROWS = ["grpo", "grpo-kl-loss", "ppo-critic", "online-dpo", "agent-calculator", "grpo-one-step-off"]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (CI's vLLM job has it)")
@pytest.mark.parametrize("recipe, overrides", [_mark(r) for r in ROWS if r[0] in VLLM_ROWS])
def test_recipe_runs_with_vllm(recipe, overrides, tmp_path):
    """The same rows with `rollout.engine=vllm` (CI's vLLM job: `pytest -m "vllm and not slow"`)."""
    _run_and_resume(recipe, [*overrides, "rollout.engine=vllm"], tmp_path / "vllm")


def test_every_recipe_is_in_the_matrix():
    shipped = {p.stem for p in (REPO / "recipes").glob("*.yaml")}
    api = {"grpo_arithmetic_api", "grpo_gsm8k"}  # through `baton launch`: test_an_api_recipe_runs_through_launch
    scale = {"grpo_qwen05b_gsm8k", "grpo_7b_8gpu"}  # real models on GPUs: tests/test_scale_recipes.py
    assert shipped - api - scale == {r[1] for r in ROWS}


# --- the API source through `baton launch` ------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(recipe: str, run_dir: Path, steps: int, *extra: str, ports: tuple[int, int] | None = None) -> None:
    api, srv = ports or (_free_port(), _free_port())
    env = {k: v for k, v in os.environ.items() if k != "BATON_PLACEMENT_AUTO"}  # the default placement
    argv = [sys.executable, "-m", "baton.cli", "launch", f"recipes/{recipe}.yaml", *RL,
            f"trainer.run_dir={run_dir}", f"data.api_url=http://127.0.0.1:{api}",
            f"data.servers=[http://127.0.0.1:{srv}]", f"trainer.steps={steps}", *extra]
    p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600, env={**env, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "placement auto: " in p.stdout  # the trainer placed itself as a user's does


@pytest.mark.parametrize("recipe, extra", [
    pytest.param("grpo_arithmetic_api", ["data.envs=[arithmetic --concurrency 4]"], id="api"),
    pytest.param("grpo_gsm8k", [], id="gsm8k", marks=pytest.mark.slow),
])
def test_an_api_recipe_runs_through_launch(recipe, extra, tmp_path):
    if recipe == "grpo_gsm8k":
        pytest.importorskip("math_verify")
    _launch(recipe, tmp_path / "run", 2, *extra)
    _check_run(tmp_path / "run", 2)


@pytest.mark.slow
def test_an_api_run_resumes_through_launch(tmp_path):
    extra, ports = ["data.envs=[arithmetic --concurrency 4]"], (_free_port(), _free_port())
    _launch("grpo_arithmetic_api", tmp_path / "run", 2, *extra, ports=ports)  # the same addresses: a resume
    _launch("grpo_arithmetic_api", tmp_path / "run", 3, *extra, "trainer.resume=auto", ports=ports)  # keeps them
    _check_run(tmp_path / "run", 3)


# --- start failures ------------------------------------------------------------------------
FAMILIES = [  # (recipe, the model key, a missing user module)
    ("grpo_arithmetic", "model.path", "reward.functions={no_such_module:score: 1.0}"),
    ("ppo_arithmetic", "critic.path", "reward.functions={no_such_module:score: 1.0}"),
    ("online_dpo_arithmetic", "model.path", "reward.functions={no_such_module:score: 1.0}"),
    ("offline_dpo_arithmetic", "model.path", "data.task=no_such_module:Task"),  # + its pairs (below)
    ("rm_arithmetic", "model.path", "data.task=no_such_module:Task"),
    ("sft_arithmetic", "model.path", "data.task=no_such_module:Task"),
    ("agent_calculator", "model.path", "agent.env=no_such_module:Env"),
    ("agent_calculator", "model.path", "gateway.agent=no_such_module:solve"),
]


def _one_line_exit_2(argv: list[str], capsys, *needles: str) -> None:
    assert main(argv) == 2, argv
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("baton: config error: "), err
    assert "placement auto" not in captured.out, "placement read a config that did not validate"
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize("placement", ["default", "placement.auto=false"])
@pytest.mark.parametrize("recipe, model_key, user_module", FAMILIES, ids=[f[0] + ("-gw" if "gateway" in f[2] else "")
                                                                           for f in FAMILIES])
def test_start_failures_are_one_line_exit_2_before_anything_is_written(recipe, model_key, user_module, placement,
                                                                       tmp_path, capsys):
    if placement != "default" and _algorithm(recipe) in ("sft", "rm"):
        pytest.skip("sft and rm recipes have no placement section (one process): the default row covers them")
    extra = [] if placement == "default" else [placement]
    if recipe == "offline_dpo_arithmetic":
        extra.append("data.path=tests/fixtures/pairs.jsonl")  # the recipe asks for it on the command line
    if user_module.startswith("gateway."):
        extra += ["data.source=gateway", "agent=null", "data.task=arithmetic"]
    run_dir = tmp_path / "run"
    for override, needles in [(f"{model_key}=no/such/dir", (f"{model_key}=no/such/dir", "no such directory")),
                              ("trainer.steps=three", ("'trainer.steps' expects int, got 'three'",)),
                              ("trainer.stpes=3", ("unknown config key 'trainer.stpes'",)),
                              (user_module, ("no_such_module",))]:
        if user_module.startswith("gateway.") and override != user_module:
            continue  # the gateway rows differ from agent_calculator's only in the user module
        _one_line_exit_2(["train", f"recipes/{recipe}.yaml", *extra, override, f"trainer.run_dir={run_dir}"],
                         capsys, *needles)
        assert not run_dir.exists(), override
