"""The rollout role: samples `rollout.n` completions per prompt with the current policy.

Consumes a Batch of prompts (text + task fields such as `answer`); produces the
rows of the step: prompt/response ids and masks, the engine's behaviour logprobs, the
finish reason, the decoded completion and the policy version that sampled each row.

The engine is chosen by name (`rollout.engine`: embedded | vllm, `baton.rollout.engines`),
the weight sync too (`rollout.weight_sync`, `baton.sync.registry`; `auto` picks below).
Colocated with the actor (the default), the embedded engine is handed the actor's `Policy`
handle and reads its parameters in place: no copy; weight sync goes through the `inplace`
transport (a version bump), the same interface the checkpoint and broadcast transports
implement. An engine with weights of its own (vLLM) gets them through `copy`.

A sharded actor (fsdp2 or tensor parallel: `Policy.in_place` is False) cannot be read in
place: the engine then holds a plain copy of the model, filled by the `copy` transport from
full tensors gathered one at a time (every rank takes part). The copy exists only from a
sync to the end of the next `generate`: it is discarded (`sleep_mode="discard"`) while the
actor trains, so the update phase holds shards only; the rollout phase holds the shards
plus one full model.

On a GPU the engine samples in the trainer's compute dtype (`Policy.compute_dtype`: bf16
when `actor.bf16` resolves true, `baton.models.precision`): with fp32 master weights that is
a bf16 copy of its own, refilled by the `copy` transport at each sync and discarded while the
actor trains (LoRA, or an explicit `rollout.weight_sync: inplace`: the fp32 module in place).
A call that finds the copy discarded or older than the policy with no sync since (the step
after an evaluation, a redraw within a step) refills it first (`_wake`).
Between calls the engine sleeps (its KV cache released; `sleep_mode` says what else), so
the actor's update has the memory; every entry point wakes it first. Peak memory of the
rollout phase: `memory/peak_gib_rollout` (CUDA only, reported with the actor's update).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from baton import fields as F
from baton.agents.dispatch import EPISODES
from baton.batch import Batch
from baton.controller import Dispatch, Execute, Worker, register
from baton.data.records import prompt_ids
from baton.envs import get_task
from baton.envs.evaluate import TaskScorer, evaluate
from baton.models.load import build_like
from baton.models.lora import is_peft
from baton.models.precision import autocast, memory_phase
from baton.protocol import Completion, SamplingParams
from baton.rollout.grammars import response_format_grammar
from baton.rollout.embedded.kv_budget import check_budget_options
from baton.rollout.engines import DEFAULT_ENGINE, build_engine, check_engine_name, engine_class
from baton.rows import Trajectory, group_ids, to_batch
from baton.sync import build_transport, check_logprob_parity, resolve_weight_sync
from baton.sync.registry import check_weight_sync_name
from baton.workers.policy import Policy


BASELINE_COMPLETION = "baseline_completion"  # str per row: the greedy response to its prompt (ReMax)


@dataclass
class RolloutConfig:
    """The recipe's `rollout:` section."""
    n: int = 8  # samples per prompt (the GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    engine: str = DEFAULT_ENGINE  # embedded | vllm (baton.rollout.engines)
    # how the engines get the trainer's weights (baton.sync.registry): auto = inplace / copy
    # when colocated, object_store for a generator on its own pool, broadcast for data.servers
    weight_sync: str = "auto"
    # constrain every completion, as OpenAI's response_format: {type: json_object} or
    # {type: json_schema, json_schema: {name, schema}} (constrained decoding, the embedded
    # engine, the `structured` extra; logprobs are the masked distribution's: see
    # baton.rollout.constrained for what PPO then needs). None: free text.
    response_format: dict | None = None
    # the KV-cache tokens a generate call holds at once (rows x (prompt + max_new_tokens)),
    # fixed; None: sized from the memory free when the call starts (rollout.memory_fraction)
    max_batch_tokens: int | None = None
    # the share of the device's free memory (after weights, gradients, optimizer state) the
    # embedded engine's KV cache and sampling may take; None: 0.8 unless max_batch_tokens is given
    memory_fraction: float | None = None
    # routing replay (a mixture of experts, the embedded engine; docs/MOE.md): the engine records
    # the experts each sampled token came from, the rows carry them (`routing`) and the trainer's
    # forwards (update, old logprobs, reference) route those tokens by them
    routing_replay: bool = False

    def engine_budget(self) -> dict:
        """The options to build the engine with: the KV budget (only those given), and routing
        recording when routing replay is on."""
        return {**{k: v for k, v in (("max_batch_tokens", self.max_batch_tokens),
                                     ("memory_fraction", self.memory_fraction)) if v is not None},
                **({"record_routing": True} if self.routing_replay else {})}

    @property
    def grammar(self) -> str | None:
        """`response_format` as the grammar SamplingParams carries (None: unconstrained)."""
        return response_format_grammar(self.response_format)

    def check(self) -> None:
        check_engine_name(self.engine)
        check_weight_sync_name(self.weight_sync)
        try:
            check_budget_options(self.max_batch_tokens, self.memory_fraction)
        except ValueError as e:
            raise ValueError(f"rollout: {e}") from None
        if self.routing_replay and self.engine != "embedded":
            raise ValueError(f"rollout.routing_replay records the experts in the embedded engine; rollout.engine="
                             f"{self.engine} does not return them here: use rollout.engine=embedded")
        if self.memory_fraction is not None and self.engine != "embedded":
            raise ValueError(f"rollout.memory_fraction sizes the embedded engine's KV cache; rollout.engine="
                             f"{self.engine} sizes its own: leave it unset")
        try:
            grammar = self.grammar
        except ValueError as e:
            raise ValueError(f"rollout.response_format: {e}") from None
        if grammar is not None and self.engine != "embedded":
            raise ValueError(f"rollout.response_format needs constrained decoding, which rollout.engine="
                             f"{self.engine} does not do here: use rollout.engine=embedded")
        if grammar is not None:
            from baton.rollout.constrained import check_grammar

            try:
                check_grammar(grammar)
            except (ImportError, ValueError) as e:
                raise ValueError(f"rollout.response_format: {e}") from None
        # SamplingParams owns the ranges; build one to check them with its messages.
        try:
            SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                           max_new_tokens=self.max_new_tokens)
        except ValueError as e:
            raise ValueError(f"rollout: {e}") from None

    def check_sync(self, where: str) -> str:
        """`weight_sync` resolved for an engine `where` ("colocated", "generator", "servers"):
        auto made concrete, an explicit name the placement cannot use refused (one line)."""
        return resolve_weight_sync(self.weight_sync, where, shares_module=engine_class(self.engine).shares_module)


