"""The OpenAI gateway: agents that only speak the OpenAI API become token-in/token-out
trajectories for training.

    gw = Gateway(engine=InProcessEngine(engine) | HttpEngine("http://127.0.0.1:8001"), tokenizer=tok)
                                                     # (baton.services.gateway_engines)
    app = gw.app()                                   # serve it (baton.rollout.server.ServerThread)
    POST /sessions {"group": "q17"?}  -> {"session_id", "base_url": "/sessions/<id>/v1"}
    # the agent, unchanged: OpenAI(base_url=f"{gateway_url}/sessions/<id>/v1").chat.completions.create(...)
    POST /sessions/<id>/reward {"reward": 1.0}        -> the session is finished
    POST /sessions/<id>/abort {"reason": "tool"}      -> the session is dropped (never a row)
    GET  /sessions/<id>                               -> its trajectory (ids, mask, logprobs, turns)
    source = GatewayRows(gw, group_size=4)          # rows(step) -> Batch (baton.services.gateway_rows)

A session is one trajectory. Its first request is rendered with the tokenizer's chat
template (tools included) and tokenized: the prompt. Each turn the engine is called with
the trajectory's token ids so far (token in), and the ids it samples are appended as they
came out (token out) with their behaviour logprobs and mask 1; the text is decoded only to
answer the agent. The next request must repeat the conversation so far (as OpenAI clients
do) plus new messages (tool results, user turns); those are the template's delta:

  boundary   what the template writes after the sampled tokens to close the assistant
             turn (ChatML: "\\n" after a sampled <|im_end|>, "<|im_end|>\\n" after a turn
             cut by max_tokens)
  new turns  render(all messages, generation prompt) minus render(messages up to the
             assistant turn)

both tokenized and appended with mask 0 and logprob 0. Sampled text is never re-tokenized.
When the template re-writes an assistant turn (e.g. re-formats a tool call's JSON) so that
its text does not start with the sampled text, the boundary is what follows the end-of-turn
marker, and `Session.boundary_mismatches` counts it. A request whose history differs from
the session's (other roles, edited non-assistant messages, other tools) is a 400: start a
new session.

Finished sessions (a reward reported) become rows (`baton.services.gateway_rows`), one
`baton.rows.Trajectory` each, padded by `baton.rows.to_batch`: prompt_ids/prompt_mask left-padded,
response_ids/response_mask right-padded (mask 0 on template-inserted tokens),
rollout_logprobs 0 on mask-0 tokens, rewards, policy_version (the oldest weights that
sampled any of its turns), token_versions (the weights that sampled each token, -1 on mask 0:
a session's turns may straddle a weight update), finish_reason (of the last turn), completion text and
group_index (rows of one group share it; the advantage estimator groups by it).

Faults: an agent that gives up calls `POST /sessions/<id>/abort {"reason"?}`; a session
idle longer than `GatewayRows(session_idle_s=...)` is dropped as "deadline". A dropped
session never becomes a row (it is not scored 0); its group completes with the sessions
that finished, and `dropped` counts sessions by reason.

Guards (`baton.http`, the same as `baton serve`'s): bodies past
`max_body_bytes` (default 4 MiB, `--max-body-mb`) are a 413 before they are read whole;
strict JSON (NaN, lone surrogates: 400); chat templates rendered and prompts tokenized on a
thread, so /health answers meanwhile; a `model` other than the served name (or its
aliases) is a 404; `tools` for a template that does not render them is a 400; every error
is OpenAI's `{"error": {"message", "type", "param", "code"}}`. `tool_choice` "required" or a
named function and `response_format` are enforced by constrained decoding
(`baton.rollout.server.structured`): the policy samples every token under the grammar's mask
and the trajectory keeps the masked distribution's logprobs (`baton.rollout.constrained`).
An engine without constrained decoding makes them a 400 (a prefilled call would put tokens
the policy did not choose into the trajectory).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from baton.data.turns import assistant_close, boundary_after  # whatever ended the turn (EOS, stop, length)
from baton.http import (DEFAULT_MAX_BODY_BYTES, APIError, OffLoop, check_model, install_guards,
                                        quiet_clients_left_open, run_uvicorn)
from baton.rollout.server.schemas import ChatCompletionRequest, stop_list, unsupported
from baton.rollout.server.stream import ChatStream, include_usage, stream_response
from baton.rollout.server.structured import chat_grammar, constrains
from baton.rollout.server.tools import assistant_message, check_tools, message_dicts, render, template_message
from baton.protocol import SamplingParams
from baton.services.gateway_engines import HttpEngine


@dataclass
class Session:
    """One agent episode as a single token sequence."""
    id: str
    group: str | None
    created: float = field(default_factory=time.monotonic)
    active: float = field(default_factory=time.monotonic)  # when a request last started or ended
    tokens: list[int] = field(default_factory=list)  # prompt + everything after it
    mask: list[int] = field(default_factory=list)  # 1 on sampled tokens
    logprobs: list[float] = field(default_factory=list)  # behaviour logprobs, 0 on mask-0 tokens
    sampled_by: list[int] = field(default_factory=list)  # each token's weight version, -1 on mask-0 tokens
    prompt_len: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation incl. our last answer
    prompt_messages: int = 0  # how many of `messages` the last turn's prompt held
    tools: list[dict[str, Any]] | None = None
    last_sampled: list[int] = field(default_factory=list)
    last_finish: str | None = None
    versions: list[int] = field(default_factory=list)
    turns: int = 0
    boundary_mismatches: int = 0
    reward: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def trajectory(self) -> dict[str, Any]:
        return {"session_id": self.id, "group": self.group, "tokens": list(self.tokens), "mask": list(self.mask),
                "logprobs": list(self.logprobs), "prompt_len": self.prompt_len, "turns": self.turns,
                "reward": self.reward, "finish_reason": self.last_finish, "versions": list(self.versions),
                "token_versions": list(self.sampled_by),
                "boundary_mismatches": self.boundary_mismatches}


class NewSession(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str | None = Field(None, max_length=256)


class Abort(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("aborted", min_length=1, max_length=64)


class Reward(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    reward: float


def _same_turn(known: dict[str, Any], sent: dict[str, Any]) -> bool:
    if known["role"] != sent["role"]:
        return False
    if known["role"] == "assistant":
        return True  # ours: the agent may send it back reshaped (content None, call objects)
    return (known.get("content") or "") == (sent.get("content") or "")


class Gateway:
    """Session-scoped OpenAI endpoints in front of one engine (module docstring)."""

    def __init__(self, engine: Any, tokenizer: Any, model_name: str = "baton", default_max_tokens: int = 256,
                 max_session_tokens: int | None = None, temperature: float | None = None,
                 aliases: tuple[str, ...] = ()):
        self.engine, self.tok, self.model_name = engine, tokenizer, model_name
        self.served_names = [model_name, *(a for a in aliases if a != model_name)]  # what `model` may say
        self.tok_thread: OffLoop | None = None  # renders and tokenizes off the event loop (started by app())
        self.temperature = temperature  # not None: replaces the agent's (the trainer's policy temperature)
        self.default_max_tokens, self.max_session_tokens = default_max_tokens, max_session_tokens
        self.sessions: dict[str, Session] = {}
        self.finished: list[str] = []  # session ids, in the order their rewards came
        self.dropped: dict[str, int] = {}  # reason -> sessions dropped (never scored)
        self.dropped_in: dict[Any, int] = {}  # group -> its sessions dropped so far
        self.cond = threading.Condition()

    # --- sessions ------------------------------------------------------------------------
    def new_session(self, group: str | None = None) -> Session:
        s = Session(id=uuid.uuid4().hex, group=group)
        with self.cond:
            self.sessions[s.id] = s
        return s

    def session(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None:
            raise HTTPException(404, f"no session {sid!r}: create one with POST /sessions")
        return s

    def set_reward(self, sid: str, reward: float) -> None:
        s = self.session(sid)
        if s.reward is not None:
            raise HTTPException(409, f"session {sid!r} already has a reward ({s.reward})")
        if not s.turns:
            raise HTTPException(400, f"session {sid!r} has no turns: nothing to reward")
        with self.cond:
            s.reward = float(reward)
            self.finished.append(sid)
            self.cond.notify_all()

    def abort(self, sid: str, reason: str = "aborted") -> None:
        """Drop an unfinished session: it never becomes a row (and is never scored 0); its
        group completes without it (`take`). Counted by reason in `dropped`."""
        s = self.session(sid)
        with self.cond:
            if s.reward is not None:
                raise HTTPException(409, f"session {sid!r} is finished (rewarded): it cannot be aborted")
            del self.sessions[sid]
            self.dropped[reason] = self.dropped.get(reason, 0) + 1
            if s.group is not None:
                self.dropped_in[s.group] = self.dropped_in.get(s.group, 0) + 1
            self.cond.notify_all()

    def reap(self, idle_s: float) -> int:
        """Drop ("deadline") every unfinished session idle for longer than idle_s (no
        request running or made in that time); returns how many."""
        now = time.monotonic()
        stale = [sid for sid, s in list(self.sessions.items())
                 if s.reward is None and not s.lock.locked() and now - s.active > idle_s]
        for sid in stale:
            try:
                self.abort(sid, "deadline")
            except HTTPException:
                pass  # rewarded or removed meanwhile
        return len(stale)

    def take(self, n: int, timeout_s: float | None = None, idle_s: float | None = None) -> list[Session]:
        """The first complete group, removed from the gateway: `n` finished sessions of one
        group (or, without a group, any `n`), or fewer when the group's other sessions were
        dropped (`abort`, `reap`). Waits for one (TimeoutError past timeout_s); with idle_s,
        reaps idle sessions while it waits."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.cond:
            while True:
                if idle_s is not None:
                    self.reap(idle_s)
                picked = self._pick(n)
                if picked is not None:
                    for sid in picked:
                        self.finished.remove(sid)
                    g = self.sessions[picked[0]].group
                    if g is not None and g in self.dropped_in:
                        self.dropped_in[g] -= n - len(picked)
                        if not self.dropped_in[g]:
                            del self.dropped_in[g]
                    return [self.sessions.pop(sid) for sid in picked]
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no group of {n} finished sessions in {timeout_s:g} s "
                                       f"({len(self.finished)} finished)")
                self.cond.wait(min(left, 0.5) if left is not None else 0.5)

    def _pick(self, n: int) -> list[str] | None:
        by_group: dict[Any, list[str]] = {}
        for sid in self.finished:
            g = self.sessions[sid].group
            by_group.setdefault(g, []).append(sid)
            if len(by_group[g]) == n:
                return by_group[g]
        for g, sids in by_group.items():  # groups that lost sessions complete without them
            if g is not None and len(sids) + self.dropped_in.get(g, 0) >= n:
                return sids[:n]
        return None

    # --- one turn ------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _extend(self, s: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        """Append the template's tokens for the messages after the session's last answer."""
        known = s.messages
        if len(messages) <= len(known) or not all(_same_turn(k, m) for k, m in zip(known, messages)):
            raise HTTPException(400, f"session {s.id}: the messages do not continue this session's conversation "
                                     f"({len(known)} known turns; history edited or reordered): start a new session")
        if tools != s.tools:
            raise HTTPException(400, f"session {s.id}: tools changed mid-session: start a new session")
        prev = known[:s.prompt_messages]
        before = render(self.tok, prev, tools, True)
        closed = render(self.tok, known, tools, False)
        full = render(self.tok, known + messages[len(known):], tools, True)
        if not closed.startswith(before) or not full.startswith(closed):
            raise HTTPException(400, f"session {s.id}: the chat template does not render this conversation "
                                     f"as a prefix of the next (it rewrites history): cannot keep one trajectory")
        boundary = boundary_after(self.tok, s.last_sampled, assistant_close(self.tok))  # the template's close
        sampled = self.tok.decode(s.last_sampled, skip_special_tokens=False)
        s.boundary_mismatches += int(closed[len(before):] != sampled + boundary)  # the template writes it otherwise
        inserted = self._encode(boundary + full[len(closed):])
        s.tokens += inserted
        s.mask += [0] * len(inserted)
        s.logprobs += [0.0] * len(inserted)
        s.sampled_by += [-1] * len(inserted)

    def _start(self, s: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        """The first turn: the rendered conversation is the prompt."""
        s.tools = tools
        s.tokens = self._encode(render(self.tok, messages, tools, True))
        s.mask, s.logprobs, s.prompt_len = [0] * len(s.tokens), [0.0] * len(s.tokens), len(s.tokens)
        s.sampled_by = [-1] * len(s.tokens)

    async def _off_loop(self, fn, *args) -> Any:
        """`fn(*args)` on the gateway's template / tokenizer thread (in-process callers without
        `app()`: on the caller's loop)."""
        return fn(*args) if self.tok_thread is None else await self.tok_thread.run(fn, *args)

    async def chat(self, sid: str, req: ChatCompletionRequest, on_progress: Any = None) -> dict[str, Any]:
        """One turn; `on_progress` (streaming) gets the sampled tokens as they come (engines
        that report them: `InProcessEngine` over a sliced engine)."""
        s = self.session(sid)
        check_model(req.model, self.served_names)
        reason = unsupported(req)
        if reason or req.n != 1:
            raise APIError(400, reason or "n must be 1 in a gateway session (one trajectory)",
                           param=None if reason else "n")
        if req.tool_choice not in (None, "auto", "none") and not constrains(self.engine):
            raise APIError(400, f"tool_choice={req.tool_choice!r} needs constrained decoding, which this gateway's "
                                f"engine does not do: a prefilled call would put tokens the policy did not choose "
                                f"into the trajectory (use 'auto')", param="tool_choice")
        tools = check_tools(req.tools, req.tool_choice)
        grammar = chat_grammar(self.engine, req.response_format, tools, req.tool_choice)
        try:
            messages = message_dicts(req.messages)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc
        async with s.lock:
            s.active = time.monotonic()
            if s.reward is not None or sid not in self.sessions:
                raise HTTPException(409, f"session {sid!r} is finished (rewarded or dropped)")
            await self._off_loop(self._start if not s.turns else self._extend, s, messages, tools)
            max_new = req.max_completion_tokens or req.max_tokens or self.default_max_tokens
            if self.max_session_tokens is not None:
                room = self.max_session_tokens - len(s.tokens)
                if room < 1:
                    raise HTTPException(400, f"session {sid}: {len(s.tokens)} tokens reach the session budget of "
                                             f"{self.max_session_tokens}")
                max_new = min(max_new, room)
            try:
                temperature = req.temperature if self.temperature is None else self.temperature
                params = SamplingParams(n=1, max_new_tokens=max_new, temperature=temperature, top_p=req.top_p,
                                        top_k=max(req.top_k, 0), min_p=req.min_p, stop=stop_list(req.stop),
                                        stop_token_ids=list(req.stop_token_ids or []), seed=req.seed,
                                        ignore_eos=req.ignore_eos, grammar=grammar)
            except ValueError as exc:
                raise HTTPException(400, str(exc)) from exc
            try:
                kw = {} if on_progress is None else {"on_progress": on_progress}  # engines without it: whole
                out = await self.engine.sample(list(s.tokens), params, **kw)
            except HTTPException:
                raise
            except ValueError as exc:  # e.g. the trajectory outgrew the model's context
                raise HTTPException(400, f"session {sid}: generation failed: {exc}") from exc
            except Exception as exc:  # noqa: BLE001 - the engine's failure, not the agent's
                raise HTTPException(502, f"session {sid}: engine failed: {type(exc).__name__}: {exc}") from exc
            s.tokens += out.token_ids
            s.mask += [1] * len(out.token_ids)
            s.logprobs += out.logprobs
            s.sampled_by += [out.version] * len(out.token_ids)
            s.last_sampled, s.last_finish = out.token_ids, out.finish_reason
            s.versions.append(out.version)
            s.turns += 1
            s.active = time.monotonic()
            text = self.tok.decode(out.token_ids, skip_special_tokens=True)
            if out.finish_reason == "stop" and params.stop:  # as OpenAI: the stop string is not returned
                cut = min((i for i in (text.find(x) for x in params.stop if x) if i >= 0), default=-1)
                text = text[:cut] if cut >= 0 else text
            message, called = assistant_message(text, parse=tools is not None)
            s.prompt_messages = len(messages)
            s.messages = messages + [template_message(message)]
        n_prompt = len(s.tokens) - len(out.token_ids)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": "tool_calls" if called and out.finish_reason != "length"
                             else out.finish_reason}],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(out.token_ids),
                          "total_tokens": n_prompt + len(out.token_ids)}}

    # --- HTTP ----------------------------------------------------------------------------
    def app(self, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
        """The HTTP app; with api_key every route but /health needs `Authorization: Bearer
        KEY` (the agent's `OpenAI(api_key=KEY)` sends it). Bodies past max_body_bytes: 413."""
        gw = self

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI):
            gw.tok_thread = mine = OffLoop("baton-gateway-tokenize")
            quiet_clients_left_open()  # an in-process agent's clients may be finalized on this loop
            yield
            mine.close()
            if gw.tok_thread is mine:  # never hand back a closed thread
                gw.tok_thread = None

        app = FastAPI(title="baton gateway", lifespan=lifespan)
        install_guards(app, api_key=api_key, max_body_bytes=max_body_bytes)  # before any route: strict JSON

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok", "sessions": len(gw.sessions), "finished": len(gw.finished),
                    "dropped": dict(gw.dropped)}

        @app.post("/sessions")
        async def create(body: NewSession | None = None) -> dict:
            s = gw.new_session(body.group if body else None)
            return {"session_id": s.id, "base_url": f"/sessions/{s.id}/v1"}

        @app.get("/sessions/{sid}")
        async def show(sid: str) -> dict:
            return gw.session(sid).trajectory()

        @app.post("/sessions/{sid}/reward")
        async def reward(sid: str, body: Reward) -> dict:
            gw.set_reward(sid, body.reward)
            return {"session_id": sid, "reward": body.reward}

        @app.post("/sessions/{sid}/abort")
        async def abort(sid: str, body: Abort | None = None) -> dict:
            gw.abort(sid, body.reason if body else "aborted")
            return {"session_id": sid, "dropped": True}

        @app.get("/sessions/{sid}/v1/models")
        async def models(sid: str) -> dict:
            gw.session(sid)
            return {"object": "list", "data": [{"id": gw.model_name, "object": "model", "created": 0,
                                                "owned_by": "baton", "aliases": gw.served_names}]}

        @app.post("/sessions/{sid}/v1/chat/completions")
        async def chat(sid: str, req: ChatCompletionRequest, request: Request) -> Any:
            if req.stream:
                return await stream_response(
                    lambda progress: gw.chat(sid, req, progress),
                    ChatStream(gw.model_name, gw.tok, stop_list(req.stop), tools=bool(req.tools),
                               include_usage=include_usage(req.stream_options)))
            return await gw.chat(sid, req)

        return app


