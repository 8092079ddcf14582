"""Hand-set rewards for the direction tests, in a module with no heavy imports (the reward
worker processes import it). `parity`: 1 for a completion whose characters' code points sum
to an odd number, else 0 - a fixed function of the text that rewards about half of a tiny
random model's samples, so most groups hold both rewarded and penalised rows.
`prompt_parity`: the same over prompt + completion."""

from baton.rewards.registry import REWARD_FUNCTIONS, register_reward


def parity(prompt, completion, **row):
    return float(sum(map(ord, completion)) % 2)


def prompt_parity(prompt, completion, **row):
    """The parity of prompt and completion together: a prompt's greedy answer scores 0 for
    some prompts and 1 for others (ReMax's baseline differs across prompts)."""
    return float(sum(map(ord, prompt + completion)) % 2)


if "direction/parity" not in REWARD_FUNCTIONS:
    register_reward("direction/parity")(parity)
if "direction/prompt_parity" not in REWARD_FUNCTIONS:
    register_reward("direction/prompt_parity")(prompt_parity)
