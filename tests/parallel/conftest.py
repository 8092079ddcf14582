"""Make `par_workers` importable by name (the suite runs with --import-mode=importlib); Ray
workers get the driver's test dirs on their path (tests/conftest.py) and import it too."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
