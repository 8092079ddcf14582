"""What the `baton` command says about configs: every key with its one-line help
(`baton train --help`), the config class of a recipe (`baton config`), and the run dir a
command line points at (the Ctrl-C line).

A key's help is the comment after its field in the config dataclass's source
(`steps: int = 100  # ...`), so the help cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from typing import Any

# Which algorithm's keys `baton COMMAND --help` lists (train: the default; a recipe's own
# `algorithm:` picks its class, see `baton config`).
COMMAND_ALGORITHMS = {"train": "grpo", "sft": "sft", "rm": "rm", "online-dpo": "online_dpo", "dpo": "dpo"}


def config_class(algorithm: str) -> type:
    """The config dataclass of `algorithm` (baton.trainers.algorithms; ConfigError, one line,
    for an unknown name)."""
    from baton.config import ConfigError
    from baton.trainers.algorithms import config_class as registered

    try:
        return registered(algorithm)
    except ValueError as e:
        raise ConfigError(str(e)) from None


_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^#=]+(?:=[^#]*)?(?:#\s*(.+?))?\s*$")
_COMMENT = re.compile(r"^\s+#\s?(.*?)\s*$")


def _comments(cls: type) -> dict[str, str]:
    """{field: help}: the comment after the field (`steps: int = 100  # ...`), else the
    comment lines right above it, joined into one line."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's comment wins
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in source.splitlines():
            comment, field = _COMMENT.match(line), _FIELD.match(line)
            if comment:
                if not re.match(r"^(-{3}|={3})", comment.group(1)):  # a section divider is not help
                    above.append(comment.group(1))
                continue
            if field and not line.lstrip().startswith(("def ", "class ", "return ", "@")):
                note = field.group(2) or " ".join(a for a in above if a)
                if note:
                    out[field.group(1)] = note
            above = []
    return out


# Help for keys whose field has no comment of its own: by dotted key, else by field name (the
# optimizer, sampling and run keys every config repeats).
FALLBACK_HELP = {
    "algorithm": "the driver: grpo | ppo | online_dpo | dpo | sft | rm",
    "lr": "learning rate (AdamW)", "weight_decay": "AdamW's decoupled weight decay", "betas": "AdamW's (beta1, beta2)",
    "lr_schedule": "constant | cosine | linear decay after the warm-up",
    "min_lr_ratio": "the schedule's floor, as a fraction of lr", "lr_warmup_steps": "linear LR warm-up over this many updates",
    "grad_clip": "clip the gradient norm to this", "steps": "training steps (a step: one batch, its update, its sync)",
    "run_dir": "where metrics.jsonl, config.yaml, checkpoints/ and report.png go", "seed": "random seed",
    "progress": "a live progress line on the console", "temperature": "sampling temperature (1.0: the policy as it is)",
    "top_p": "nucleus sampling: keep the smallest set of tokens with this much probability (1.0: off)",
    "top_k": "sample from the k most likely tokens (0: off)", "max_new_tokens": "tokens sampled per completion at most",
    "target_modules": "the linear layers that get adapters", "rank": "LoRA rank r", "alpha": "LoRA scale numerator (scale = alpha / rank)", "dropout": "dropout on the LoRA input",
    "prompts_per_step": "prompts sampled per step (rows: prompts x rollout.n)",
    "pairs_per_step": "preference pairs per optimizer step", "functions": "reward function name (or module:fn) -> weight",
    "timeout_s": "seconds a call may take before it is counted as timed out",
    "micro_batch_size": "rows per forward/backward (gradient accumulation)",
    "max_length": "tokens of prompt + response kept per pair", "family": "qwen2 | llama | qwen3_moe | mixtral: the tiny model's architecture (default: the preset's, else qwen2)",
    "algo.clip_low": "PPO's lower clip: the ratio is kept >= 1 - clip_low",
    "algo.entropy_coef": "> 0 adds -coef x entropy to the loss (exploration bonus)",
    "algo.dynamic_sampling_max_rounds": "DAPO: extra rounds of prompts drawn at most to fill a step",
    "algo.overlong_penalty": "DAPO: the penalty at max_new_tokens (linear over algo.overlong_buffer)",
    "algo.off_policy_cap": "the off-policy weight's cap (tis: truncate; decoupled_ppo: clip)",
    "placement.backend": "local (the driver's process, world size 1) | ray",
    "placement.roles": "role -> pool name (default: main); e.g. {reward: aux}",
    "placement.cpus_per_worker": "Ray CPUs reserved per worker", "placement.gpus_per_worker":
        "GPUs per worker: 1 puts each rank's roles on its GPU (placement.auto sets 1 where CUDA is)",
    "placement.strategies": "pool name -> PACK | SPREAD | STRICT_PACK | STRICT_SPREAD",
    "placement.resources": "pool name -> extra Ray resources per rank, e.g. {gen: {gen_node: 1}}",
    "trainer.mode": "sync (on-policy) | one_step_off | async: a generator samples ahead of the update "
                    "(the recipe's choice; placement.auto never changes it)",
}
# Keys whose default depends on the command: {key: (shown default, why)}.
EFFECTIVE_DEFAULTS = {
    "placement.auto": ("True", "on for `baton train` of grpo / ppo recipes; BATON_PLACEMENT_AUTO=0 or "
                               "placement.auto=false: the recipe's placement as written"),
}


