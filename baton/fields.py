"""The names of the fields that cross role boundaries, defined once.

Every worker (rollout, actor, reference, critic, reward) reads and writes a `Batch` using
these names, so a typo is an AttributeError here instead of a silent KeyError three roles
later. Shapes use the legend of `baton.algos`: B = rows (prompt x sample), P = prompt
length (left-padded), R = response length (right-padded), T = P + R (padding and position
ids: `baton.padding`). Fields of a task's rows (e.g. `answer`) are the task's own: they reach
the reward functions as **row.
"""

# --- tensors -------------------------------------------------------------------------
PROMPT_IDS = "prompt_ids"  # [B, P] long, left-padded with the pad id
PROMPT_MASK = "prompt_mask"  # [B, P] 1 on real prompt tokens
RESPONSE_IDS = "response_ids"  # [B, R] long, right-padded with the pad id
RESPONSE_MASK = "response_mask"  # [B, R] 1 on generated tokens (the loss mask)
ROLLOUT_LOGPROBS = "rollout_logprobs"  # [B, R] behaviour logprobs from the engine
OLD_LOGPROBS = "old_logprobs"  # [B, R] trainer logprobs before the update (PPO ratio)
REF_LOGPROBS = "ref_logprobs"  # [B, R] frozen reference policy logprobs
TEACHER_LOGPROBS = "teacher_logprobs"  # [B, R] a distillation teacher's logprobs of the sampled tokens
TEACHER_TOPK_IDS = "teacher_topk_ids"  # [B, R, K] long, the teacher's K most likely tokens at each position
TEACHER_TOPK_LOGPROBS = "teacher_topk_logprobs"  # [B, R, K] the teacher's logprobs of them (algo.distill_loss)
ROUTING = "routing"  # [B, R, L, K] long: the experts the engine's MoE layers chose for each token, -1: none
ENTROPY = "entropy"  # [B, R] per-token entropy of the policy
VALUES = "values"  # [B, R] critic values
REWARDS = "rewards"  # [B] scalar sequence reward (sum of weighted reward functions)
BASELINE_SCORES = "baseline_scores"  # [B] the score of a greedy response to the row's prompt (ReMax's baseline)
TOKEN_REWARDS = "token_rewards"  # [B, R] reward placed on tokens (PPO/GAE)
HAS_TOKEN_REWARDS = "has_token_rewards"  # [B] bool: the row's token_rewards are its source's (agents'
                                         # turns, an environment's); else the driver places `rewards`
ADVANTAGES = "advantages"  # [B, R] per-token advantages
RETURNS = "returns"  # [B, R] value targets
POLICY_VERSION = "policy_version"  # [B] long, weight version that sampled the row (its oldest token's)
TOKEN_VERSIONS = "token_versions"  # [B, R] long, weight version that sampled each token, -1 off the policy
GROUP_INDEX = "group_index"  # [B] long, rows of one prompt share it (groups may be short: dropped rows)
LEDGER_IDS = "ledger_ids"  # Batch.meta: a source's own ids of the batch's groups, in order (the run's ledger)
TURN_INDEX = "turn_index"  # [B, R] long, policy turn of each response token, -1 off the policy (agents)
NUM_TURNS = "num_turns"  # [B] long, policy turns of the row (agents)

# --- per-sample non-tensor fields ----------------------------------------------------
PROMPT_TEXT = "prompt"  # str, the prompt as text
COMPLETION_TEXT = "completion"  # str, the decoded response
FINISH_REASON = "finish_reason"  # "stop" | "length"
TOOL_STATUS = "tool_status"  # list[str] per row: tool-call parse status per turn (agents)

# --- batch-level meta (Batch.meta) ------------------------------------------------------
GENERATE_S = "generate_s"  # float, seconds the rollout worker spent generating the rows (queue health)

# Which side a field is padded on when batches of different widths are concatenated
# (rows from different ranks): prompts are left-padded, everything else right-padded.
LEFT_PADDED = frozenset({PROMPT_IDS, PROMPT_MASK})
PAD_VALUES = {ROUTING: -1, TOKEN_VERSIONS: -1}  # what pads a column that is not 0 (-1: no expert, no version)
