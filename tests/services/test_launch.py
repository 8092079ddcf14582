"""`baton launch`: the plan it makes from a recipe, and stop-all (process groups, SIGTERM then
SIGKILL) when a process fails or the trainer ends; end to end on a tiny run (slow)."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from baton.config import load_config, to_dict
from baton.services.launch import Launcher, Spec, entry_group_size, plan
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]


def test_plan_from_the_recipe():
    cfg = to_dict(load_config(PPOConfig, REPO / "recipes/grpo_arithmetic_api.yaml", ["rollout.weight_sync=checkpoint",
                                                                                      "data.weights_dir=/tmp/w"]))
    specs = plan(cfg, "recipes/grpo_arithmetic_api.yaml", ["trainer.steps=3"])
    assert [s.name for s in specs] == ["api", "serve-0", "env-0", "trainer"]
    api, serve, env, trainer = (s.argv[3:] for s in specs)
    assert api[:5] == ["api", "--host", "127.0.0.1", "--port", "8730"] and api[-1].endswith("api.sqlite")
    assert serve[:2] == ["serve", "checkpoints/arith-sft"] and serve[-2:] == ["--weights-dir", "/tmp/w"]
    assert env[:2] == ["env", "arithmetic"] and env[env.index("--group-size") + 1] == "8"
    assert env[env.index("--server") + 1] == "http://127.0.0.1:8731" and env[-2:] == ["--concurrency", "32"]
    assert trainer == ["train", "recipes/grpo_arithmetic_api.yaml", "trainer.steps=3"]
    assert specs[0].health == "http://127.0.0.1:8730/health" and not specs[2].service


def test_launch_reads_the_group_size_an_env_entry_sets():
    """What the config check asks launch: the size `baton env` would keep (the last flag)."""
    assert entry_group_size("arithmetic --concurrency 4") is None
    assert entry_group_size("arithmetic --group-size 4") == ("--group-size", "4")
    assert entry_group_size("'my env' --group-size=4 --group_size 2") == ("--group_size", "2")
    assert entry_group_size("arithmetic --group-size") is None  # no value: baton env refuses it itself


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_failing_service_stops_everything_sigkill_after_grace(tmp_path):
    pidfile = tmp_path / "grandchild"
    stubborn = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('up', flush=True); time.sleep(60)")
    specs = [Spec("stubborn", py(stubborn), service=False),
             Spec("env-0", py("import time; print('env up', flush=True); time.sleep(60)"), service=False),
             Spec("serve-0", py("import time, sys; time.sleep(1.0); print('dying', flush=True); sys.exit(3)"))]
    out = io.StringIO()
    t0 = time.monotonic()
    code = Launcher(specs, grace_s=1.0, out=out).run()
    assert code == 1 and time.monotonic() - t0 < 30
    log = out.getvalue()
    assert "[env-0] env up" in log and "[serve-0] dying" in log and "[stubborn] up" in log
    assert "serve-0 exited with 3: stopping the run" in log
    assert "stubborn did not stop in 1 s: SIGKILL" in log
    time.sleep(0.2)
    assert not alive(int(pidfile.read_text()))  # its whole process group went, grandchildren too


def test_the_trainer_ending_ends_the_run():
    specs = [Spec("api", py("import time; time.sleep(60)")),
             Spec("trainer", py("print('training', flush=True)"), service=False)]
    out = io.StringIO()
    assert Launcher(specs, grace_s=5.0, out=out).run() == 0
    assert "trainer exited with 0: stopping the run" in out.getvalue() and "stopping api (SIGTERM)" in out.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_launch_runs_the_api_recipe_end_to_end(tmp_path):
    api, srv = free_port(), free_port()
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "baton.cli", "launch", "recipes/grpo_arithmetic_api.yaml",
            f"trainer.run_dir={run_dir}", f"data.api_url=http://127.0.0.1:{api}", f"data.servers=[http://127.0.0.1:{srv}]",
            "data.envs=[arithmetic --concurrency 8]", "data.prompts_per_step=4", "rollout.n=4", "data.eval_size=8",
            "actor.mini_batch_size=16", "actor.micro_batch_size=16", "trainer.steps=3", "trainer.progress=false"]
    p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for name in ("[api] baton api:", "[serve-0] baton serve:", "[env-0]", "[trainer]",
                 "trainer exited with 0: stopping the run", "stopping env-0 (SIGTERM)"):
        assert name in p.stdout, name
    lines = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert len(lines) == 4  # step 0 (evaluation) + 3 steps
    for port in (api, srv):  # every process it started is gone
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


# A trainer that, told SIGTERM, must still get a batch from the environment to finish its
# step (as `baton train` waiting on the API does), then says what `baton train` says and
# exits 143; an environment that keeps producing batches (bytes appended to a file).
STUB_ENV = ("import sys, time\nwhile True:\n    open(sys.argv[1], 'ab').write(b'x')\n    time.sleep(0.05)\n")
STUB_TRAINER = """
import os, signal, sys, time
batches, stop = sys.argv[1], []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print('step 1 running', flush=True)
while not stop:
    time.sleep(0.02)