def gateway_main(argv: list[str] | None = None) -> None:
    """`python -m baton.services.gateway --server URL --tokenizer MODEL_DIR [--port P]`:
    a gateway in front of a running `baton serve` (keys: env BATON_API_KEY for the engine,
    BATON_GATEWAY_KEY for the agents)."""
    import argparse
    import os
    import socket

    ap = argparse.ArgumentParser(prog="baton gateway", description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True, help="the baton serve URL that samples (token in / token out)")
    ap.add_argument("--tokenizer", required=True, help="model dir whose tokenizer and chat template to use")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8002, help="0 picks a free one (printed)")
    ap.add_argument("--model-name", default="baton")
    ap.add_argument("--default-max-tokens", type=int, default=256)
    ap.add_argument("--max-session-tokens", type=int, default=None, help="token budget of one session")
    ap.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20,
                    help="largest request body, MiB (413 beyond; default %(default)s)")
    args = ap.parse_args(argv)
    from baton.models.load import load_tokenizer

    try:
        tok = load_tokenizer(args.tokenizer)
    except Exception as exc:  # noqa: BLE001 - one clear line
        ap.exit(2, f"baton gateway: cannot load a tokenizer from {args.tokenizer}: {exc}\n")
    if not getattr(tok, "chat_template", None):
        ap.exit(2, f"baton gateway: the tokenizer in {args.tokenizer} has no chat template\n")
    gw = Gateway(HttpEngine(args.server, os.environ.get("BATON_API_KEY") or None), tok, args.model_name,
                 args.default_max_tokens, args.max_session_tokens,
                 aliases=(args.tokenizer, os.path.basename(os.path.normpath(args.tokenizer))))
    app = gw.app(os.environ.get("BATON_GATEWAY_KEY") or None, max_body_bytes=int(args.max_body_mb * 2**20))
    sock = socket.create_server((args.host, args.port))
    print(f"baton gateway: http://{args.host}:{sock.getsockname()[1]}/sessions/<id>/v1 -> {args.server}", flush=True)
    run_uvicorn(app, sock)


if __name__ == "__main__":
    gateway_main()
