"""Multi-turn agents with tools: episodes, token-in/token-out trajectories, many trajectories
batched through the engine, and the `data.source: agent` row source.

    tools.py     tool schemas from functions / per-trajectory objects; <tool_call> parsing
    episode.py   the async episode protocol (start / step / close), ToolEpisode
    tokens.py    Trajectory: sampled ids (mask 1) + template deltas (mask 0); re-render check
    envs.py      AGENT_ENVS: calculator (tool use), guess (per-turn feedback)
    tasks.py     tasks "multiply" (RL prompts) and "calc_format" (SFT warm start of the call format)
    rollout.py   run_episodes: all trajectories' turns batched; faults dropped and counted
    config.py    AgentConfig (the recipe's `agent:` section)
    source.py    EpisodeSource (RolloutWorker.generate_episodes on the rollout role)
Per-turn credit: baton.algos.turn_credit ("turn_grpo").
Nothing is imported here, so `baton.envs` can register the tasks without a cycle.
"""
