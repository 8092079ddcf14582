#!/usr/bin/env python3
"""Issue 52 part 4 (and part 3's move) as a re-runnable rename: one word, one meaning.

    python scripts/rename_52.py             # apply (git mv + rewrites); prints every change
    python scripts/rename_52.py --check     # what it would change; exit 1 if anything, 0 if done
                                            # (tests/test_rename_52.py: no old name comes back)

What it does, on whatever tree it runs (a tree that has moved on since this was written):
  * the embedded engine's files move into a package of their own, `baton/rollout/embedded/`,
    beside the server package; its private modules lose the underscore (the package is
    their privacy now). What stays in baton/rollout/ is shared by every engine: the engine
    registry, the remote client, the vLLM engine, grammars and llguidance's checks
    (`constrained.py`: the server and the rollout worker check a grammar whatever the
    engine), the HTTP server;
  * the agents' conversation class `baton.agents.tokens.Trajectory` becomes `Conversation`
    (`baton.rows.Trajectory` is the training row); `baton/data/rows.py` (dataset records)
    becomes `baton/data/records.py`; the `baton/rollout/protocol.py` re-export shim goes,
    its importers import `baton.protocol`;
  * `AGENT_ENVS` is a `baton.registry.Registry` like `ENVIRONMENTS`, and the multi-turn env
    adapters live in one package, `baton/agents/envs/` (openenv joins calculator and guess
    there: an agent env builds on `baton.agents.episode`, which the layer table puts above
    `baton/envs/`, so `baton/envs/` cannot hold it).

How: every tracked text file is read once, rewritten in memory (dotted module names, file
paths with or without the `baton/` prefix, `from PKG import MODULE` lines, the underscored
module names as words, the class name in the files that import it, and a few anchored
edits; one block, tests/agents' `ScriptedEngine`, moves to a module of its own: SPLITS), and
only when nothing failed are the moves (`git mv`) and the writes done (and `git add`ed). Each rule
matches only the old spelling, so a second run changes nothing. It stops with exit 2,
before writing anything, when a move's target exists beside its source, when neither
exists, when an anchored edit finds neither its old nor its new text, or when a
`from PKG import a, b` line names a moved module among others.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini", ".json"}
# history: a benchmark table names the file it measured (`_llama.py` at main); its paths are
# rewritten (still findable) but not its bare words
KEEP_WORDS = {"BENCHMARKS.md"}
SELF = {"scripts/rename_52.py", "tests/test_rename_52.py"}  # they spell the old names on purpose

RO, EMB = "baton/rollout/", "baton/rollout/embedded/"
MOVES = [  # (old path, new path); a directory's package __init__ is written below
    (RO + "embedded.py", EMB + "engine.py"),
    (RO + "_llama.py", EMB + "llama.py"),
    (RO + "_hf.py", EMB + "hf.py"),
    (RO + "_kernels.py", EMB + "kernels.py"),
    (RO + "_moe.py", EMB + "moe.py"),
    (RO + "generation.py", EMB + "generation.py"),
    (RO + "static_decode.py", EMB + "static_decode.py"),
    (RO + "cuda_graphs.py", EMB + "cuda_graphs.py"),
    (RO + "live_lora.py", EMB + "live_lora.py"),
    (RO + "kv_budget.py", EMB + "kv_budget.py"),
    (RO + "sampling.py", EMB + "sampling.py"),
    (RO + "stop_strings.py", EMB + "stop_strings.py"),
    (RO + "op_count.py", EMB + "op_count.py"),
    ("baton/data/rows.py", "baton/data/records.py"),
    ("baton/agents/envs.py", "baton/agents/envs/__init__.py"),
    ("baton/agents/openenv_env.py", "baton/agents/envs/openenv.py"),
]
DELETES = {"baton/rollout/protocol.py": "baton/protocol.py"}  # a shim: its importers go to the real place
WORDS = {"_llama": "llama", "_hf": "hf", "_kernels": "kernels", "_moe": "moe"}  # dropped underscores
CLASS = ("Trajectory", "Conversation", "baton/agents/tokens.py", "baton.agents.tokens")
NEW_FILES = {
    EMB + "__init__.py": '''"""The embedded engine: an in-process rollout engine over an HF causal LM, in pure PyTorch
