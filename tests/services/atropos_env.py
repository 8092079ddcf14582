"""An environment written with atroposlib (0.4.0), run unchanged against `baton api`.

atroposlib needs transformers 4.x (baton uses 5.x), so this runs from a virtual environment
of its own and talks to baton over HTTP only:

    python3 -m venv /work/atropos-venv/.venv
    /work/atropos-venv/.venv/bin/pip install atroposlib==0.4.0 "transformers>=4.46,<5"
    /work/atropos-venv/.venv/bin/python tests/services/atropos_env.py \\
        --api http://127.0.0.1:8000 --server http://127.0.0.1:8001 --tokenizer checkpoints/arith-sft

Everything between the environment and the API is atroposlib's own `BaseEnv` machinery:
/register-env and its wait-for-trainer loop, /status-env (a JSON body on a GET), the worker
throttling, gzip-compressed /scored_data posts, /disconnect-env. Only the sampling is ours:
`collect_trajectories` asks baton serve's token-in/token-out /generate for a group (with the
behaviour logprobs; atroposlib's OpenAI client path needs a chat-capable model). The task
is the arithmetic demo's. `tests/services/test_atropos_lib.py` runs it (marked slow; skipped
when the venv is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import tempfile

import httpx
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup


class ArithmeticAtroposEnv(BaseEnv):
    name = "arith_atropos"
    generate_url = ""

    async def setup(self) -> None:
        self.rng = random.Random(0)

    async def get_next_item(self):
        terms = [self.rng.randint(0, 9) for _ in range(self.rng.randint(2, 5))]
        return "+".join(map(str, terms)) + "=", str(sum(terms))

    async def collect_trajectories(self, item):
        prompt, answer = item
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(self.generate_url, json={
                "input_ids": ids, "return_logprob": True,
                "sampling_params": {"n": self.config.group_size, "max_new_tokens": 4, "temperature": 1.0,
                                    "stop_token_ids": [eos]}})
            r.raise_for_status()
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[])
        for out in r.json():
            resp = out["output_ids"]
            text = self.tokenizer.decode(resp, skip_special_tokens=True).strip()
            group["tokens"].append(ids + resp)
            group["masks"].append([-100] * len(ids) + resp)
            group["scores"].append(1.0 if text == answer else 0.0)
            group["inference_logprobs"].append([1.0] * len(ids) + [x[0] for x in out["meta_info"]["output_token_logprobs"]])
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        return None


def tokenizer_for_transformers4(path: str) -> str:
    """transformers 5 saves `tokenizer_class: TokenizersBackend`, which 4.x does not know: a
    copy whose config names PreTrainedTokenizerFast (same tokenizer.json, same ids)."""
    cfg_path = os.path.join(path, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("tokenizer_class") != "TokenizersBackend":
        return path
    out = tempfile.mkdtemp(prefix="atropos-tok-")
    shutil.copy(os.path.join(path, "tokenizer.json"), out)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=600)
    args = ap.parse_args()
    config = BaseEnvConfig(group_size=args.group_size, use_wandb=False, rollout_server_url=args.api,
                           wandb_name=ArithmeticAtroposEnv.name,  # atroposlib's CLI sets it so
                           tokenizer_name=tokenizer_for_transformers4(args.tokenizer), total_steps=-1, max_token_length=64,
                           ensure_scores_are_not_same=False, max_num_workers=4, steps_per_eval=10**9)
    servers = [APIServerConfig(model_name="arith-sft", base_url=f"{args.server}/v1", api_key="x",
                               num_requests_for_eval=1)]
    ArithmeticAtroposEnv.generate_url = f"{args.server}/generate"
    env = ArithmeticAtroposEnv(config, servers, testing=False)
    try:
        await asyncio.wait_for(env.env_manager(), timeout=args.seconds)
    except asyncio.TimeoutError:
        pass


if __name__ == "__main__":
    asyncio.run(main())
