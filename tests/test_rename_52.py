"""scripts/rename_52.py (issue 52's renames and moves): its rules rewrite each old spelling
once and never the new one (a re-run changes nothing), refuse what they cannot rewrite, and
this tree holds none of the old names."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts/rename_52.py"
spec = importlib.util.spec_from_file_location("rename_52", SCRIPT)
R = importlib.util.module_from_spec(spec)
spec.loader.exec_module(R)

CASES = [  # (old text, where, new text)
    ("from baton.rollout.embedded import EmbeddedEngine\n", "x.py",
     "from baton.rollout.embedded.engine import EmbeddedEngine\n"),
    ('ENGINES.lazy("embedded", "baton.rollout.embedded:EmbeddedEngine")', "x.py",
     'ENGINES.lazy("embedded", "baton.rollout.embedded.engine:EmbeddedEngine")'),
    ("from baton.rollout import embedded as engine_module\n", "x.py",
     "from baton.rollout.embedded import engine as engine_module\n"),
    ("from baton.rollout import embedded\nembedded.STEPS\n", "x.py",
     "from baton.rollout.embedded import engine as embedded\nembedded.STEPS\n"),
    ("from baton.rollout import _llama\n_llama.FAMILIES, `_llama.py`\n", "x.py",
     "from baton.rollout.embedded import llama\nllama.FAMILIES, `llama.py`\n"),
    ("see baton/rollout/_llama.py and rollout/kv_budget.py, not tests/rollout/kv_budget.py", "x.md",
     "see baton/rollout/embedded/llama.py and rollout/embedded/kv_budget.py, not tests/rollout/kv_budget.py"),
    ("from baton.rollout.protocol import SamplingParams  # `baton.rollout.protocol`\n", "x.py",
     "from baton.protocol import SamplingParams  # `baton.protocol`\n"),
    ("from baton.data import rows as R\nfrom baton.data.rows import load_rows\n", "x.py",
     "from baton.data import records as R\nfrom baton.data.records import load_rows\n"),
    ("from baton.agents.tokens import OBS, Trajectory\nfrom baton.rows import Trajectory as Row\nTrajectory(tok)\n",
     "x.py", "from baton.agents.tokens import OBS, Conversation\nfrom baton.rows import Trajectory as Row\n"
     "Conversation(tok)\n"),
    ("from baton.rows import Trajectory\nTrajectory(p, r)\n", "x.py", "from baton.rows import Trajectory\nTrajectory(p, r)\n"),
    ("the `_llama.py` at main", "BENCHMARKS.md", "the `_llama.py` at main"),  # history keeps its words
]


@pytest.mark.parametrize("old,where,new", CASES)
def test_each_old_spelling_is_rewritten_once(old, where, new):
    assert R.rewrite(old, where) == new
    assert R.rewrite(new, where) == new  # a re-run changes nothing


def test_an_import_of_a_moved_module_among_others_is_refused():
    with pytest.raises(R.Stop, match="split it by hand"):
        R.rewrite("from baton.rollout import _llama, engines\n", "x.py")


def test_this_tree_holds_no_old_name():
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "already applied" in out.stdout