def _help(key: str, field: str, notes: dict[str, str]) -> str:
    return notes.get(field) or FALLBACK_HELP.get(key) or FALLBACK_HELP.get(field, "")


def _section_type(tp: Any) -> type | None:
    """The dataclass of a section field (`LoraAdapterConfig | None` too), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return "(required)"


def keys_help(cls: type, prefix: str = "", effective: dict[str, Any] | None = None, auto: bool = False) -> list[str]:
    """One line per key of config dataclass `cls`: `section.key = default  help`; a section
    is a header line (`section:  help`) followed by its keys. `effective`: {dotted key:
    default} where the algorithm fills in a field's default (algo.advantage); `auto`: the
    command turns placement.auto on (EFFECTIVE_DEFAULTS)."""
    effective = effective or {}
    hints, notes, lines = typing.get_type_hints(cls), _comments(cls), []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = prefix + f.name
        note = _help(key, f.name, notes)
        section = _section_type(hints[f.name])
        if section is not None:
            lines.append(f"{key}:" + (f"  {note}" if note else ""))
            lines += keys_help(section, key + ".", effective, auto)
            continue
        default = effective.get(key, _default(f))
        shown = default if isinstance(default, str) and default else repr(default)
        if key in EFFECTIVE_DEFAULTS and auto:
            shown, why = EFFECTIVE_DEFAULTS[key]
            note = f"{note} ({why})"
        text = f"  {key} = {shown}"
        lines.append(f"{text:<48s} {note}".rstrip())
    return lines


def command_keys_help(command: str) -> str:
    """The key listing `baton COMMAND --help` ends with."""
    algorithm = COMMAND_ALGORITHMS.get(command, "grpo")
    cls = config_class(algorithm)
    head = (f"config keys of `baton {command}` ({cls.__name__}; set in the recipe or as dotted.key=value; "
            f"`baton config RECIPE` prints a recipe's resolved values):")
    from baton.trainers.algorithms import AUTO_FAMILY

    text = "\n".join([head, *keys_help(cls, effective=_filled_defaults(cls, algorithm),
                                       auto=algorithm in AUTO_FAMILY)])
    if command == "train":
        from baton.trainers.algorithms import ALGORITHMS

        others = [n for n in ALGORITHMS if config_class(n) is not cls]
        text += (f"\n\nthese are the keys of algorithm {algorithm} (and of those sharing {cls.__name__}); a recipe's "
                 f"`algorithm:` may name {', '.join(others)} too: `baton config RECIPE` prints its keys, "
                 f"`baton sft --help` (rm, online-dpo, dpo) lists them")
    return text


def _filled_defaults(cls: type, algorithm: str) -> dict[str, Any]:
    """{dotted key: value} where building the algorithm's default config fills a field
    differently from its declared default (algo.advantage "" -> grpo); {} where the default
    config does not build on its own (a required data.path)."""
    from baton.config import ConfigError, load_config, to_dict

    try:
        built = to_dict(load_config(cls, data={"algorithm": algorithm}))
    except (ConfigError, ValueError, TypeError):
        return {}
    out: dict[str, Any] = {}

    def walk(node: Any, klass: type, prefix: str) -> None:
        hints = typing.get_type_hints(klass)
        for f in dataclasses.fields(klass):
            key, value = prefix + f.name, node.get(f.name) if isinstance(node, dict) else None
            section = _section_type(hints[f.name])
            if section is not None:
                if value is not None:  # an optional section left out (model.lora): its declared defaults
                    walk(value, section, key + ".")
            elif value != _default(f):
                out[key] = value

    walk(built, cls, "")
    return out


def run_dir_of(argv: list[str]) -> str | None:
    """The trainer.run_dir a `baton COMMAND RECIPE [overrides]` command line writes to (the
    override, else the recipe's), or None if it does not say."""
    import yaml

    if len(argv) < 2 or argv[0] not in COMMAND_ALGORITHMS:
        return None
    for text in reversed(argv[2:]):
        key, sep, value = text.partition("=")
        if sep and key.strip() == "trainer.run_dir":
            return value.strip()
    try:
        with open(argv[1]) as f:
            recipe = yaml.safe_load(f) or {}
        run_dir = (recipe.get("trainer") or {}).get("run_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return str(run_dir) if run_dir else None
