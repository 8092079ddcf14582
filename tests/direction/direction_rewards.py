"""Hand-set rewards for the direction tests, in a module with no heavy imports (the reward
worker processes import it). `parity`: 1 for a completion whose characters' code points sum
to an odd number, else 0 - a fixed function of the text that rewards about half of a tiny
random model's samples, so most groups hold both rewarded and penalised rows."""

from baton.rewards.registry import REWARD_FUNCTIONS, register_reward


def parity(prompt, completion, **row):
    return float(sum(map(ord, completion)) % 2)


if "direction/parity" not in REWARD_FUNCTIONS:
    register_reward("direction/parity")(parity)
