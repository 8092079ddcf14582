"""tinker-cookbook's `recipes/sl_loop.py` and `recipes/rl_loop.py` (and with --basic its
`sl_basic.py` and `rl_basic.py`), unchanged, against `baton tinker` on this machine's CPU: SL,
then RL from the SL result.

    python scripts/tinker_cookbook_loops.py [--sl-steps 120] [--rl-steps 15] [--work DIR] [--basic]
    python scripts/tinker_cookbook_loops.py --smoke --basic  # 2 steps each (CI's tinker job)

sl_basic and rl_basic are the cookbook's chz recipes (`supervised.train`, `rl.train` with the
Gsm8k environment): built by their own `build_config_blueprint(model_name)`, the dataset
builder replaced by the same class with CPU-sized batches (SL 16; RL 8 questions x 8 samples),
then given command-line arguments as `python -m tinker_cookbook.recipes.sl_basic key=value`
would (base URL, lr, LoRA rank, max_tokens, max_steps); rl_basic's steps follow from its rows
(--rl-steps x 8 questions).

Needs the `tinker` extra and tinker-cookbook 0.6.1 (`pip install --no-deps tinker-cookbook==0.6.1`
plus chz, datasets, blobfile, termcolor, sympy, pylatexenc, math-verify: its `tml-renderers`
pin is not needed by these two loops). What differs from a run on the hosted service is only
what the loops are given, never their code:

  * base_url: a `baton tinker` started here (`python -m baton.cli tinker`, a subprocess);
  * model_name "baton/tiny": a tiny random Qwen2 (`baton make-tiny`, 0.75m, context 1024) with
    baton's byte tokenizer, registered with the cookbook's tokenizer registry and given its
    `role_colon` renderer (the cookbook only knows renderers for the models it names);
  * data: `datasets.load_dataset` answers the two names the loops load with local rows written
    here: "HuggingFaceH4/no_robots" -> chat conversations "What is a+b? <rl_loop's answer suffix>" ->
    "\\boxed{a+b}" after rl_loop's own one-shot example (so SL teaches the prompt RL sees);
    "openai/gsm8k" -> questions "What is a+b?" with answers "... #### a+b" (single digits).
  * RL starts from the SL result: the SL run's final sampler checkpoint merged into its base
    (`baton export --merge`), served by a second `baton tinker`; its loss is
    importance_sampling (the default stable_reinforce is not served).

Prints one line per step (SL: train_mean_nll; RL: reward/total) and a summary line per loop;
exit 1 if a loop fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
NAME = "baton/tiny"
KEY = "tml-baton-local"
LOOPS = ("sl", "rl", "sl_basic", "rl_basic")
FIGURE = {"sl": "train_mean_nll", "sl_basic": "train_mean_nll", "rl": "reward/total", "rl_basic": "env/all/reward/total"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


QUESTION_SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."
SHOT = [  # rl_loop.py's own one-shot prefix, so that SL teaches the prompt RL will see
    {"role": "user", "content": "How many r's are in strawberry?" + QUESTION_SUFFIX},
    {"role": "assistant", "content": "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w "
                                     "6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}"},
]


def write_data(work: Path, n: int, seed: int, max_term: int = 4, sl_random: bool = False) -> tuple[Path, Path]:
    """SL conversations and GSM8K-shaped RL rows on single-digit sums a+b, a, b <= max_term.
    `sl_random`: the SL answers are random digits, so SL teaches the format only and RL has to
    find the sums (a reward that starts near chance and has room to rise)."""
    rng = random.Random(seed)
    sums = [(rng.randint(0, max_term), rng.randint(0, max_term)) for _ in range(n)]
    sl, rl = work / "sl.jsonl", work / "gsm8k_like.jsonl"
    with sl.open("w") as f:
        for a, b in sums:
            shown = rng.randint(0, 2 * max_term) if sl_random else a + b
            f.write(json.dumps({"messages": [*SHOT, {"role": "user", "content": f"What is {a}+{b}?" + QUESTION_SUFFIX},
                                             {"role": "assistant", "content": f"\\boxed{{{shown}}}"}]}) + "\n")
    with rl.open("w") as f:
        for a, b in sums:
            f.write(json.dumps({"question": f"What is {a}+{b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}) + "\n")
    return sl, rl


class Server:
    """`baton tinker MODEL_DIR` in a subprocess, on a free loopback port (served as `name`,
    `extra`: more `baton tinker` options). bench/tinker_vs_baton.py starts its server with it too."""

    def __init__(self, model_dir: Path, state_dir: Path, log: Path, name: str = NAME, extra: tuple[str, ...] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.log = log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "tinker", str(model_dir), "--port",
                                      str(self.port), "--api-key", KEY, "--model-name", name, "--state-dir",
                                      str(state_dir), *extra], stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"baton tinker exited: see {log}")
            try:
                if httpx.get(f"{self.url}/api/v1/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise RuntimeError("baton tinker did not start in 120 s")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def local_data(sl: Path, rl: Path, rl_rows: int | None = None) -> None:
    """The loops' `datasets.load_dataset` calls answered from the local files (their "test"
    splits: the same rows; the GSM8K ones cut to `rl_rows`, which sets rl_basic's steps)."""
    import datasets

    real = datasets.load_dataset
    files = {"HuggingFaceH4/no_robots": sl, "openai/gsm8k": rl}

    def load_dataset(path, *args, split=None, **kwargs):  # name= is the dataset's config ("main")
        if path in files:
            rows = real("json", data_files=str(files[path]), split="train")
            if path == "openai/gsm8k" and rl_rows:
                rows = rows.select(range(rl_rows))
            return rows if split else datasets.DatasetDict({"train": rows, "test": rows})
        return real(path, *args, split=split, **kwargs)

    datasets.load_dataset = load_dataset