def completions_to_batch(prompts: Batch, prompt_ids: list[list[int]], done: list[Completion],
                         pad_id: int, tokenizer) -> Batch:
    """Rows of the step, prompt-major: the n samples of prompt i sit at rows i*n .. i*n+n-1,
    each in its prompt's group (`baton.rows.group_ids`)."""
    groups = group_ids(prompts)
    return to_batch([Trajectory(prompt_ids[c.prompt_index], c.token_ids, logprobs=c.logprobs, version=c.version,
                                finish_reason=c.finish_reason, group=groups[c.prompt_index], prompt_row=c.prompt_index,
                                extra={} if c.routing is None else {"routing": c.routing})
                     for c in done], pad_id, tokenizer, prompts=prompts)


class RolloutWorker(Worker):
    """`RolloutWorker(rollout, task=, seed=, probe_prompt=)`: samples with the colocated
    actor's policy (the `Policy` handle of the sibling role "actor", built first).

    `probe_prompt`: the text whose logprobs `sync_weights(check=True)` compares between the
    engine and the trainer (the task provides one; any prompt of the task will do).
    `weight_sync`: overrides `rollout.weight_sync` (a run whose rows come from servers has
    the key name the servers' transport; its colocated engine, used for evaluation, gets "auto")."""

    batch_on_device = False  # prompts are text; the engine places its own tensors
    _scorer: TaskScorer | None = None  # evaluation's verifier calls: made at the first evaluation, kept

    def __init__(self, rollout: RolloutConfig, *, task: str, seed: int, probe_prompt: str,
                 weight_sync: str | None = None, verifier_timeout_s: float = 5.0):
        super().__init__()
        self.cfg, self.task, self.seed = rollout, get_task(task), seed
        self.verifier_timeout_s = verifier_timeout_s  # evaluation's verifier calls: reward.timeout_s
        self.policy: Policy = self.sibling("actor").policy  # colocated: share the module, no copy
        self.tokenizer = self.policy.tokenizer
        in_place = self.policy.in_place
        requested = weight_sync or rollout.weight_sync
        dtype = self.engine_dtype(self.policy, requested)
        shares = in_place and engine_class(rollout.engine).shares_module and dtype is None
        sync = resolve_weight_sync(requested, "colocated", shares_module=shares)
        self.own_weights = sync != "inplace"  # the engine holds a copy, filled by each sync
        module = build_like(self.policy.module, self.device, dtype) if self.own_weights else self.policy.module
        # fuse_weights=False: read the actor's parameters as they are, no packed copy
        # (measured: no slower for the demo model, bench/engine_throughput.py has the rest).
        self.engine = build_engine(rollout.engine, module, self.tokenizer, fuse_weights=False,
                                   sleep_mode="discard" if self.own_weights else "cache", **rollout.engine_budget())
        self.engine.version = self.policy.version  # an own copy ("discard") lays itself out for fewer matmuls
        self.sync = build_transport(sync, "colocated", [self.engine])
        self._weights_of: int | None = None  # the policy version of the engine's own copy (None: not held)
        if self.own_weights:  # fill the engine's copy (sharded actor: a collective)
            self._fill(self.policy.version)
        self.probe_ids = prompt_ids(self.tokenizer, probe_prompt)

    @staticmethod
    def engine_dtype(policy: Policy, weight_sync: str) -> torch.dtype | None:
        """The dtype of an engine copy the trainer's weights must be cast to (None: the
        engine can read them as they are): the policy's compute dtype when its weights are
        stored wider (fp32 master weights, bf16 on a GPU), unless LoRA (the live adapters are
        read in place) or an explicit `inplace` sync asks for the module itself."""
        want = policy.compute_dtype
        have = next(policy.module.parameters()).dtype
        lora = is_peft(policy.module)
        if want is None or want == have or lora or weight_sync not in ("auto", "copy"):
            return None
        return want

    def _fill(self, version: int) -> None:
        """Copy the policy's weights into the engine's own copy, labelled `version` (a
        sharded actor gathers them: every rank takes part)."""
        self.sync.push(self.policy.named_weights(), version)
        self._weights_of = self.policy.version

    def _wake(self, collective: bool = True) -> None:
        """Before the engine runs: back from the sleep that followed its last call, holding
        the trainer's weights. An own copy that was discarded with no sync since (after an
        evaluation's episodes, or a redraw within a step) or that holds an older policy
        version (the actor moved on without a sync) is refilled here, its label kept: the
        weights are the policy's, the version is the last sync's. `collective=False` (a call
        on rank 0 only): a sharded actor cannot gather, so only an unsharded one refills."""
        self.engine.wake()
        if not self.own_weights or self._weights_of == self.policy.version:
            return
        if collective or self.policy.in_place:
            self._fill(self.engine.version)

    def _rest(self, generated: bool = True) -> None:
        """After the engine ran (its KV cache is released by then): sleep, which gives the
        cached CUDA memory back and, after a generation, frees an own copy of the weights (it
        lives from a fill to the end of the next generation: the next sync or `_wake` refills
        it), so the actor's update has the memory."""
        if generated or not self.own_weights:
            self.engine.sleep()
            if self.own_weights:
                self._weights_of = None  # discarded (sleep_mode="discard")

    def sampling_seed(self, step: int) -> int:
        """The sampling seed of trainer step `step` on this rank: (seed, step, dp rank), so a
        resumed run samples exactly what the uninterrupted run would have."""
        return self.seed * 1_000_003 + step * 1009 + self.dp_rank

    def sampling_params(self, seed: int | None = None) -> SamplingParams:
        r = self.cfg
        return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_new_tokens=r.max_new_tokens, seed=seed, grammar=r.grammar)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def generate(self, prompts: Batch, step: int, greedy_baseline: bool = False) -> Batch:
        """Consumes prompts (text) for trainer step `step`; produces len(prompts) * n rows
        (see module docstring), seeded by (seed, step, dp rank): a resumed run samples exactly
        what the uninterrupted run would have.

        greedy_baseline: also decode one greedy response per prompt (ReMax's baseline) and
        put its text on each of the prompt's rows as `baseline_completion`; the driver scores
        it like any completion."""
        t0 = time.perf_counter()
        seed = self.sampling_seed(step)
        ids = [prompt_ids(self.tokenizer, p) for p in prompts[F.PROMPT_TEXT]]  # text, or chat messages
        params = self.sampling_params(seed=seed)
        self._wake()
        with memory_phase("rollout", self.device):
            done = self.engine.generate(ids, params)
        # prompts.repeat keeps dispatch padding trailing (n rows per padded prompt)
        rows = completions_to_batch(prompts, ids, done, self.tokenizer.pad_token_id, self.tokenizer)
        if greedy_baseline:
            greedy = self.engine.generate(ids, SamplingParams(n=1, temperature=0.0, grammar=self.cfg.grammar,
                                                              max_new_tokens=self.cfg.max_new_tokens))
            texts = self.tokenizer.batch_decode([c.token_ids for c in sorted(greedy, key=lambda c: c.prompt_index)],
                                                skip_special_tokens=True)
            rows[BASELINE_COMPLETION] = [t for t in texts for _ in range(params.n)]
        self._rest()  # the KV cache (and an own copy: sync refills it) freed while the actor trains
        rows.meta[F.GENERATE_S] = time.perf_counter() - t0  # queue health (baton.trainers.report.queue_health)
        return rows

    @register(dispatch=EPISODES)  # every rank's rows and counts (a rank may drop all its rows)
    def generate_episodes(self, prompts: Batch, step: int, agent_cfg: dict, greedy: bool = False) -> Batch:
        """Multi-turn agent rows (baton.sources.episodes): rollout.n episodes per prompt (one,
        temperature 0, with greedy: evaluation), their turns batched through this engine;
        seeded like `generate`; also run by `GeneratorWorker` (a generator of its own: the
        version it last loaded is on the rows). Hook of h-agents."""
        from baton.agents.config import AgentConfig
        from baton.agents.rollout import run_episodes

        t0 = time.perf_counter()
        seed = self.sampling_seed(step)
        params = SamplingParams(n=1, temperature=0.0) if greedy else self.sampling_params(seed=seed)
        self._wake()
        with memory_phase("rollout", self.device):
            rows, _ = run_episodes(self.engine, self.tokenizer, prompts.unpadded(), 1 if greedy else self.cfg.n,
                                   AgentConfig(**agent_cfg), params)
        self._rest()
        rows.meta[F.GENERATE_S] = time.perf_counter() - t0
        return rows

    @register(dispatch=Dispatch.DP_COMPUTE)
    def generate_sessions(self, prompts: Batch, step: int, gateway_cfg: dict, greedy: bool = False) -> Batch:
        """Rows of an OpenAI-speaking agent's sessions through a gateway on this engine
        (data.source: gateway, baton.agents.gateway_run): rollout.n per prompt at the run's
        temperature (one at temperature 0 with greedy: evaluation). Hook of s-agents."""
        from baton.agents.config import GatewayAgentConfig
        from baton.agents.gateway_run import run_sessions

        t0 = time.perf_counter()
        self._wake()
        with memory_phase("rollout", self.device):
            rows = run_sessions(self.engine, self.tokenizer, prompts.unpadded(), 1 if greedy else self.cfg.n,
                                GatewayAgentConfig(**gateway_cfg), 0.0 if greedy else self.cfg.temperature)
        self._rest()
        rows.meta[F.GENERATE_S] = time.perf_counter() - t0
        return rows

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_weights(self, version: int, check: bool = False) -> float | None:
        """Push the policy's weights to the engine as `version` (colocated: in place).

        With check=True, returns max |engine - trainer| logprob on the probe prompt (the
        runtime check that the engine samples from the policy being trained)."""
        self.engine.wake()  # a no-op unless generate() discarded the engine's own copy
        self._fill(version)
        if not check:
            return None
        # the trainer's side in its own compute precision (bf16 on a GPU: the bound is bf16 noise)
        with autocast(self.device, self.policy.compute_dtype is not None):
            return check_logprob_parity(self.engine, self.policy.module, self.probe_ids, max_new_tokens=4)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_metrics(self) -> dict[str, float]:
        """Called right after `sync_weights`: what the transport moved (sync/bytes,
        sync/seconds, sync/tensors) and `sync/verified`, 1.0 when the engine holds exactly
        the policy's weights (`baton.sync.verify.held_exactly`), else 0.0 (every rank takes
        part: a sharded actor's weights are gathered); NaN for an engine whose weights are not
        torch tensors here (vLLM): not known."""
        from baton.sync.verify import held_exactly, module_tensors

        moved = dict(getattr(self.sync, "last", {}))
        model = self.engine.model  # a declared member (None: its weights live elsewhere)
        if not isinstance(model, torch.nn.Module):
            return {**moved, "sync/verified": float("nan")}
        return {**moved, "sync/verified": float(held_exactly(module_tensors(model), self.policy.named_weights())[0])}

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def evaluate(self, rows: list[dict], greedy: bool) -> dict[str, float]:
        """Held-out accuracy with the current weights (greedy, or 4 samples per prompt), and
        the verifier calls that timed out or failed: {"accuracy", "timeouts", "errors"}.
        An engine with its own copy that no step synced (data.source=api: each step syncs the
        servers) gets the weights first (an unsharded actor: a local copy; the label stays)."""
        r = self.cfg
        if self._scorer is None:
            self._scorer = TaskScorer(self.task, timeout_s=self.verifier_timeout_s)
        self._wake(collective=False)
        out = evaluate(self.engine, self.tokenizer, self.task, rows, greedy, n=4,
                       max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                       seed=self.seed, grammar=r.grammar, scorer=self._scorer)
        self._rest(generated=False)
        return {key: out[key] for key in ("accuracy", "timeouts", "errors")}
