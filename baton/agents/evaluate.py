"""Held-out evaluation of a calculator agent checkpoint, with and without its tool.

    baton eval checkpoints/calc-sft-mixed --recipe recipes/agent_calculator.yaml [--n N]
    python -m baton.agents.evaluate checkpoints/calc-sft-mixed [n]        (the same, older spelling)

with tool     greedy episodes of the calculator env (baton.agents.rollout.agent_metrics):
              accuracy, the share of problems answered with a well-formed first-turn call
              (first_turn_call_ok), and well-formed calls among the turns that tried one
without tool  the same model answering the bare prompt in one greedy turn (exact match)
"""

from __future__ import annotations

import sys

from baton.agents.config import AgentConfig
from baton.agents.rollout import agent_metrics, run_episodes
from baton.batch import collate
from baton.envs import get_task
from baton.envs.arithmetic import verify
from baton.protocol import SamplingParams


def evaluate_agent(engine, tokenizer, rows: list[dict], cfg: AgentConfig) -> dict[str, float]:
    out, stats = run_episodes(engine, tokenizer, collate(rows), 1, cfg, SamplingParams(temperature=0.0))
    m = agent_metrics(out, stats, len(rows))
    ids = [list(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows]
    done = engine.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=cfg.turn_max_new_tokens))
    texts = tokenizer.batch_decode([c.token_ids for c in sorted(done, key=lambda c: c.prompt_index)],
                                   skip_special_tokens=True)
    m["accuracy_without_tool"] = sum(verify(t, r["answer"]) for t, r in zip(texts, rows)) / len(rows)
    return m


def main(argv: list[str]) -> int:
    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.engines import DEFAULT_ENGINE, build_engine

    if not argv:
        print("usage: python -m baton.agents.evaluate CHECKPOINT_DIR [N]", file=sys.stderr)
        return 2
    tok = load_tokenizer(argv[0])
    engine = build_engine(DEFAULT_ENGINE, load_model(argv[0]), tok, model_path=argv[0])
    rows = get_task("multiply").eval_rows(int(argv[1]) if len(argv) > 1 else 100)
    cfg = AgentConfig(env="calculator", max_turns=3, max_tokens=200, turn_max_new_tokens=80)
    print(agent_report(argv[0], len(rows), evaluate_agent(engine, tok, rows, cfg)))
    return 0


def agent_report(name: str, n: int, m: dict[str, float]) -> str:
    """What `baton eval --recipe AGENT_RECIPE` and this module print."""
    return (f"{name} ({n} held-out problems, greedy)\n"
            f"  with the tool:    accuracy {m['accuracy']:.2f}  well-formed calls {m['first_turn_call_ok']:.2f} "
            f"of problems ({m['tool_call_ok']:.2f} of the turns that tried one)\n"
            f"  without the tool: accuracy {m['accuracy_without_tool']:.2f}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
