"""The generation endpoints of `baton serve`: /v1/completions, /v1/chat/completions, /generate.

Request/response shapes are documented in `baton/rollout/server/app.py`. Every request is
checked by `srv.check_request` (token ids, context length, token caps) before it is queued.
Top-N logprobs: `logprobs.py`; tools and tool_choice: `tools.py`; response_format and forced
tool calls by constrained decoding: `structured.py` (its grammar checked off the event loop,
on the tokenizer's thread: a big schema takes CPU seconds to compile); streaming: `stream.py`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request

from baton.http import guarded_router
from baton.rollout.server.logprobs import alternatives, can_score
from baton.rollout.server.stream import ChatStream, CompletionStream, include_usage, stream_response
from baton.rollout.server.tools import (assistant_message, check_tools, forced_message, forced_opening,
                                        message_dicts, render)
from baton.rollout.server.structured import chat_grammar, constrains, generate_grammar
from baton.rollout.server.schemas import (ChatCompletionRequest, CompletionRequest, GenerateRequest, stop_list,
                                          unsupported)
from baton.protocol import GRAMMAR_ERROR, Completion, SamplingParams


MIN_TEMPERATURE = 1e-5  # below it (and above 0) logits / T overflows: NaN tokens and logprobs


def add_generation_routes(app: FastAPI, srv, responses: dict[int, Any] | None = None) -> None:
    """`srv` is the server's shared state (`baton.rollout.server.state._Server`); `responses`
    documents the routes' error answers in the OpenAPI schema."""
    app.include_router(openai_routes(srv, responses))
    app.include_router(generate_routes(srv, responses))


def openai_routes(srv, responses: dict[int, Any] | None = None) -> APIRouter:
    """/v1/completions and /v1/chat/completions (streamed or not)."""
    router = guarded_router()

    @router.post("/v1/completions", responses=responses)
    async def completions(req: CompletionRequest, request: Request) -> Any:
        srv.check_model(req.model)
        lora = srv.lora_for(req.model)
        _reject_unsupported(req, can_score(srv.engine, lora))
        prompts = await _completion_prompts(srv, req.prompt)
        stops = stop_list(req.stop)
        max_new = req.max_tokens if req.max_tokens is not None else srv.default_tokens(prompts)
        # compiling a grammar to check it (a 3 MB schema: ~0.8 s of CPU) runs off the event loop
        grammar = await srv.off_loop(chat_grammar, srv.engine, req.response_format, None, None)
        params = _params(n=req.n, max_new_tokens=max_new,
                         temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                         stop=stops, stop_token_ids=req.stop_token_ids, seed=req.seed, ignore_eos=req.ignore_eos,
                         lora=lora, grammar=grammar)

        async def answer(on_progress: Any = None) -> dict[str, Any]:
            comps = await srv.generate(request, prompts, params, on_progress)
            return await _completion_answer(srv, req, prompts, stops, comps)

        if req.stream:
            return await stream_response(answer, CompletionStream(srv.model_name, srv.tokenizer, stops,
                                                                  include_usage=include_usage(req.stream_options)))
        return await answer()

    @router.post("/v1/chat/completions", responses=responses)
    async def chat(req: ChatCompletionRequest, request: Request) -> Any:
        srv.check_model(req.model)
        lora = srv.lora_for(req.model)
        _reject_unsupported(req, can_score(srv.engine, lora))
        tok = srv.need_tokenizer()
        tools = check_tools(req.tools, req.tool_choice)
        grammar = await srv.off_loop(chat_grammar, srv.engine, req.response_format, tools, req.tool_choice)
        # a forced tool_choice: a grammar, or (engines without one) the call's opening prefilled
        opening = forced_opening(req.tool_choice) if tools and not constrains(srv.engine) else ""
        try:
            messages = message_dicts(req.messages)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc
        text = await srv.off_loop(  # off the event loop, as the tokenizing below
            render, tok, messages, tools, req.add_generation_prompt, **(req.chat_template_kwargs or {}))
        text += opening  # a forced tool_choice: the call's opening is prefilled
        # the template already holds any BOS it wants
        prompt = await srv.off_loop(lambda: list(tok(text, add_special_tokens=False)["input_ids"]))
        stops = stop_list(req.stop)
        max_new = req.max_completion_tokens or req.max_tokens or srv.default_tokens([prompt])
        params = _params(n=req.n, max_new_tokens=max_new, temperature=req.temperature, top_p=req.top_p,
                         top_k=req.top_k, min_p=req.min_p, stop=stops, stop_token_ids=req.stop_token_ids,
                         seed=req.seed, ignore_eos=req.ignore_eos, lora=lora, grammar=grammar)

        async def answer(on_progress: Any = None) -> dict[str, Any]:
            comps = await srv.generate(request, [prompt], params, on_progress)
            return await _chat_answer(srv, req, prompt, stops, comps, tools, opening)

        if req.stream:
            return await stream_response(answer, ChatStream(srv.model_name, tok, stops, tools=tools is not None,
                                                            forced=bool(opening),
                                                            include_usage=include_usage(req.stream_options)))
        return await answer()
    return router


