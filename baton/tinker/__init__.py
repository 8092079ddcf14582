"""`baton tinker`: the Tinker API (the `tinker` SDK's service) served by baton on a local model.

    app.py       `baton tinker MODEL_DIR` (tinker_main), build_app: guards, auth, error shape
    routes.py    the /api/v1 endpoints the SDK calls; REFUSED names what is not served
    service.py   sessions, training models, samplers, checkpoints (tinker:// paths)
    trainee.py   one LoRA training client: forward_backward, optim_step (AdamW), state
    losses.py    Tinker's built-in losses on baton's policy losses (cross_entropy,
                 importance_sampling, ppo)
    sampler.py   sampling on baton's embedded engine, each sampler a LoRA adapter it serves
    futures.py   the calls' futures, run in order on one worker thread
    wire.py      the protobuf messages (forward_backward requests, outputs, samples), by hand
    schemas.py   the JSON request bodies

docs/TINKER.md says what maps to what.
"""
