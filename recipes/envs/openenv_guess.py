"""An OpenEnv environment written as a user would (openenv-core, pure Python, no container):
guess a number. `reset(seed)` draws a range LO..HI and a secret in it and shows "LO..HI="; each
step's action is a guess {"guess": "7"}, answered "higher=" / "lower=" (reward 0.1 for a
guess inside the range the feedback allows so far) or, when found, done with reward 1.

    python -m recipes.envs.openenv_guess --port 8011        # serve it (openenv's own server)
    baton train recipes/envs/grpo_openenv.yaml              # train against it (agent.env: openenv)

The server prints one line when it listens ("openenv guess env: listening on http://..."),
and a session the client ends is closed without a word (see `QuietDisconnects`).

The "=" after each observation is for the arithmetic warm start, which answers a number after
it (the same game as baton's own `agent.env: guess`, recipes/agent_guess.yaml).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from starlette.websockets import WebSocketDisconnect


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    text: str = ""


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # one instance per WebSocket session

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.lo = self.hi = self.secret = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> GuessObservation:
        rng = random.Random(seed)
        self.lo = rng.randint(1, 10)
        self.hi = self.lo + rng.randint(2, 9)
        self.secret = rng.randint(self.lo, self.hi)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text=f"{self.lo}..{self.hi}=")

    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> GuessObservation:
        self._state.step_count += 1
        text = action.guess.strip()
        if not text.lstrip("-").isdigit():
            return GuessObservation(text="a number=", reward=0.0)
        g = int(text)
        consistent = 0.1 if self.lo <= g <= self.hi else 0.0
        if g == self.secret:
            return GuessObservation(text="found", reward=1.0, done=True)
        if g < self.secret:
            self.lo = max(self.lo, g + 1)
        else:
            self.hi = min(self.hi, g - 1)
        return GuessObservation(text="higher=" if g < self.secret else "lower=", reward=consistent)

    @property
    def state(self) -> State:
        return self._state


class QuietDisconnects:
    """ASGI middleware: a WebSocket session the client ended is not an error. openenv-core
    0.3.0's /ws endpoint, when a client sends "close" and hangs up (as its own client does),
    destroys the session and then closes the socket the client already closed; starlette
    raises WebSocketDisconnect out of the app, and uvicorn logs a traceback for every session
    (thousands in a training run). The session is already destroyed by then: the exception
    is dropped here, for WebSocket connections only."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def make_app(max_sessions: int = 256) -> Any:
    app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                     max_concurrent_envs=max_sessions)
    app.add_middleware(QuietDisconnects)
    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    a = ap.parse_args(argv)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # bound and accepting: say where (log_level=warning prints nothing else)
                print(f"openenv guess env: listening on http://{a.host}:{a.port} (sessions: ws://{a.host}:{a.port}/ws)",
                      flush=True)

    Server(uvicorn.Config(make_app(), host=a.host, port=a.port, log_level="warning")).run()


if __name__ == "__main__":
    main()
