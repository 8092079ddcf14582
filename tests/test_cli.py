"""The `baton` command: config errors are one clear line and exit code 2, checked before
anything is written; what a user asks of the command line (key help, the resolved config,
eval on a file or a LoRA checkpoint, Ctrl-C) answers in a line or a listing."""

import io
import json
import sys
from pathlib import Path

import pytest
import yaml

from baton.cli import main


def test_unknown_key_exits_2_naming_it(capsys):
    assert main(["train", "recipes/grpo_arithmetic.yaml", "trainer.stpes=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'trainer.stpes'" in err and "did you mean 'trainer.steps'" in err


def test_wrong_type_exits_2_naming_it(capsys):
    assert main(["train", "recipes/grpo_arithmetic.yaml", "rollout.n=many"]) == 2
    assert "config key 'rollout.n' expects int, got 'many'" in capsys.readouterr().err


def test_make_tiny_then_eval(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "m"), "--preset", "0.75m"]) == 0
    assert main(["eval", str(tmp_path / "m"), "--n", "4", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "greedy   accuracy" in out and "sampled  accuracy" in out


BAD = [  # (override, what the one-line error must name)
    ("data.task=nope", "data.task='nope' is not one of ['arithmetic', "),  # + gsm8k, + any a test registered
    ("data.task=gsm8k", "data.task=gsm8k reads its rows from a local file: set data.path"),
    ("data.source=nope", "data.source='nope' is not one of ['rollout', 'api', 'agent', 'gateway']"),
    ("rollout.weight_sync=nccl", "rollout.weight_sync='nccl' is not one of"),
    ("algo.advantage=gae", "needs values from a critic"),
    ("algo.advantage=grpo_typo", "algo.advantage='grpo_typo' is not one of"),
    ("algo.policy_loss=ppo_clipp", "algo.policy_loss='ppo_clipp' is not one of"),
    ("algo.kl_estimator=k9", "algo.kl_estimator='k9' is not one of"),
    ("algo.loss_agg=mean", "algo.loss_agg='mean' is not one of"),
    ("placement.world_size=2", "placement.backend=ray"),
    ("placement.roles.critic=main", "unknown role(s) ['critic']"),
    ("rollout.n=0", "n must be >= 1"),
    ("rollout.n=1", "rollout.n=1 gives every group one sample"),
    ("rollout.temperature=0", "samples of a prompt identical"),
    ("rollout.max_new_tokens=0", "max_new_tokens >= 1"),
    ("rollout.top_p=0", "top_p must be in (0, 1]"),
    ("data.prompts_per_step=0", "data.prompts_per_step and data.eval_size must be >= 1"),
    ("actor.lr=-1", "lr must be > 0"),
    ("reward.functions={}", "reward.functions is empty"),
    ("reward.functions={nope/fn: 1.0}", "unknown reward function 'nope/fn'"),
    ("trainer.sinks=[foo]", "trainer.sinks: 'foo' is not one of"),
    ("trainer.steps=0", "trainer.steps must be >= 1"),
]


def test_bad_configs_exit_2_before_writing_anything(tmp_path, capsys):
    for i, (override, message) in enumerate(BAD):
        run_dir = tmp_path / f"run{i}"
        assert main(["train", "recipes/grpo_arithmetic.yaml", override, f"trainer.run_dir={run_dir}"]) == 2, override
        err = capsys.readouterr().err
        assert message in err, (override, err)
        assert err.count("\n") == 1, err  # one line
        assert not run_dir.exists(), f"{override} wrote {run_dir}"


def _tree(d):
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None for p in sorted(d.rglob("*"))}


def test_a_run_dir_holding_a_run_is_bad_input_exit_2_nothing_written(tmp_path, capsys):
    """Neither trainer.resume nor trainer.overwrite set on a dir that holds a run: a config
    error (exit 2, it was 1), one line naming both switches, and the dir as it was (the lock
    file a finished run leaves included)."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    (tmp_path / "config.yaml").write_text("trainer: {steps: 1}\n")
    (tmp_path / ".lock").write_text("")
    before = _tree(tmp_path)
    assert main(["train", "recipes/grpo_arithmetic.yaml", f"trainer.run_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("baton: config error: run dir") and err.count("\n") == 1, err
    assert "already holds a run" in err and "trainer.resume=auto" in err and "trainer.overwrite=true" in err
    assert _tree(tmp_path) == before


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from baton.models.make import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0)


def _one_line_exit_2(argv, capsys, *needles):
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_start_failures_are_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """A missing model dir, a dir that is no HF model, a metric sink whose package is missing:
    exit 2, one line, no run dir (the corrected rerun into it is not refused)."""
    import baton.metrics

    (tmp_path / "empty").mkdir()
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    monkeypatch.setitem(baton.metrics.PACKAGES, "wandb", ("baton_no_such_module", "wandb"))
    for override, needle in [("model.path=/nonexistent", "model.path=/nonexistent: no such directory"),
                             (f"model.path={tmp_path / 'empty'}", "holds no config.json"),
                             (f"model.path={tmp_path / 'noweights'}", "holds a config.json but no weights"),
                             ("trainer.sinks=[wandb]", "needs the 'wandb' package, which is not installed")]:
        for command, recipe in [("train", "grpo_arithmetic"), ("train", "ppo_arithmetic"),
                                ("online-dpo", "online_dpo_arithmetic")]:
            run_dir = tmp_path / "run"
            _one_line_exit_2([command, f"recipes/{recipe}.yaml", override, f"trainer.run_dir={run_dir}"],
                             capsys, needle)
            assert not run_dir.exists(), (override, recipe)


def test_unknown_keys_suggest_the_close_one(capsys):
    _one_line_exit_2(["config", "recipes/grpo_arithmetic.yaml", "model.lora.r=8"], capsys,
                     "unknown config key 'model.lora.r' (did you mean 'model.lora.rank'?)")
    _one_line_exit_2(["config", "recipes/grpo_arithmetic.yaml", "model.lora.lora_alpha=8"], capsys,
                     "did you mean 'model.lora.alpha'?")


def test_config_resolves_the_algorithm_as_train_does(capsys):
    """`baton config` takes `baton train`'s path (`build_recipe`): an unknown algorithm is one
    line and exit 2 (it was a ValueError's traceback, exit 1)."""
    _one_line_exit_2(["config", "recipes/grpo_arithmetic.yaml", "algorithm=nope"], capsys,
                     "algorithm='nope' is not one of")


WATCHED: dict[str, int] = {}  # file name -> opens seen, for the files a test watches


def _count_opens(event: str, args: tuple) -> None:
    if event == "open" and isinstance(args[0], (str, Path)) and Path(args[0]).name in WATCHED:
        WATCHED[Path(args[0]).name] += 1


sys.addaudithook(_count_opens)  # every open in this process, by any API (audit hooks stay installed)


def test_build_recipe_reads_the_recipe_once(tmp_path):
    """`build_recipe` (train, config, baton.train) names the algorithm and builds the config
    from one read of the recipe file (it read it twice: once for `algorithm:`)."""
    from baton.trainers.run_recipe import build_recipe

    recipe = tmp_path / "once_sft.yaml"
    recipe.write_text(Path("recipes/sft_arithmetic.yaml").read_text())
    WATCHED[recipe.name] = 0
    try:
        name, cfg = build_recipe(str(recipe), [], say=io.StringIO())
        assert (name, WATCHED[recipe.name]) == ("sft", 1)
    finally:
        del WATCHED[recipe.name]


def test_make_tiny_unknown_preset_lists_the_presets(tmp_path, capsys):
    _one_line_exit_2(["make-tiny", str(tmp_path / "m"), "--preset", "7b"], capsys, "'7b'", "0.75m, 2m, 5m, 25m")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("command", ["train", "sft", "rm", "online-dpo", "dpo"])
def test_help_lists_every_section_and_key(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "trainer.steps = " in out and "config keys of `baton " + command in out
    if command == "train":
        assert "  trainer.resume = ''" in out and "steps between checkpoints" in out  # with its one-line help
        assert "model.lora:" in out and "  model.lora.rank = 8" in out
        assert "critic" in out  # algorithm: ppo's sections
        # the effective default, not the dataclass's: auto is on for `baton train`, grpo's estimator
        assert "  placement.auto = True " in out and "  algo.advantage = grpo " in out
    keys = [line for line in out.splitlines() if line.startswith("  ") and " = " in line]
    bare = [line.split(" = ")[0].strip() for line in keys if not line[48:].strip()]
    assert keys and not bare, f"keys without a line of help: {bare}"  # every key has one
    dividers = [line.split(" = ")[0].strip() for line in keys if line[48:].lstrip().startswith(("---", "==="))]
    assert not dividers, f"a section divider comment pasted into these keys' help: {dividers}"


def test_config_prints_the_resolved_recipe(capsys):
    assert main(["config", "recipes/ppo_arithmetic.yaml", "trainer.steps=7"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["trainer"]["steps"] == 7 and cfg["algorithm"] == "ppo" and "critic" in cfg
    assert cfg["trainer"]["resume_changes"] == "refuse"  # defaults filled in


def test_eval_reads_a_data_file(tiny, tmp_path, capsys):
    _one_line_exit_2(["eval", str(tiny), "--task", "gsm8k", "--n", "2"], capsys, "give its path (--data")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"}) + "\n"
                            for i in range(20)))
    assert main(["eval", str(tiny), "--task", "gsm8k", "--data", str(data), "--n", "2", "--max-new-tokens", "2"]) == 0
    assert "on 1 held-out prompts" in capsys.readouterr().out  # 1 in 10 of the file's rows is held out
    assert main(["eval", str(tiny), "--task", "gsm8k", "--data", str(data), "--eval-data", str(data),
                 "--n", "3", "--max-new-tokens", "2"]) == 0
    assert "on 3 held-out prompts" in capsys.readouterr().out


def test_eval_on_a_lora_checkpoint(tiny, tmp_path, capsys):
    """A LoRA run's checkpoint (a PEFT adapter dir) evaluates on its base; without the base,
    one line says to merge it."""
    from baton.models.load import load_model
    from baton.models.lora import LoraAdapterConfig, adapter_config, adapter_tensors, apply_lora, save_adapter

    model = apply_lora(load_model(tiny), LoraAdapterConfig(rank=2), seed=0)
    ckpt = tmp_path / "step_1"
    ckpt.mkdir()
    save_adapter(adapter_tensors(model), adapter_config(model, base_path=tiny), ckpt)
    assert main(["eval", str(ckpt), "--n", "2", "--max-new-tokens", "2"]) == 0
    assert "greedy   accuracy" in capsys.readouterr().out
    cfg = json.loads((ckpt / "adapter_config.json").read_text())
    (ckpt / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": "/gone/base"}))
    _one_line_exit_2(["eval", str(ckpt), "--n", "2"], capsys, "LoRA adapter", "baton export", "--merge")
    _one_line_exit_2(["serve", str(ckpt), "--port", "0"], capsys, "LoRA adapter", "baton export", "--merge")
    from baton.models.load import load_model as load

    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        load(tmp_path)  # neither a model nor an adapter


def test_sft_never_overwrites_a_model(tmp_path, capsys):
    """The recipe's default output is its run dir, never the shipped checkpoint; a save_path
    that already holds a model (the shipped one, say) is refused before anything runs."""
    from pathlib import Path

    from baton.config import load_config
    from baton.trainers.sft import SFTConfig

    cfg = load_config(SFTConfig, "recipes/sft_arithmetic.yaml")
    assert not (cfg.trainer.save_path or "").startswith("checkpoints/") and cfg.trainer.run_dir.startswith("runs/")
    shipped = Path("checkpoints/arith-sft")
    before = {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()}
    for command in ("sft", "train"):
        _one_line_exit_2([command, "recipes/sft_arithmetic.yaml", f"trainer.save_path={shipped}",
                          f"trainer.run_dir={tmp_path / 'run'}"], capsys, "already holds a model")
    assert before == {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()} and not (tmp_path / "run").exists()


def test_ctrl_c_is_one_line_naming_the_step_and_resume(tiny, tmp_path, capsys, monkeypatch):
    import shutil

    import torch

    import baton.cli

    run_dir = tmp_path / "run"
    shutil.copytree(tiny, run_dir / "checkpoints" / "step_2")
    torch.save({}, run_dir / "checkpoints" / "step_2" / "trainer_state.pt")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(4)))

    def interrupted(args):  # the trainer, at the moment the user presses Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(baton.cli, "_train", interrupted)
    assert main(["sft", "recipes/sft_arithmetic.yaml", f"trainer.run_dir={run_dir}"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted at step 3" in err and "trainer.resume=auto" in err, err
    assert "newest checkpoint step_2" in err


@pytest.mark.parametrize("override, needle", [("rollout.n=1", "rollout.n=1 gives every group one sample"),
                                              ("rollout.temperature=0", "samples of a prompt identical")])
def test_turn_grpo_with_one_sample_per_prompt_is_refused_like_grpo(override, needle, tmp_path, capsys):
    """turn_grpo's baseline is the group, as grpo's is (read from its signature: it takes
    group_index); it was missing from a hand-kept list and trained on nothing."""
    _one_line_exit_2(["train", "recipes/agent_guess.yaml", override, f"trainer.run_dir={tmp_path / 'r'}"],
                     capsys, "algo.advantage='turn_grpo'", needle)


def test_baton_help_imports_neither_torch_nor_transformers():
    """`baton --help` answers at once: the command line imports what a command uses only when it
    runs (checked by what gets imported, not by a timer)."""
    import subprocess
    import sys

    code = ("import sys\nfrom baton.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules)\n"
            "print('HEAVY', heavy)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
