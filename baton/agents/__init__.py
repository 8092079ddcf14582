"""Multi-turn agents with tools: episodes, token-in/token-out trajectories, many trajectories
batched through the engine, and the `data.source: agent` / `gateway` row sources.

    tools.py     tool schemas from functions / per-trajectory objects; <tool_call> parsing
    episode.py   the async episode protocol (start / step / close), ToolEpisode
    tokens.py    Conversation: sampled ids (mask 1) + template deltas (mask 0); re-render check
    envs/        AGENT_ENVS (a Registry): calculator (tool use), guess (per-turn feedback), and
                 envs/openenv.py's OpenEnvEpisode (an OpenEnv server: reset / step, MCP tools)
    rollout.py   run_episodes: all trajectories' turns batched; faults dropped and counted
    watchdog.py  run_watched: each agent on a thread and loop of its own; deadlines that hold
    config.py    AgentConfig (the recipe's `agent:` section), GatewayAgentConfig (`gateway:`)
    gateway_run.py  run_sessions: an OpenAI-speaking agent's sessions through a gateway as rows
    api_env.py   AgentEnvironment: episodes as scored groups for `baton env` / `baton api`
    evaluate.py  held-out accuracy and call rates of a calculator checkpoint, with and without the tool
Elsewhere: the tasks "multiply" (RL prompts), "calc_format" / "calc_mixed" (the two SFT
stages of the warm start) and "guess" in baton.envs.agent_tasks; the row source (`data.source: agent`) in
baton.sources.episodes; per-turn credit in baton.algos.turn_credit ("turn_grpo").
"""
