"""What an RL step shows a user beyond its loss, shared by the PPO-family driver and online DPO.

    step_metrics.py  the rows' and the update's metrics, and the weight-sync parity check
    signal_watch.py  the learning signal in one call: tied groups, and a few samples
    tied_groups.py   `reward/tied_group_frac`, and the one warning when most groups tie
    samples.py       `samples.jsonl`: a few completions per step, where a user can read them
    queue_health.py  `queue/*`: rows/s generated and trained, idle shares, row ages, the
                     update's share of the matmul rate, and the end-of-run bottleneck line
"""
