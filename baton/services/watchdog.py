"""The launcher's watchdog: kills what `baton launch` started when the launcher dies.

    python -m baton.services.watchdog GRACE_S   (stdin: the read end of a pipe)

`baton launch` starts it first, in a session of its own, and writes the process-group id
of every child it starts to the pipe, one per line. When the launcher exits normally it
writes `done` (it has stopped its children itself). If the pipe reaches EOF without
`done` - the launcher was SIGKILLed, or crashed - every group gets SIGTERM, and SIGKILL
after GRACE_S: nothing outlives its supervisor, grandchildren included (they share their
parent's group). Children also get PR_SET_PDEATHSIG (SIGTERM) from the launcher, a second
line for the direct child should the watchdog itself be killed.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_groups(pgids: list[int], grace_s: float) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(g) for g in pgids):
        time.sleep(0.1)
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    grace_s = float(argv[0]) if argv else 10.0
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    pgids: list[int] = []
    for line in sys.stdin:
        word = line.strip()
        if word == "done":
            return 0
        if word.isdigit():
            pgids.append(int(word))
    kill_groups(pgids, grace_s)  # EOF without "done": the launcher died
    return 0


if __name__ == "__main__":
    sys.exit(main())
