"""scripts/mutants.py's list stays true to the code: every mutant's original snippet occurs
exactly once in its file, ids are unique, each names tests that exist. (The mutation run
itself is CI's own step in .ci/run, after the main tests: `scripts/mutants.py`, every mutant;
its score and time are in BENCHMARKS.md.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("baton_mutants_script", REPO / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_once_and_names_existing_tests():
    m = load_script()
    assert m.check(m.MUTANTS) == []
    assert len(m.MUTANTS) >= 40 and set(m.SMOKE) <= {x.id for x in m.MUTANTS}
    for mutant in m.MUTANTS:
        for test in mutant.tests:
            path = REPO / test.split("::")[0]
            assert path.is_file(), (mutant.id, test)
            if "::" in test:
                assert f"def {test.split('::')[1]}(" in path.read_text(), (mutant.id, test)
