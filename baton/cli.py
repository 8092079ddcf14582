"""The `baton` command.

    baton train RECIPE.yaml [dotted.key=value ...]   RL training (GRPO; `algorithm: ppo` in
                                                     the recipe: the PPO-family driver)
    baton rm RECIPE.yaml [dotted.key=value ...]      Bradley-Terry reward model from pairs
    baton sft RECIPE.yaml [dotted.key=value ...]     supervised warm start
    baton online-dpo RECIPE.yaml [dotted.key=value ...]  online DPO (own samples, scored, paired)
    baton dpo RECIPE.yaml [dotted.key=value ...]     offline DPO from a jsonl of pairs
    baton eval MODEL_DIR [--task arithmetic] [--n 200]  held-out accuracy of a checkpoint
    baton serve MODEL_DIR [--port 8000 ...]          OpenAI-compatible + /generate server
    baton api [--port 8000 --db FILE ...]            the trajectory API (Atropos-compatible)
    baton env NAME --api URL --server URL [...]      an environment service feeding the API
    baton launch RECIPE [dotted.key=value ...]       API + servers + environments + trainer
    baton make-tiny OUT_DIR [--preset 5m]            a tiny random model + tokenizer

A config error (unknown key, wrong type) prints one line naming the key and exits with 2.
"""

from __future__ import annotations

import argparse
import sys

from baton.config import ConfigError, load_config
from baton.runs.rundir import RunDirError


def _algorithm(recipe: str, overrides: list[str]) -> str:
    """The recipe's top-level `algorithm:` (an `algorithm=...` override wins); "grpo" if absent."""
    import yaml

    name = "grpo"
    try:
        with open(recipe) as f:
            data = yaml.safe_load(f) or {}
        if isinstance(data, dict):
            name = str(data.get("algorithm", name))
    except OSError:
        pass  # load_config names the missing recipe
    for text in overrides:
        if text.split("=", 1)[0].strip() == "algorithm":
            name = text.split("=", 1)[1].strip()
    return name


def _train(args: argparse.Namespace) -> int:
    if _algorithm(args.recipe, args.overrides) == "ppo":  # PPO with a critic, ReMax, DAPO, ...
        from baton.trainers.ppo import train
        from baton.trainers.ppo_config import PPOConfig as config_cls
    else:
        from baton.trainers.grpo import train
        from baton.trainers.grpo_config import GRPOConfig as config_cls

    cfg = load_config(config_cls, args.recipe, args.overrides)
    result = train(cfg)
    _print_accuracy(result, cfg.trainer.run_dir)
    return 0


def _rm(args: argparse.Namespace) -> int:
    from baton.trainers.reward_model import RMConfig, run_rm

    run_rm(load_config(RMConfig, args.recipe, args.overrides))
    return 0


def _online_dpo(args: argparse.Namespace) -> int:
    from baton.trainers.dpo_config import DPOConfig
    from baton.trainers.online_dpo import train

    cfg = load_config(DPOConfig, args.recipe, args.overrides)
    _print_accuracy(train(cfg), cfg.trainer.run_dir)
    return 0


def _dpo(args: argparse.Namespace) -> int:
    from baton.trainers.dpo_config import OfflineDPOConfig
    from baton.trainers.offline_dpo import train

    cfg = load_config(OfflineDPOConfig, args.recipe, args.overrides)
    result = train(cfg)
    _print_accuracy(result, cfg.trainer.run_dir)
    for prefix in ("start/eval/", "eval/"):
        if f"{prefix}rewards/accuracies" in result:
            print(f"{'start' if prefix.startswith('start') else 'trained':8s} held-out preference accuracy "
                  f"{result[prefix + 'rewards/accuracies']:.3f}, margin {result[prefix + 'rewards/margins']:.3f}")
    return 0


