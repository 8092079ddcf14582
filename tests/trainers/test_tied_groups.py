"""`reward/tied_group_frac` by hand, and the one warning (then a count) when most groups tie."""

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from baton.trainers.report.tied_groups import TiedGroups, tied_at, tied_group_frac


def test_tied_group_frac_by_hand():
    # groups (by group_index):  7: [1, 1]     tied   (spread 0)
    #                           3: [0, 1]     not    (spread 1)
    #                           5: [0.5]      tied   (one row: nothing to compare)
    #                           9: [0, 0, 0]  tied
    # -> 3 of 4 groups tied = 0.75 (group ids need not be dense nor sorted)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([7, 3, 7, 5, 3, 9, 9, 9])
    assert tied_group_frac(rewards, groups) == pytest.approx(0.75)
    assert tied_group_frac(torch.tensor([0.0, 1e-9, 2.0, 3.0]), torch.tensor([0, 0, 1, 1])) == 0.5  # within tol


def test_tied_at_the_top_or_the_bottom_by_hand():
    # groups: 0: [1, 1] tied at the step's highest (1); 1: [0, 0] tied at its lowest (0);
    #         2: [0, 1] not tied; 3: [1, 1] at the highest -> top 2/4, bottom 1/4
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert tied_at(rewards, torch.arange(8) // 2) == (0.5, 0.25)
    assert tied_at(torch.zeros(4), torch.arange(4) // 2) == (1.0, 0.0)  # every reward equal: counted as the top


def test_the_warning_tells_an_easy_step_from_a_broken_reward(caplog):
    groups = torch.arange(8) // 2
    with caplog.at_level(logging.WARNING, logger="baton"):
        TiedGroups(config()).check(1, torch.tensor([1.0, 1, 1, 1, 1, 1, 0, 1]), groups)  # 3 of 4 all right
        TiedGroups(config()).check(1, torch.tensor([0.0, 0, 0, 0, 0, 0, 0, 1]), groups)  # 3 of 4 all wrong
    easy, broken = (r.getMessage() for r in caplog.records)
    assert "75% all at the step's highest reward" in easy and "too easy for the policy" in easy
    assert "75% all at its lowest" in broken and "check the reward on a few completions" in broken


def config(advantage="grpo", run_dir="no/such/run"):
    return SimpleNamespace(algo=SimpleNamespace(advantage=advantage), reward_model=None,
                           trainer=SimpleNamespace(run_dir=str(run_dir)),
                           reward=SimpleNamespace(functions={"arithmetic/correct": 1.0, "my_rewards:short": 0.1}))


def test_warns_once_naming_the_rewards_then_counts(caplog):
    tied, groups = TiedGroups(config()), torch.arange(8) // 4  # 2 groups of 4
    all_tied, half = torch.zeros(8), torch.tensor([0.0, 0, 0, 0, 0, 1, 0, 0])
    with caplog.at_level(logging.WARNING, logger="baton"):
        assert tied.check(1, half, groups) == {"reward/tied_group_frac": 0.5}  # half is not most: quiet
        assert tied.check(2, all_tied, groups) == {"reward/tied_group_frac": 1.0, "reward/tied_steps": 1}
        assert tied.check(3, all_tied, groups)["reward/tied_steps"] == 2
    [record] = caplog.records
    assert "step 2: 100% of groups have tied rewards" in record.getMessage()
    assert "arithmetic/correct, my_rewards:short" in record.getMessage()


def test_no_warning_where_tied_rewards_still_carry_an_advantage(caplog):
    tied = TiedGroups(config("gae"))  # a critic's baseline: tied rewards are not zero advantage
    with caplog.at_level(logging.WARNING, logger="baton"):
        assert tied.check(1, torch.zeros(4), torch.arange(4) // 2) == {"reward/tied_group_frac": 1.0}
    assert not caplog.records


def test_a_resumed_run_goes_on_counting(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/tied_group_frac": 1.0}\n'
                                            '{"step": 2, "reward/tied_group_frac": 0.25}\n{"step": 3, "rew')  # torn
    assert TiedGroups(config(run_dir=tmp_path)).check(3, torch.zeros(4), torch.arange(4) // 2)["reward/tied_steps"] == 2


def test_a_source_that_scores_its_rows_is_named_not_the_unread_reward_functions():
    """An OpenEnv run (data.source=agent) keeps the default reward.functions it never reads: the
    warning names the environment's scores, not arithmetic/correct (a new user's trial)."""
    from baton.config import load_config
    from baton.trainers.ppo_config import PPOConfig
    from baton.trainers.report.tied_groups import reward_names

    repo = Path(__file__).resolve().parents[2]
    agent = load_config(PPOConfig, repo / "recipes/agent_guess.yaml")
    assert agent.reward.functions == {"arithmetic/correct": 1.0}  # the default, carried but unread
    assert reward_names(agent) == ["data.source=agent's own scores"]
    assert reward_names(load_config(PPOConfig, repo / "recipes/grpo_arithmetic.yaml")) == ["arithmetic/correct"]