def generate_routes(srv, responses: dict[int, Any] | None = None) -> APIRouter:
    """/generate: SGLang's native shape (token ids in, ids and logprobs out)."""
    router = guarded_router()

    @router.post("/generate", responses=responses)
    async def generate(req: GenerateRequest, request: Request) -> Any:
        sp = req.sampling_params
        _reject_unsupported(req)
        _reject_unsupported(sp)
        if req.stream:
            raise HTTPException(400, "stream=True is not supported by /generate (use /v1/completions)")
        if (req.text is None) == (req.input_ids is None):
            raise HTTPException(400, "give exactly one of 'text' and 'input_ids'")
        if req.input_ids is not None:
            single = not req.input_ids or isinstance(req.input_ids[0], int)
            prompts = [list(req.input_ids)] if single else [list(p) for p in req.input_ids]
        else:
            single = isinstance(req.text, str)
            prompts = await srv.encode_async([req.text] if single else req.text)
        if sp.seed is not None and sp.sampling_seed is not None and sp.seed != sp.sampling_seed:
            raise HTTPException(400, "seed and sampling_seed disagree")
        stops = stop_list(sp.stop)
        grammar = await srv.off_loop(generate_grammar, srv.engine, sp.json_schema, sp.regex, sp.grammar)
        params = _params(n=sp.n, max_new_tokens=sp.max_new_tokens, temperature=sp.temperature, top_p=sp.top_p,
                         top_k=sp.top_k, min_p=sp.min_p, stop=stops, stop_token_ids=sp.stop_token_ids,
                         seed=sp.seed if sp.seed is not None else sp.sampling_seed, ignore_eos=sp.ignore_eos,
                         lora=srv.lora_for(req.lora_path),
                         grammar=grammar)
        comps = await srv.generate(request, prompts, params)
        rid = req.rid if isinstance(req.rid, str) else uuid.uuid4().hex
        outs = [_generate_item(srv, c, prompts, stops, req.return_logprob, f"{rid}-{i}") for i, c in enumerate(comps)]
        return outs[0] if single and sp.n == 1 else outs
    return router


async def _completion_answer(srv, req: CompletionRequest, prompts: list[list[int]], stops: list[str],
                             comps: list[Completion]) -> dict[str, Any]:
    """The text_completion response for a finished generation."""
    top = await alternatives(srv, prompts, comps, req.temperature, req.logprobs) if (req.logprobs or 0) > 1 \
        else None
    choices = []
    for i, c in enumerate(comps):
        choice: dict[str, Any] = {"index": i, "text": srv.text(c, stops), "finish_reason": c.finish_reason,
                                  "logprobs": None}
        if req.logprobs is not None:
            toks = [srv.token_str(t, req.return_tokens_as_token_ids) for t in c.token_ids]
            offsets, pos = [], 0
            for s in toks:
                offsets.append(pos)
                pos += len(s)
            if top is not None:
                tops = [{**{srv.token_str(t, req.return_tokens_as_token_ids): v for t, v in alts}, s: lp}
                        for s, lp, alts in zip(toks, c.logprobs, top[i])]
            else:
                tops = [{s: lp} for s, lp in zip(toks, c.logprobs)] if req.logprobs > 0 else None
            choice["logprobs"] = {"tokens": toks, "token_logprobs": c.logprobs, "text_offset": offsets,
                                  "top_logprobs": tops}
        if req.return_token_ids:
            choice["token_ids"] = c.token_ids
            choice["prompt_token_ids"] = prompts[c.prompt_index]
        choices.append(choice)
    out = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
           "model": srv.model_name, "choices": choices, "usage": _usage(prompts, comps),
           "system_fingerprint": f"baton-v{srv.engine.version}"}
    return out