def _print_accuracy(result: dict[str, float], run_dir: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out accuracy")
    table.add_column("model")
    table.add_column("greedy", justify="right")
    table.add_column("sampled", justify="right")
    for name, prefix in (("start", "start/eval/"), ("trained", "eval/")):
        if f"{prefix}accuracy_greedy" in result:
            table.add_row(name, f"{result[prefix + 'accuracy_greedy']:.3f}",
                          f"{result[prefix + 'accuracy_sampled']:.3f}")
    console = Console()
    console.print(table)
    console.print(f"run dir: {run_dir} (metrics.jsonl, report.png, checkpoints/)")


def _sft(args: argparse.Namespace) -> int:
    from baton.trainers.sft import SFTConfig, run_sft

    run_sft(load_config(SFTConfig, args.recipe, args.overrides))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from baton.envs import get_task
    from baton.envs.evaluate import MODES, evaluate_modes
    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.engines import build_engine

    model, tokenizer = load_model(args.model_dir), load_tokenizer(args.model_dir)
    engine, task = build_engine("embedded", model, tokenizer, model_path=args.model_dir), get_task(args.task)
    rows = task.eval_rows(args.n)
    result = evaluate_modes(engine, tokenizer, task, rows, n=4, max_new_tokens=args.max_new_tokens, seed=args.seed)
    for mode in MODES:
        print(f"{mode:8s} accuracy {result[f'eval/accuracy_{mode}']:.3f}  (stop rate "
              f"{result[f'eval/stop_rate_{mode}']:.3f}, {int(result[f'eval/samples_{mode}'])} samples "
              f"on {len(rows)} held-out prompts)")
    return 0


def _serve(argv: list[str]) -> int:
    from baton.rollout.server import serve_main

    serve_main(argv)
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
    from baton.trainers.grpo_config import GRPOConfig

    cfg = load_config(GRPOConfig, args.recipe, args.overrides)  # a bad recipe fails here, before any process
    return launch(to_dict(cfg), args.recipe, args.overrides, grace_s=args.grace_s, dry_run=args.dry_run)


def _export(args: argparse.Namespace) -> int:
    """A LoRA run's checkpoint (a PEFT adapter over the recipe's base model) as one plain HF
    checkpoint: base + adapter merged (`baton.models.lora.merge_adapter_dir`)."""
    from baton.models.lora import merge_adapter_dir

    if not args.merge:
        print("baton export: give --merge (a LoRA checkpoint already is a PEFT adapter dir that peft, "
              "vLLM and SGLang load as it is)", file=sys.stderr)
        return 2
    out = merge_adapter_dir(args.checkpoint, args.out_dir, base_path=args.base)
    print(f"baton export: wrote {out} (base + adapter merged)")
    return 0


def _make_tiny(args: argparse.Namespace) -> int:
    from baton.models.make import make_tiny_checkpoint

    make_tiny_checkpoint(args.out_dir, preset=args.preset, family=args.family, seed=args.seed)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (("train", _train, "RL training from a recipe"),
                            ("sft", _sft, "supervised fine-tuning from a recipe"),
                            ("rm", _rm, "train a Bradley-Terry reward model from a recipe"),
                            ("online-dpo", _online_dpo, "online DPO from a recipe"),
                            ("dpo", _dpo, "offline DPO from a recipe with a jsonl of pairs")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("recipe")
        p.add_argument("overrides", nargs="*", help="dotted.key=value")
        p.set_defaults(fn=fn)
    p = sub.add_parser("eval", help="held-out accuracy of a checkpoint")
    p.add_argument("model_dir")
    p.add_argument("--task", default="arithmetic")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.set_defaults(fn=_eval)
    sub.add_parser("serve", help="serve a model over HTTP (see baton serve --help)", add_help=False)
    sub.add_parser("api", help="the trajectory API (see baton api --help)", add_help=False)
    sub.add_parser("env", help="run an environment against servers and the API (see baton env --help)",
                   add_help=False)
    p = sub.add_parser("launch", help="start API, servers, environments and trainer of a data.source=api recipe")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="dotted.key=value")
    p.add_argument("--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL grace period when stopping")
    p.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    p.set_defaults(fn=_launch)
    p = sub.add_parser("export", help="merge a LoRA checkpoint into its base model (HF format)")
    p.add_argument("checkpoint", help="a LoRA run's checkpoint dir (adapter_config.json + adapter_model.safetensors)")
    p.add_argument("out_dir")
    p.add_argument("--merge", action="store_true", help="write base + adapter as one plain HF checkpoint")
    p.add_argument("--base", default=None, help="the base model dir (default: the adapter's base_model_name_or_path)")
    p.set_defaults(fn=_export)
    p = sub.add_parser("make-tiny", help="write a tiny random model + tokenizer")
    p.add_argument("out_dir")
    p.add_argument("--preset", default="5m")
    p.add_argument("--family", default="qwen2")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_make_tiny)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        return _serve(argv[1:])
    if argv and argv[0] in ("api", "env"):
        return _service(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"baton: config error: {e}", file=sys.stderr)
        return 2
    except (RunDirError, FloatingPointError) as e:  # a busy/finished run dir; training went non-finite
        print(f"baton: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
