"""Services: processes that talk to engines over HTTP.

    api.py         `baton api`, the trajectory API (Atropos-compatible; SQLite-backed queue)
    store.py       its durable store
    client.py      an HTTP client of the API with retries and backoff (env runner, trainer)
    env_runner.py  `baton env NAME`: runs an environment against an inference server + the API
    launch.py      `baton launch RECIPE`: API, servers, environments and trainer as one run

Nothing here is imported by `import baton`; heavy modules (FastAPI, uvicorn) load on use.
"""
