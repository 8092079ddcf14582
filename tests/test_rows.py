"""The training row contract (`baton.rows`): `to_batch` pads trajectories once, by hand; the
group is always a column; a new row field is one dataclass field and one `Column`."""

from dataclasses import dataclass

import pytest
import torch

from baton import fields as F
from baton.batch import PAD_KEY, Batch
from baton.rows import COLUMNS, Column, Trajectory, to_batch

PAD = 9


class Tok:
    """A tokenizer's decoding, enough for to_batch: token t is the letter chr(97 + t)."""

    def batch_decode(self, seqs, skip_special_tokens=True):
        return ["".join(chr(97 + t) for t in s if t != PAD) for s in seqs]


def test_to_batch_pads_once_by_hand():
    trajs = [Trajectory([1, 2], [3], logprobs=[-0.5], reward=1.0, version=2, group=7),
             Trajectory([4], [5, 6, 0], logprobs=[-1.0, -2.0, -3.0], loss_mask=[1, 0, 1], reward=0.0,
                        token_rewards=[(0, 0.25), (2, 0.5), (2, 0.25)], finish_reason="length", group=7)]
    b = to_batch(trajs, PAD, Tok())
    # prompts left-padded, responses right-padded, with the pad id
    assert b[F.PROMPT_IDS].tolist() == [[1, 2], [PAD, 4]] and b[F.PROMPT_MASK].tolist() == [[1, 1], [0, 1]]
    assert b[F.RESPONSE_IDS].tolist() == [[3, PAD, PAD], [5, 6, 0]]
    # the loss mask: row 0 has none (every response token), row 1 its own
    assert b[F.RESPONSE_MASK].tolist() == [[1, 0, 0], [1, 0, 1]]
    assert b[F.ROLLOUT_LOGPROBS].tolist() == [[-0.5, 0.0, 0.0], [-1.0, -2.0, -3.0]]
    # per-token rewards added up in order: row 1 has 0.25 at 0 and 0.5 + 0.25 at 2; row 0 none
    assert b[F.TOKEN_REWARDS].tolist() == [[0.0, 0.0, 0.0], [0.25, 0.0, 0.75]]
    assert b[F.HAS_TOKEN_REWARDS].tolist() == [False, True]
    assert b[F.REWARDS].tolist() == [1.0, 0.0]  # the scalar, where given
    assert b[F.GROUP_INDEX].tolist() == [7, 7] and b[F.POLICY_VERSION].tolist() == [2, 0]
    assert list(b[F.FINISH_REASON]) == ["stop", "length"]
    assert list(b[F.PROMPT_TEXT]) == ["bc", "e"] and list(b[F.COMPLETION_TEXT]) == ["d", "fga"]


def test_unscored_rows_have_no_reward_and_episode_rewards_are_their_token_sum():
    plain = to_batch([Trajectory([1], [2]), Trajectory([1], [3, 4])], PAD, Tok())
    assert F.REWARDS not in plain  # scored later (the reward role)
    assert plain[F.HAS_TOKEN_REWARDS].tolist() == [False, False] and plain[F.GROUP_INDEX].tolist() == [0, 0]
    turns = to_batch([Trajectory([1], [2, 3], token_rewards=[(0, 0.5), (1, 1.0)])], PAD, Tok())
    assert turns[F.REWARDS].tolist() == [1.5]
    with pytest.raises(ValueError, match="scored and some are not"):
        to_batch([Trajectory([1], [2], reward=1.0), Trajectory([1], [2])], PAD, Tok())


def test_rows_carry_their_prompt_row_and_dispatch_padding_stays_last():
    prompts = Batch(non_tensors={F.PROMPT_TEXT: ["p0", "p1", "pad"], "answer": ["a0", "a1", "a0"]},
                    meta={PAD_KEY: 1})
    trajs = [Trajectory([1], [2], prompt_row=i // 2, group=i // 2) for i in range(6)]
    b = to_batch(trajs, PAD, Tok(), prompts=prompts)
    assert list(b["answer"]) == ["a0", "a0", "a1", "a1", "a0", "a0"] and list(b[F.PROMPT_TEXT])[2] == "p1"
    assert b.meta[PAD_KEY] == 2 and len(b.unpadded()) == 4


def test_a_new_row_field_is_one_dataclass_field_and_one_column():
    @dataclass
    class WithTeacher(Trajectory):
        teacher_logprobs: list[float] | None = None  # the new field

    columns = (*COLUMNS, Column("teacher_logprobs", F.TEACHER_LOGPROBS, 0.0, torch.float32))  # its column
    b = to_batch([WithTeacher([1], [2, 3], teacher_logprobs=[-0.1, -0.2]), WithTeacher([1], [4], teacher_logprobs=[-0.3])],
                 PAD, Tok(), columns=columns)
    assert torch.allclose(b[F.TEACHER_LOGPROBS], torch.tensor([[-0.1, -0.2], [-0.3, 0.0]]))
    assert F.TEACHER_LOGPROBS not in to_batch([WithTeacher([1], [2])], PAD, Tok(), columns=columns)  # none given
