"""Nothing outlives its supervisor (issue 22 §4): SIGKILL of `baton launch` takes its
children (and their process groups) with it, and a readiness check accepts only the
process it started, never an orphan holding the port. Real processes, real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from baton.rollout.server import ServerThread
from baton.services.api import build_api_app
from baton.services.launch import Launcher, Spec
from tests.services.test_launch import alive, py


def _wait(cond, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_sigkill_of_the_launcher_takes_its_children_and_grandchildren(tmp_path):
    pids = tmp_path / "pids"
    child = ("import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
             "time.sleep(600)']); open(sys.argv[1], 'a').write(f'{os.getpid()} {p.pid}\\n'); time.sleep(600)")
    script = textwrap.dedent(f"""
        import sys
        from baton.services.launch import Launcher, Spec
        child = {child!r}
        specs = [Spec("env-0", [sys.executable, "-c", child, {str(pids)!r}], service=False),
                 Spec("trainer", [sys.executable, "-c", child, {str(pids)!r}], service=False)]
        Launcher(specs, grace_s=1.0).run()
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert _wait(lambda: pids.exists() and len(pids.read_text().split()) == 4), "children did not start"
        started = [int(x) for x in pids.read_text().split()]
        assert all(alive(p) for p in started)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _wait(lambda: not any(alive(p) for p in started)), [p for p in started if alive(p)]
    finally:
        launcher.kill()
        for p in [int(x) for x in pids.read_text().split()] if pids.exists() else []:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_readiness_refuses_an_orphan_holding_the_port(tmp_path):
    orphan = ServerThread(build_api_app(str(tmp_path / "orphan.sqlite")))  # an earlier run's API, still up
    try:
        specs = [Spec("api", py("import time; time.sleep(600)"), health=f"{orphan.url}/health"),
                 Spec("trainer", py("print('must not start', flush=True)"), service=False)]
        out = __import__("io").StringIO()
        assert Launcher(specs, grace_s=1.0, out=out, ready_timeout_s=60).run() == 1
        log = out.getvalue()
        assert "not the process it started" in log and "must not start" not in log, log
    finally:
        orphan.stop()


def test_health_answers_name_the_instance(tmp_path, monkeypatch):
    monkeypatch.setenv("BATON_INSTANCE", "abc123")
    s = ServerThread(build_api_app(str(tmp_path / "a.sqlite")))
    try:
        import httpx
        assert httpx.get(f"{s.url}/health", timeout=60).json()["instance"] == "abc123"
    finally:
        s.stop()