(`engine.py`'s `EmbeddedEngine`, registered as `rollout.engine: embedded`). Its parts:

  engine.py         EmbeddedEngine: generate / start_generation, weights, LoRA serving, sleep
  llama.py          the fast path: a hand-written forward (Llama, Qwen2/3, Mistral) with a KV cache
  moe.py            the fast path's mixture-of-experts MLP (Qwen3-MoE, Mixtral)
  kernels.py        fused pieces of the fast path (RMSNorm, rotary embeddings)
  hf.py             every other model through its own HF forward
  sampling.py       temperature / top-k / top-p / min-p sampling and its logprobs
  static_decode.py  the decode step over static buckets, captured as CUDA graphs (cuda_graphs.py)
  generation.py     a call run k steps at a time (`baton serve` interleaves them)
  kv_budget.py      how many KV-cache tokens a call may hold (fixed, or a fraction of free memory)
  stop_strings.py   stop strings matched over the tokens since the last look
  live_lora.py      a LoRA policy's live adapter tensors, applied without merging
  op_count.py       kernels a decode step launches, counted by a dispatch recorder

Shared by every engine, beside this package: the protocol (`baton.protocol`), the engine
registry (`baton.rollout.engines`), grammars (`baton.rollout.grammars`,
`baton.rollout.constrained`), the HTTP server (`baton.rollout.server`).
"""
''',
}
EDITS = [  # (path after the moves, old text, new text): what the word rules cannot say
    ("baton/agents/envs/__init__.py", "AGENT_ENVS: dict[str, type] = {}\n\n\ndef register_env(name: str):\n"
     "    def wrap(cls):\n        AGENT_ENVS[name] = cls\n        return cls\n    return wrap\n",
     'AGENT_ENVS: Registry = Registry("agent env")\n\n\ndef register_env(name: str):\n'
     "    return AGENT_ENVS.register(name)\n"),
    ("baton/agents/envs/__init__.py", "from baton.agents.tools import NONE\n",
     "from baton.agents.tools import NONE\nfrom baton.registry import Registry\n"),
    ("baton/agents/envs/__init__.py", "(baton/agents/envs/openenv.py; the openenv extra)",
     "(`openenv.py` here; the openenv extra)"),
    ("baton/agents/__init__.py", "    tokens.py    Trajectory: sampled ids", "    tokens.py    Conversation: sampled ids"),
    ("baton/agents/__init__.py", "    envs.py      AGENT_ENVS: calculator (tool use), guess (per-turn feedback), openenv\n"
     "    openenv_env.py  OpenEnvEpisode: an OpenEnv server (reset / step, MCP tools) as an agent env\n",
     "    envs/        AGENT_ENVS (a Registry): calculator (tool use), guess (per-turn feedback), and\n"
     "                 envs/openenv.py's OpenEnvEpisode (an OpenEnv server: reset / step, MCP tools)\n"),
    ("baton/rollout/embedded/engine.py", "before each sample (`constrained.py`, llguidance); the host",
     "before each sample (`baton.rollout.constrained`,\nllguidance); the host"),
    ("tests/test_registry.py", "    for family in (ADVANTAGES, ", "    for family in (AGENT_ENVS, ENVIRONMENTS, ADVANTAGES, "),
    ("tests/test_registry.py", "    from baton.algos import ADVANTAGES\n    from baton.envs import TASKS\n",
     "    from baton.agents.envs import AGENT_ENVS\n    from baton.algos import ADVANTAGES\n"
     "    from baton.envs import ENVIRONMENTS, TASKS\n"),
    ("docs/ARCHITECTURE.md", "the embedded engine (`embedded.py`: KV cache,",
     "the embedded engine (the `embedded/` package: `engine.py`, KV cache,"),
    ("docs/ARCHITECTURE.md", "stop strings `stop_strings.py`, structured outputs (grammars as text `grammars.py`, "
     "llguidance's masks `constrained.py`), a LoRA",
     "stop strings `stop_strings.py`, a LoRA"),
    ("docs/ARCHITECTURE.md", "the CUDA-graph decode `static_decode.py` / `cuda_graphs.py`), the in-process",
     "the CUDA-graph decode `static_decode.py` / `cuda_graphs.py`), structured outputs shared by "
     "the engines (grammars as text `grammars.py`, llguidance's masks and checks `constrained.py`), the in-process"),
    ("docs/ARCHITECTURE.md", "token-in/token-out trajectories, `run_episodes`, `AgentConfig`; `openenv_env.py` "
     "(`agent.env: openenv`, the openenv extra)",
     "token-in/token-out conversations (`tokens.py`: `Conversation`), `run_episodes`, `AgentConfig`; "
     "the multi-turn envs in one package, `envs/` (`AGENT_ENVS`, a `Registry`: calculator, guess; "
     "`envs/openenv.py`: `agent.env: openenv`, the openenv extra)"),
    ("docs/ARCHITECTURE.md", "data files read and checked row by row: `rows.py`",
     "data files read and checked record by record: `records.py`"),
]
SPLITS = [  # (from, first line, the text after it, to, the new module's head): a block that moves file
    ("tests/agents/test_rollout.py", "class ScriptedEngine(Engine):", "\n\n\ndef _prompts(rows):", "tests/agents/scripted_engine.py",
     '''"""`ScriptedEngine`: a stand-in for a *trained* policy (a random tiny model cannot be made to
call tools on cue) for the agent tests; it implements the engine protocol. A module of its
own: test_deadlines.py imported it from test_rollout.py, which then ran twice, and its
`register_env` entries with it, which the `AGENT_ENVS` registry refuses the second time."""

from __future__ import annotations

import re

from baton.protocol import Completion, Engine


'''),
]
EDITS += [
    ("tests/agents/test_rollout.py", "import asyncio\nimport re\nimport threading\n", "import asyncio\nimport threading\n"),
    ("tests/agents/test_rollout.py", "from baton.protocol import Completion, Engine, SamplingParams\n",
     "from baton.protocol import SamplingParams\nfrom tests.agents.scripted_engine import ScriptedEngine\n"),
    ("tests/agents/test_deadlines.py", "from test_rollout import ScriptedEngine  # noqa: E402\n",
     "from tests.agents.scripted_engine import ScriptedEngine  # noqa: E402\n"),
]
DOORS = """
**Four doors for an environment, and when to use which.** A *task* (`baton/envs/`, `TASKS`,
`data.task`) is prompts plus a verifier: single-turn, scored in the trainer's reward role,
the door for anything whose answer a function can check. An *agent env*
(`baton/agents/envs/`, `AGENT_ENVS`, `data.source: agent` with `agent.env`) is a multi-turn
episode with tools that baton drives token by token beside its engine: the door when the
environment is Python that can step in-process (or an OpenEnv server) and the trainer must
see every turn's tokens. A *gateway agent* (`data.source: gateway`) is a user's own agent
program that speaks OpenAI's chat API to baton's gateway (`baton.services.gateway`), which
records the tokens: the door for an agent loop baton must not rewrite (a verifiers
environment, an SDK agent). A *service* (`ENVIRONMENTS`, `baton env`, `data.source: api`)
is an environment process elsewhere that collects and scores groups through any engine
and pushes them to the trajectory API: the door for environments that run on other
machines or at their own pace (Atropos's shape).
"""
DOORS_ANCHOR = "## Layers (import direction: top may import below, never the reverse)\n"


class Stop(Exception):
    """Something this script cannot do on this tree: reported, nothing written."""


def module(path: str) -> str:
    p = path[:-3] if path.endswith(".py") else path
    p = p[: -len("/__init__")] if p.endswith("/__init__") else p
    return p.replace("/", ".")


MODULES = {module(o): module(n) for o, n in MOVES if module(o) != module(n)}  # envs.py -> envs/: same name
MODULES.update({module(o): module(n) for o, n in DELETES.items()})
PATHS = {o: n for o, n in MOVES} | dict(DELETES)


def children(old: str) -> list[str]:
    """Next name components below `old` among the new modules (embedded -> engine, llama,
    ...): `baton.rollout.embedded.engine` must not be read as the old module again."""
    return sorted({n[len(old) + 1:].split(".")[0] for n in MODULES.values() if n.startswith(old + ".")})


def dotted_rule(old: str, new: str) -> tuple[re.Pattern, str, str]:
    kids = children(old)
    alt = "|".join(map(re.escape, kids))
    guard = f"(?!\\.(?:{alt})(?!\\w))(?! import (?:{alt})(?!\\w))" if kids else ""
    return re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w){guard}"), new, old


def path_rule(old: str, new: str) -> tuple[re.Pattern, Any, str]:
    """baton/x/y.py, or x/y.py without the `baton/` prefix (docs write both)."""
    o, n = old.removeprefix("baton/"), new.removeprefix("baton/")
    return re.compile(rf"(?<![\w./-])(baton/)?{re.escape(o)}(?![\w])"), lambda m: (m.group(1) or "") + n, o


RULES = sorted([dotted_rule(o, n) for o, n in MODULES.items()] + [path_rule(o, n) for o, n in PATHS.items()],
               key=lambda r: -len(r[0].pattern))  # the longest (most specific) name first
FROM = re.compile(r"^(\s*)from (baton(?:\.\w+)*) import ([^\n(]+)$", re.M)
WORD = {w: re.compile(rf"\b{re.escape(w)}\b") for w in WORDS}


def from_line(m: re.Match, where: str) -> str:
    """`from baton.rollout import embedded as E` -> `from baton.rollout.embedded import engine as E`."""
    indent, pkg, names = m.groups()
    parts = [p.strip() for p in names.split("#")[0].split(",")]
    moved = [p for p in parts if f"{pkg}.{p.split(' as ')[0].strip()}" in MODULES]
    if not moved:
        return m.group(0)
    if len(parts) > 1:
        raise Stop(f"{where}: `{m.group(0).strip()}` imports a moved module among others; split it by hand")
    name, _, alias = parts[0].partition(" as ")
    new = MODULES[f"{pkg}.{name.strip()}"]
    parent, _, leaf = new.rpartition(".")
    alias = alias.strip() or WORDS.get(name.strip(), name.strip())
    comment = names[len(names.split("#")[0]):]
    return f"{indent}from {parent} import {leaf}{'' if alias == leaf else ' as ' + alias}" + (
        f"  {comment.strip()}" if comment else "")


def rewrite(text: str, where: str) -> str:
    for pattern, new, literal in RULES:
        if literal in text:  # a plain search first: a pattern that opens with a look-behind scans slowly
            text = pattern.sub(new, text)
    text = FROM.sub(lambda m: from_line(m, where), text)  # after the rules: its output names the new package
    if Path(where).name not in KEEP_WORDS:
        for word, pattern in WORD.items():
            if word in text:
                text = pattern.sub(WORDS[word], text)
    old, new, home, mod = CLASS
    if where == home or re.search(rf"from {re.escape(mod)} import [^\n]*\b{old}\b", text):
        text = "\n".join(line if "baton.rows" in line else re.sub(rf"\b{old}\b", new, line)
                         for line in text.split("\n"))
    return text


def agents_doc(text: str) -> str:
    """ARCHITECTURE's "Multi-turn agents" walk names the conversation class's methods."""
    text = re.sub(r"\bTrajectory(\.(?:add_turn|add_observation))   ", CLASS[1] + r"\1 ", text)  # its columns hold
    return re.sub(r"\bTrajectory(?=\.check\b|\(prompt = )", CLASS[1], text)


def plan() -> tuple[list[tuple[str, str]], dict[str, str], list[str]]:
    """The moves still to do, the new contents by final path, and the deletions; Stop on
    anything this tree does not allow."""
    problems, moves = [], []
    for old, new in MOVES:
        o, n = (ROOT / old).exists(), (ROOT / new).exists()
        if o and n:
            problems.append(f"{old} -> {new}: both exist; merge them by hand, then re-run")
        elif o:
            moves.append((old, new))
        elif not n:
            problems.append(f"{old} -> {new}: neither exists")
    deletes = [p for p in DELETES if (ROOT / p).exists()]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    where = {old: new for old, new in moves}
    contents: dict[str, str] = {}
    for rel in tracked:
        if Path(rel).suffix not in TEXT or rel in deletes or rel in SELF or not (ROOT / rel).is_file():
            continue
        before = (ROOT / rel).read_text(encoding="utf-8")
        final = where.get(rel, rel)
        try:
            after = rewrite(before, final)
        except Stop as e:
            problems.append(str(e))
            continue
        if final == "docs/ARCHITECTURE.md":
            after = agents_doc(after)
            if DOORS.strip() not in after:
                if DOORS_ANCHOR not in after:
                    problems.append(f"docs/ARCHITECTURE.md: no {DOORS_ANCHOR.strip()!r} to put the doors paragraph before")
                else:
                    after = after.replace(DOORS_ANCHOR, DOORS.lstrip() + "\n" + DOORS_ANCHOR, 1)
        contents[final] = after
    for path, text in NEW_FILES.items():
        contents.setdefault(path, text)
    for source, first, after, dest, head in SPLITS:
        text = contents.get(source, "")
        if dest in contents:
            continue
        if text.count(first) != 1 or after not in text[text.find(first):]:
            problems.append(f"{source}: {first!r} ... {after.strip()!r} not found once; move it to {dest} by hand")
            continue
        start = text.index(first)
        end = text.index(after, start)
        contents[dest] = head + text[start:end] + "\n"
        contents[source] = text[:start].rstrip("\n") + after + text[end + len(after):]
    for path, old, new in EDITS:
        text = contents.get(path)
        if text is None:
            problems.append(f"{path}: not in the tree (anchored edit {old[:40]!r}...)")
        elif new not in text:
            if text.count(old) != 1:
                problems.append(f"{path}: {old[:60]!r}... found {text.count(old)} times (want 1); edit by hand")
            else:
                contents[path] = text.replace(old, new)
    left = sorted(f"{p}: {m}" for p, t in contents.items() for m in DELETES_MODULES if re.search(rf"(?<![\w.]){m}(?!\w)", t))
    problems += [f"still names the shim: {x}" for x in left]
    if problems:
        raise Stop("\n".join(problems))
    return moves, contents, deletes


DELETES_MODULES = [re.escape(module(p)) for p in DELETES]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="print what would change; write nothing")
    args = ap.parse_args(argv)
    try:
        moves, contents, deletes = plan()
    except Stop as e:
        print(f"rename_52: cannot apply, nothing written:\n{e}", file=sys.stderr)
        return 2
    current = {p: (ROOT / o).read_text(encoding="utf-8") for o, p in moves} | {
        p: (ROOT / p).read_text(encoding="utf-8") for p in contents if (ROOT / p).exists()}
    writes = {p: t for p, t in contents.items() if current.get(p) != t}
    for old, new in moves:
        print(f"move    {old} -> {new}")
    for path in deletes:
        print(f"delete  {path} (importers now use {DELETES[path]})")
    for path in sorted(writes):
        print(f"{'write' if path in current else 'create'}   {path}")
    if not (moves or deletes or writes):
        print("rename_52: nothing to do (already applied)")
        return 0
    if args.check:
        return 1
    for old, new in moves:
        (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", old, new], cwd=ROOT, check=True)
    if deletes:
        subprocess.run(["git", "rm", "-q", *deletes], cwd=ROOT, check=True)
    for path, text in writes.items():
        (ROOT / path).write_text(text, encoding="utf-8")
    subprocess.run(["git", "add", *writes], cwd=ROOT, check=True)
    print(f"rename_52: {len(moves)} moved, {len(deletes)} deleted, {len(writes)} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