async def _chat_answer(srv, req: ChatCompletionRequest, prompt: list[int], stops: list[str],
                       comps: list[Completion], tools: list[dict[str, Any]] | None, opening: str) -> dict[str, Any]:
    """The chat.completion response for a finished generation."""
    k = req.top_logprobs or 0
    top = await alternatives(srv, [prompt], comps, req.temperature, k) if req.logprobs and k > 1 else None
    choices = []
    for i, c in enumerate(comps):
        if opening:
            message, called = forced_message(opening, srv.text(c, stops))
        else:
            message, called = assistant_message(srv.text(c, stops), parse=tools is not None)
        choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None,
                                  "finish_reason": "tool_calls" if called and c.finish_reason == "stop"
                                  else c.finish_reason}  # a call cut short is "length", as OpenAI's
        if req.logprobs:
            content = []
            for j, (t, lp) in enumerate(zip(c.token_ids, c.logprobs)):
                entry = _logprob_entry(srv, t, lp, req.return_tokens_as_token_ids)
                if top is not None:  # the alternatives, the chosen token with the engine's own number
                    entry["top_logprobs"] = [_logprob_entry(srv, a, lp if a == t else v,
                                                            req.return_tokens_as_token_ids) for a, v in top[i][j]]
                else:
                    entry["top_logprobs"] = [dict(entry)] if req.top_logprobs else []
                content.append(entry)
            choice["logprobs"] = {"content": content}
        if req.return_token_ids:
            choice["token_ids"] = c.token_ids
        choices.append(choice)
    out = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
           "model": srv.model_name, "choices": choices, "usage": _usage([prompt], comps)}
    if req.return_token_ids:
        out["prompt_token_ids"] = prompt
    return out


def _params(*, n: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int, min_p: float,
            stop: list[str], stop_token_ids: list[int] | None, seed: int | None, ignore_eos: bool,
            lora: str | None = None, grammar: str | None = None) -> SamplingParams:
    if 0 < temperature < MIN_TEMPERATURE:
        raise HTTPException(400, f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {temperature:g}")
    try:
        return SamplingParams(n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              top_k=max(top_k, 0), min_p=min_p, stop=stop, stop_token_ids=list(stop_token_ids or []),
                              seed=seed, ignore_eos=ignore_eos, lora=lora, grammar=grammar)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc


def _reject_unsupported(req, top_logprobs_why: str | None = None) -> None:
    reason = unsupported(req, top_logprobs_why)
    if reason:
        raise HTTPException(400, reason)


def _logprob_entry(srv, token_id: int, logprob: float, as_ids: bool) -> dict[str, Any]:
    s = srv.token_str(token_id, as_ids)
    return {"token": s, "logprob": logprob, "bytes": list(s.encode())}


def _usage(prompts: list[list[int]], comps: list[Completion]) -> dict:
    p = sum(len(x) for x in prompts)
    c = sum(len(x.token_ids) for x in comps)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def _completion_prompts(srv, prompt) -> list[list[int]]:
    """OpenAI `prompt`: str | [str] | [int] (one tokenized prompt) | [[int]]."""
    if isinstance(prompt, str):
        return await srv.encode_async([prompt])
    if not prompt:
        raise HTTPException(400, "prompt is empty")
    if isinstance(prompt[0], int):
        return [list(prompt)]
    if isinstance(prompt[0], str):
        return await srv.encode_async(prompt)
    return [list(p) for p in prompt]


def _generate_item(srv, c: Completion, prompts: list[list[int]], stops: list[str], logprobs: bool, rid: str) -> dict:
    if c.finish_reason == "stop":
        finish = {"type": "stop", "matched": c.token_ids[-1] if c.token_ids else None}
    elif c.finish_reason == GRAMMAR_ERROR:
        finish = {"type": GRAMMAR_ERROR, "message": "the grammar allowed no further token before it was complete"}
    else:
        finish = {"type": "length", "length": len(c.token_ids)}
    meta: dict[str, Any] = {"id": rid, "finish_reason": finish, "prompt_tokens": len(prompts[c.prompt_index]),
                            "completion_tokens": len(c.token_ids), "weight_version": c.version}
    if logprobs:
        meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(c.token_ids, c.logprobs)]
    return {"text": srv.text(c, stops), "output_ids": c.token_ids, "meta_info": meta}
