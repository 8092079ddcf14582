"""Builds checkpoints/calc-tools: the calculator model (checkpoints/calc-sft) with a chat
template that renders OpenAI `tools` and a context of 1,024 tokens, so `baton serve` shows
`tool_calls` without building a model (the README's tools example).

    .venv/bin/python scripts/make_calc_tools.py [--steps 200] [--out checkpoints/calc-tools]

The template puts the tool definitions (compact JSON) first, then the conversation as the
calculator was trained on it (user / tool text raw, assistant turns ending in <eos>, calls
as compact Hermes `<tool_call>` blocks). calc-sft never saw a tools block and is distracted
by one, so a short SFT (`baton train` with algorithm sft, from calc-sft) teaches it the same
two moves behind the block: "a*b=" -> the calc call, and the tool's answer -> that answer
copied. Rows are rendered by the template itself, so training sees exactly what the server
sends. The model is a RoPE Qwen2 trained on <= ~250 tokens; the 1,024 context holds a tools
prompt, and prompts much longer than training were never seen.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "checkpoints" / "calc-sft"
CONTEXT = 1024

TEMPLATE = (
    "{%- if tools %}<tools>{% for t in tools %}{{ t.function | tojson(separators=(',', ':')) }}{% endfor %}"
    "</tools>{{ eos_token }}{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{{- message.content or '' }}"
    "{%- for c in message.tool_calls or [] %}"
    '<tool_call>{"name":"{{ c.function.name }}","arguments":'
    "{% if c.function.arguments is string %}{{ c.function.arguments }}"  # an OpenAI message's JSON text
    "{% else %}{{ c.function.arguments | tojson(separators=(',', ':')) }}{% endif %}}</tool_call>{% endfor %}"
    "{{- eos_token }}"
    "{%- else %}{{- message.content }}{%- endif %}"
    "{%- endfor %}"
)

CALC = {"type": "function", "function": {
    "name": "calc", "description": "integer arithmetic",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}


def rows(tok, n: int, seed: int) -> list[dict]:
    """SFT rows rendered by the template: half call the tool, half copy its answer."""
    rng, out = random.Random(seed), []
    for _ in range(n):
        a, b = (rng.randint(10, 10 ** rng.randint(2, 3) - 1) for _ in range(2))
        expr, result = f"{a}*{b}", str(a * b)
        user = [{"role": "user", "content": expr + "="}]
        if rng.random() < 0.5:
            prompt = tok.apply_chat_template(user, tools=[CALC], tokenize=False, add_generation_prompt=True)
            target = '<tool_call>{"name":"calc","arguments":' + json.dumps({"expr": expr}, separators=(",", ":")) \
                     + "}</tool_call>"
        else:
            call = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "calc", "arguments": {"expr": expr}}}]}
            prompt = tok.apply_chat_template(user + [call, {"role": "tool", "content": result}], tools=[CALC],
                                             tokenize=False, add_generation_prompt=True)
            target = result
        out.append({"prompt": prompt, "target": target, "answer": target})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=str(REPO / "checkpoints" / "calc-tools"))
    args = ap.parse_args()
    from baton.config import load_config
    from baton.models.load import load_tokenizer
    from baton.trainers.algorithms import config_class, driver

    work = Path(tempfile.mkdtemp(prefix="calc-tools-"))
    base = work / "base"
    shutil.copytree(SOURCE, base)
    (base / "chat_template.jinja").write_text(TEMPLATE)
    config = json.loads((base / "config.json").read_text())
    config["max_position_embeddings"] = CONTEXT
    (base / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok = load_tokenizer(str(base))
    for name, n, seed in (("train", 20000, 0), ("eval", 100, 1)):
        (work / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(tok, n, seed)))
    recipe = {"algorithm": "sft", "model": {"path": str(base)},
              "data": {"path": str(work / "train.jsonl"), "eval_path": str(work / "eval.jsonl"), "eval_size": 100},
              "optim": {"lr": 1.0e-3, "lr_warmup_steps": 20},
              "trainer": {"steps": args.steps, "batch_size": 16, "num_threads": 1, "run_dir": str(work / "run"),
                          "save_path": args.out, "save_dtype": "float32"}}
    (work / "sft.yaml").write_text(json.dumps(recipe))
    driver("sft")(load_config(config_class("sft"), str(work / "sft.yaml"), []))
    shutil.copy(base / "chat_template.jinja", Path(args.out) / "chat_template.jinja")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