def name_the_model(model_dir: Path) -> None:
    """The cookbook's tokenizer and renderer for "baton/tiny" (a model it does not know)."""
    from transformers import AutoTokenizer

    from tinker_cookbook import model_info, tokenizer_utils

    tokenizer_utils.register_tokenizer(NAME, lambda: AutoTokenizer.from_pretrained(str(model_dir)))
    known = model_info.get_recommended_renderer_name
    model_info.get_recommended_renderer_name = lambda name: "role_colon" if name == NAME else known(name)


def metrics(log_path: Path) -> list[dict]:
    path = log_path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_sl(url: str, log_path: Path, steps: int, batch: int, lr: float) -> list[dict]:
    from tinker_cookbook.recipes import sl_loop
    from tinker_cookbook.renderers import TrainOnWhat

    sl_loop.main(sl_loop.Config(base_url=url, log_path=str(log_path), model_name=NAME, batch_size=batch,
                                learning_rate=lr, max_length=1024, lora_rank=16, save_every=0, max_steps=steps,
                                train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE))  # the answer, not the shot
    return metrics(log_path)


def run_rl(url: str, log_path: Path, steps: int, batch: int, group: int, lr: float) -> list[dict]:
    from tinker_cookbook.recipes import rl_loop

    rl_loop.main(rl_loop.Config(base_url=url, log_path=str(log_path), model_name=NAME, batch_size=batch,
                                group_size=group, learning_rate=lr, lora_rank=16, save_every=0, max_tokens=20,
                                loss_fn="importance_sampling", max_steps=steps))
    return metrics(log_path)


def run_basic(recipe: str, url: str, log_path: Path, steps: int, lr: float) -> list[dict]:
    """sl_basic / rl_basic as their `__main__` runs them: their own blueprint, its dataset
    builder swapped for the same class with CPU-sized batches (an instance in the blueprint,
    so not reachable by `key=value`), then command-line arguments."""
    import importlib

    from tinker_cookbook.renderers import TrainOnWhat

    module = importlib.import_module(f"tinker_cookbook.recipes.{recipe}")
    if recipe == "sl_basic":
        from tinker_cookbook.recipes.chat_sl.chat_datasets import NoRobotsBuilder
        from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

        builder = NoRobotsBuilder(common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=NAME, renderer_name="role_colon", max_length=1024, batch_size=16,
            train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE))  # the answer, not the shot
        argv = ["eval_every=0", f"max_steps={steps}"]
    else:
        from tinker_cookbook.recipes.math_rl.math_env import Gsm8kDatasetBuilder

        builder = Gsm8kDatasetBuilder(batch_size=8, group_size=8, renderer_name="role_colon",
                                      model_name_for_tokenizer=NAME)
        argv = ["max_tokens=20"]
    blueprint = module.build_config_blueprint(NAME).apply({"dataset_builder": builder})
    config = blueprint.make_from_argv([f"base_url={url}", f"log_path={log_path}", f"learning_rate={lr}",
                                       "lora_rank=16", "save_every=0", *argv])
    module.main(config)
    return metrics(log_path)


