"""Make `ctl_workers` importable by name (the suite runs with --import-mode=importlib).
Ray workers receive the driver's sys.path, so they can import it too, which they must:
cloudpickle ships the worker classes by reference."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