seen, deadline = os.path.getsize(batches), time.monotonic() + 20
while os.path.getsize(batches) < seen + 3:  # the rest of the step's batch: the environment must still run
    if time.monotonic() > deadline:
        print('baton: error: no batch came (the environments stopped)', file=sys.stderr, flush=True)
        sys.exit(1)
    time.sleep(0.02)
print('baton: stopped by SIGTERM after step 1 of 10; checkpoint step_1 saved: continue with trainer.resume=auto',
      file=sys.stderr, flush=True)
sys.exit(143)
"""


def test_sigterm_to_launch_stops_the_trainer_first_then_the_rest(tmp_path):
    """The first SIGTERM goes to the trainer alone; the environments keep feeding it until
    it has finished and saved its step; launch exits with its 143 and keeps its line."""
    import threading

    batches = tmp_path / "batches"
    batches.write_bytes(b"")
    specs = [Spec("api", py("import time; time.sleep(60)")),
             Spec("env-0", [*py(STUB_ENV), str(batches)], service=False),
             Spec("trainer", [*py(STUB_TRAINER), str(batches)], service=False)]
    out = io.StringIO()
    launcher = Launcher(specs, grace_s=2.0, out=out)

    def signal_when_training() -> None:  # launch's SIGTERM handler, once the trainer is in its step
        deadline = time.monotonic() + 60
        while "[trainer] step 1 running" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        launcher.interrupt(signal.SIGTERM)

    threading.Thread(target=signal_when_training, daemon=True).start()
    assert launcher.run() == 143, out.getvalue()
    log = out.getvalue()
    assert launcher.trainer_line.startswith("baton: stopped by SIGTERM after step 1 of 10; checkpoint step_1 saved")
    assert log.index("trainer exited with 143") < log.index("stopping env-0 (SIGTERM)") < log.index("stopping api")


@pytest.mark.slow
def test_sigterm_to_launch_saves_the_step_and_resumes_exactly(tmp_path):
    """A real API-path run: SIGTERM to `baton launch` once the trainer has logged step 1; the
    trainer finishes and saves its step while the services still run, launch exits 143 with
    `baton train`'s line, and a resume (trainer.resume=auto) says which checkpoint it continues
    from and runs to the end."""
    import json
    import signal as sig

    api, srv = free_port(), free_port()
    run_dir = tmp_path / "run"
    base = [sys.executable, "-m", "baton.cli", "launch", "recipes/grpo_arithmetic_api.yaml",
            f"trainer.run_dir={run_dir}", f"data.api_url=http://127.0.0.1:{api}",
            f"data.servers=[http://127.0.0.1:{srv}]", "data.envs=[arithmetic --concurrency 8]",
            "data.prompts_per_step=4", "rollout.n=4", "data.eval_size=8", "actor.mini_batch_size=16",
            "actor.micro_batch_size=16", "trainer.progress=false", "trainer.steps=50"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(base, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 400
    while time.monotonic() < deadline and p.poll() is None:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(json.loads(line).get("step") == 1 for line in lines if line.strip()):
            break
        time.sleep(0.2)
    p.send_signal(sig.SIGTERM)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 143, out[-3000:] + err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("baton: stopped by SIGTERM after step ") and "trainer.resume=auto" in line, err
    step = int(line.split("after step ")[1].split()[0])
    assert (run_dir / "checkpoints" / f"step_{step}").is_dir()
    q = subprocess.run([*base[:-1], f"trainer.steps={step + 1}", "trainer.resume=auto"], cwd=REPO,
                       capture_output=True, text=True, timeout=600, env=env)
    assert q.returncode == 0, q.stdout[-3000:] + q.stderr[-3000:]
    assert f"resuming {run_dir} from checkpoint step_{step} (step {step} of {step + 1})" in q.stdout
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()]
    assert steps[-1] == step + 1 and steps.count(step + 1) == 1
