"""The `baton` command: config errors are one clear line and exit code 2."""

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
    ("data.source=nope", "data.source='nope' is not one of ['rollout', 'api']"),
    ("data.sync=nccl", "data.sync='nccl' is not one of ['broadcast', 'checkpoint']"),
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


def test_a_finished_run_dir_is_one_line_and_exit_1(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    assert main(["train", "recipes/grpo_arithmetic.yaml", f"trainer.run_dir={tmp_path}"]) == 1
    err = capsys.readouterr().err
    assert "already holds a run" in err and "trainer.resume=auto" in err and err.count("\n") == 1
