"""Where a run's roles go: placing them on resource pools, and `placement.auto`'s choice.

    roles.py  build the roles of a run on its pools, each given only its own config sections
    auto.py   `placement.auto`: devices, data-parallel ranks and threads from the machine (it
              reads prompts per step and the trainer's mode, so it lives here, not in the
              controller, which knows nothing of RL)
"""
