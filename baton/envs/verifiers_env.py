"""A verifiers environment's own episodes, multi-turn and tool ones, through baton's OpenAI
gateway: the gateway agent `baton.envs.verifiers_env:episode` (the verifiers extra, imported
when a session runs).

    data:
      source: gateway
      task: verifiers                   # rows: the taskset's tasks (baton.envs.verifiers_task)
      task_args: {taskset: my_taskset}  # an installed id or a module exporting its Taskset (and Env)
    gateway:
      agent: baton.envs.verifiers_env:episode

Each gateway session plays one episode of its row's task the way verifiers runs it
(`Env.run_episode` inside `Env.serving()`): the taskset's own `Env` (its module's exported Env
subclass, else `SingleAgentEnv`), whose `run()` drives the turns (a game engine answering each
move through `interaction.turn(text)`, tool calls on the task's MCP tool servers, `@vf.stop`
hooks, limits), every model call through verifiers' interception server to the session's
`base_url`. The gateway records the session as one token sequence (sampled tokens mask 1 with
the engine's logprobs, everything the env said mask 0) and the episode's trace's reward (the
task's `@vf.reward` functions, weighted, and whatever the env records) is the session's reward.

The env's seat plays baton's in-process harness (`baton.envs.verifiers_harness`: verifiers'
chat loop without a program to install) on verifiers' subprocess runtime; an env with more
than one seat (a judge, a simulated user: a second model in the same session) is refused.
An episode that fails (`episode.ok` false: a harness, tool or env error) raises, and the
gateway drops its session as `agent_error`; one that runs past `gateway.session_timeout_s`
is dropped as `deadline` (the gateway's watchdog; an env that blocks its loop included).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from baton.envs.verifiers_task import NAME, _task_of
from baton.user_modules import require_extra

MODEL = "baton"  # the model name the gateway serves (baton.agents.gateway_run's Gateway)


def _vf() -> Any:
    return require_extra("verifiers.v1", "verifiers", "gateway.agent=baton.envs.verifiers_env:episode")


def plugin_id(taskset: str) -> str:
    """verifiers' id for `taskset`: an installed id as it is; a dotted module path imported and
    registered under a top-level alias (verifiers' loaders import top-level names only)."""
    if "." not in taskset:
        return taskset
    alias = "baton_vf__" + taskset.replace(".", "__").lower()
    if alias not in sys.modules:
        sys.modules[alias] = importlib.import_module(taskset)
    return alias


@lru_cache(maxsize=8)
def env_config(taskset: str, args_json: str) -> Any:
    """The verifiers EnvConfig of the taskset's own Env, its one seat on baton's harness."""
    vf = _vf()
    from verifiers.v1.utils import loaders

    from baton.envs.verifiers_harness import HARNESS_ID

    tid = plugin_id(taskset)
    cls = loaders.env_config_type(tid)
    seats = [n for n, f in cls.model_fields.items() if isinstance(f.default, vf.AgentConfig)]
    if len(seats) != 1:
        raise ValueError(f"data.task_args.taskset={taskset!r}: its env {cls.__name__} has seats {seats}; "
                         f"baton trains an env with one seat (one model in one gateway session)")
    return cls.model_validate({"taskset": {"id": tid, **json.loads(args_json)},
                               seats[0]: {"harness": {"id": HARNESS_ID}, "runtime": {"type": "subprocess"}}})


_KEYS: dict[str, int] = {}  # environment variable -> sessions using it
_KEYS_LOCK = threading.Lock()


@contextmanager
def _key_var(api_key: str) -> Iterator[str]:
    """An environment variable holding the session's key while a session uses it: verifiers'
    clients read their key from one (`api_key_var`), never from the config. A run's sessions
    share one key (one variable); it is removed when the last of them ends."""
    var = "BATON_VF_KEY_" + hashlib.sha256(api_key.encode()).hexdigest()[:12]
    with _KEYS_LOCK:
        _KEYS[var] = _KEYS.get(var, 0) + 1
        os.environ[var] = api_key
    try:
        yield var
    finally:
        with _KEYS_LOCK:
            _KEYS[var] -= 1
            if not _KEYS[var]:
                del _KEYS[var]
                os.environ.pop(var, None)


async def episode(base_url: str, api_key: str, row: dict[str, Any]) -> float:
    """One verifiers episode of the row's task in this gateway session; its trace's reward."""
    vf = _vf()
    from verifiers.v1.utils.loaders import load_environment

    if "vf_taskset" not in row:
        raise ValueError(f"{__name__}:episode needs rows of data.task={NAME}")
    env = load_environment(env_config(row["vf_taskset"], row["vf_args"]))  # one per episode: serving() is its state
    with _key_var(api_key) as var:
        ctx = vf.ModelContext(model=MODEL, client=vf.EvalClientConfig(base_url=base_url, api_key_var=var))
        async with env.serving():
            result = await env.run_episode(_task_of(row), ctx)
    if not result.ok:
        errors = [*result.errors, *(e for t in result.traces for e in t.errors)]
        raise RuntimeError("verifiers episode failed: " + ("; ".join(f"{e.type}: {e.message}" for e in errors)
                                                             or "not ok")[:500])
    traces = [t for t in result.traces if t.agent is None or t.agent.trainable]
    if len(traces) != 1 or traces[0].reward is None:
        raise RuntimeError(f"verifiers episode has {len(traces)} traces of its seat, scored "
                           f"{[t.reward for t in traces]}: baton takes one scored trace per session")
    return float(traces[0].reward)


episode.requires_task = NAME  # GatewayAgentConfig.check_task: refused at config time with another data.task