def sampler_dir(state_dir: Path, log_path: Path) -> Path:
    """The server-side dir of the loop's final sampler checkpoint (checkpoints.jsonl's path)."""
    records = [json.loads(x) for x in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    path = next(r["sampler_path"] for r in reversed(records) if r.get("sampler_path"))
    model, kind, name = path.removeprefix("tinker://").split("/")
    return state_dir / model.replace(":", "_") / kind / name


def child(loop: str, url: str, log_path: Path, steps: int, model_dir: Path, work: Path, rl_lr: float) -> int:
    """One loop in this process (a fresh one per loop: the SDK's session ends with it)."""
    local_data(work / "sl.jsonl", work / "gsm8k_like.jsonl", rl_rows=8 * steps if loop == "rl_basic" else None)
    name_the_model(model_dir)
    if loop == "sl":
        run_sl(url, log_path, steps, batch=16, lr=5e-3)
    elif loop == "rl":
        run_rl(url, log_path, steps, batch=8, group=8, lr=rl_lr)
    else:
        run_basic(loop, url, log_path, steps, lr=5e-3 if loop == "sl_basic" else rl_lr)
    return 0


def run_loop(loop: str, model_dir: Path, state: Path, work: Path, steps: int,
             rl_lr: float) -> tuple[list[dict], float]:
    """`baton tinker` on `model_dir`, the loop in a child process against it; its metrics."""
    server = Server(model_dir, state, work / f"server-{loop}.log")
    try:
        t0 = time.monotonic()
        subprocess.run([sys.executable, __file__, "--child", loop, "--url", server.url, "--model", str(model_dir),
                        "--steps", str(steps), "--work", str(work), "--rl-lr", str(rl_lr)], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
        return metrics(work / f"{loop}-log"), time.monotonic() - t0
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("runs/tinker-cookbook"))
    ap.add_argument("--sl-steps", type=int, default=120)
    ap.add_argument("--rl-steps", type=int, default=15)
    ap.add_argument("--rl-lr", type=float, default=5e-4)
    ap.add_argument("--rl-from", type=Path, help="skip SL: RL from this model dir (an earlier run's sl-merged)")
    ap.add_argument("--smoke", action="store_true", help="2 steps of each loop")
    ap.add_argument("--basic", action="store_true", help="sl_basic and rl_basic too, as many steps as the loops")
    ap.add_argument("--max-term", type=int, default=4, help="the sums' terms are 0..N")
    ap.add_argument("--sl-random-answers", action="store_true",
                    help="SL teaches the format with random answers: RL has to find the sums")
    ap.add_argument("--child", choices=LOOPS, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ["TINKER_API_KEY"] = KEY
    work = args.work.resolve()
    if args.child:
        return child(args.child, args.url, work / f"{args.child}-log", args.steps, args.model, work, args.rl_lr)
    sl_steps, rl_steps = (2, 2) if args.smoke else (args.sl_steps, args.rl_steps)
    work.mkdir(parents=True, exist_ok=True)
    from baton.models.make import make_tiny_checkpoint

    base = make_tiny_checkpoint(work / "base", preset="0.75m", seed=0, max_position=1024)
    write_data(work, n=max(64, 16 * max(sl_steps, 1)), seed=0, max_term=args.max_term, sl_random=args.sl_random_answers)
    state = work / "state"

    done = {}

    def stage(loop: str, model_dir: Path, steps: int) -> None:
        ms, secs = run_loop(loop, model_dir, state, work, steps, args.rl_lr)
        key = FIGURE[loop]
        ms = [m for m in ms if key in m]  # rl.train also logs lines of its own (the final checkpoint's)
        for m in ms:
            print(f"{loop} step {m['step']}: {key} {m[key]:.4f}")
        if ms:
            print(f"{loop}: {len(ms)} steps in {secs:.0f} s, {key} {ms[0][key]:.4f} -> {ms[-1][key]:.4f}", flush=True)
        done[loop] = len(ms) == steps

    merged = args.rl_from
    if merged is None:
        stage("sl", base, sl_steps)
        merged = work / "sl-merged"
        subprocess.run([sys.executable, "-m", "baton.cli", "export", str(sampler_dir(state, work / "sl-log")),
                        str(merged), "--merge", "--base", str(base)], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
        if args.basic:
            stage("sl_basic", base, sl_steps)
    stage("rl", merged.resolve(), rl_steps)
    if args.basic:
        stage("rl_basic", merged.resolve(), rl_steps)  # from the SL result, as rl_loop
    return 0 if all(done.values()) else 1

if __name__ == "__main__":
    sys.exit(main())
