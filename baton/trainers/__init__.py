"""The drivers: one per algorithm family, each with its config beside it, and the registry
`baton train` reads (`algorithms.py`: `algorithm:` -> config class and driver).

    ppo.py, ppo_config.py            GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++, ReMax, GSPO, PPO
    online_dpo.py, dpo_config.py     online DPO (the policy's own samples, paired)
    offline_dpo.py, dpo_config.py    DPO from a jsonl of pairs
    dpo_roles.py                     what the two DPO drivers share (roles, reference refresh)
    reward_model.py                  `baton rm`: a Bradley-Terry reward model
    sft.py                           `baton sft`: supervised warm start
    checkpoint_eval.py               `baton eval`: held-out accuracy of any checkpoint

What every driver runs inside is `session/` (the run session, the shared config sections,
the run state), what a step shows is `report/`, where roles go is `placement/`; where a
step's rows come from is a layer below (baton.sources).
"""
