"""`placement: auto` (baton.trainers.placement.auto.choose): hand-worked cases. Auto picks
devices, ranks and threads; it never changes trainer.mode (the recipe's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from baton.trainers.placement.auto import AUTO_KEYS, MIN_DP_PARAMS, AutoView, choose, view_from_config

DEMO = AutoView(prompts_per_step=64)  # the demo recipe: 64 prompts, nothing placed by hand
AHEAD = AutoView(prompts_per_step=64, mode="one_step_off", generator=True)  # a recipe that generates ahead
P = 25_000_000  # above MIN_DP_PARAMS (4M): data parallel on every core
SMALL = 820_000  # the demo model's parameters


def test_two_cores_small_model_one_process_on_policy():
    c = choose(2, 0, SMALL, DEMO)
    assert (c.backend, c.world_size, c.mode, c.threads_per_worker, c.gpus_per_worker) == ("local", 1, "sync", 1, 0)
    assert c.overrides() == ["placement.backend=local", "placement.world_size=1",
                             "placement.threads_per_worker=1", "placement.gpus_per_worker=0"]
    assert "1 thread: so small a model's ops gain little from more" in c.line()
    assert not any(o.startswith("trainer.mode") for o in c.overrides())  # never what is computed
    assert "0.82M params < 4M: one process" in c.line() and "on cpu" in c.line()
    # the 2.2M preset stays one process; the 5M one (4.8M) takes a rank per core
    assert choose(2, 0, 2_200_000, DEMO).world_size == 1 and choose(2, 0, 4_800_000, DEMO).world_size == 2
    # an explicit world size wins over the small-model rule
    c = choose(2, 0, SMALL, AutoView(prompts_per_step=64, world_size=2))
    assert (c.backend, c.world_size, c.threads_per_worker) == ("ray", 2, 1)


def test_a_recipe_that_generates_ahead_keeps_its_mode_and_gets_a_core_for_the_generator():
    c = choose(2, 0, SMALL, AHEAD)
    assert (c.backend, c.world_size, c.mode, c.overlap, c.threads_per_worker) == ("local", 1, "one_step_off", True, 1)
    assert "the generator in a process of its own" in c.line() and "one core left to the generator" in c.line()
    # 5M on 2 cores: one rank + the generator (3 processes would share 2 cores); 8 cores: 7 ranks do not
    # divide 64 prompts, 4 do: 4 ranks + the generator
    assert choose(2, 0, P, AHEAD).world_size == 1
    c = choose(8, 0, P, AHEAD)
    assert (c.backend, c.world_size, c.threads_per_worker) == ("ray", 4, 1)


def test_two_cores_two_ranks_one_thread_each():
    c = choose(2, 0, P, DEMO)
    assert (c.backend, c.world_size, c.mode, c.threads_per_worker) == ("ray", 2, "sync", 1)
    assert c.overrides() == ["placement.backend=ray", "placement.world_size=2",
                             "placement.threads_per_worker=1", "placement.gpus_per_worker=0"]
    assert c.line().startswith("placement auto: 2 rank(s) on ray, 1 thread(s) each, actor, rollout and every "
                               "other role on cpu (2 cores: one rank per core")


def test_threads_one_for_small_cpu_models_else_the_idle_cores():
    """bench/threads.py (BENCHMARKS.md "Threads"): 2 threads a process on 2 cores running other
    work were 2.6-30x slower than 1, so a small model gets one thread whatever the load (its gain
    from more on a quiet machine is small); a larger one gets the cores left idle at start."""
    one = AutoView(prompts_per_step=3)  # 3 prompts: one rank, however many cores
    assert choose(2, 0, SMALL, one, idle_cores=2.0).threads_per_worker == 1  # quiet, small: 1
    assert choose(2, 0, P, one, idle_cores=2.0).threads_per_worker == 2  # quiet, large: both cores
    assert choose(2, 0, P, one, idle_cores=1.6).threads_per_worker == 2  # rounds: 1.6 idle cores of 2
    c = choose(2, 0, P, one, idle_cores=0.1)  # a busy loop on each core: 1
    assert c.threads_per_worker == 1 and "2 of 2 cores busy with other work at start" in c.line()
    assert choose(8, 0, P, AutoView(prompts_per_step=3, world_size=1), idle_cores=5.0).threads_per_worker == 5  # 3 busy
    assert choose(16, 1, P, DEMO, idle_cores=4.0).threads_per_worker == 4  # a GPU rank: the idle cores
    assert choose(16, 1, SMALL, DEMO, idle_cores=16.0).threads_per_worker == 16  # not the CPU small-model rule
    assert choose(2, 0, P, AutoView(prompts_per_step=3, threads_per_worker=2), idle_cores=0.0).threads_per_worker == 2


def test_idle_cores_probe():
    from baton.trainers.placement.auto import detect_idle_cores

    idle = detect_idle_cores(window_s=0.05)
    assert 0.0 <= idle <= len(__import__("os").sched_getaffinity(0))


def test_one_core_one_process():
    c = choose(1, 0, P, DEMO)
    assert (c.backend, c.world_size, c.threads_per_worker) == ("local", 1, 1)


def test_ranks_divide_the_prompts_and_the_mini_batch():
    # 8 cores, 12 prompts: 8 and 7 do not divide 12; 6 does
    c = choose(8, 0, P, AutoView(prompts_per_step=12))
    assert (c.world_size, c.threads_per_worker) == (6, 1)
    assert "split into at most 6" in c.reason
    # 6 divides 12 prompts but not a mini-batch of 16 rows: 4 does both (2 threads each)
    c = choose(8, 0, P, AutoView(prompts_per_step=12, rows_per_update=16))
    assert (c.world_size, c.threads_per_worker) == (4, 2)
    c = choose(2, 0, P, AutoView(prompts_per_step=3))  # 3 prompts on 2 cores: one rank, both cores
    assert (c.world_size, c.backend, c.threads_per_worker) == (1, "local", 2)


def test_gpus_one_rank_per_gpu_every_role_on_it():
    c = choose(16, 1, P, DEMO)
    assert (c.backend, c.world_size, c.threads_per_worker, c.gpus_per_worker) == ("local", 1, 16, 1)
    assert "placement.gpus_per_worker=1" in c.overrides()
    assert "every other role on cuda:0 (1 GPU(s)" in c.line()
    c = choose(16, 4, SMALL, DEMO)  # the small-model CPU rule does not apply to GPUs
    assert (c.backend, c.world_size, c.threads_per_worker, c.gpus_per_worker) == ("ray", 4, 4, 1)
    assert "cuda:0..3 (one per rank)" in c.line()
    # an explicit gpus_per_worker=0 keeps the roles on the CPU on a GPU machine
    c = choose(16, 1, P, AutoView(prompts_per_step=64, gpus_per_worker=0))
    assert (c.gpus_per_worker, c.world_size, c.devices()) == (0, 16, "cpu")


def test_explicit_settings_win():
    c = choose(2, 0, P, AutoView(prompts_per_step=64, world_size=1))
    assert (c.backend, c.world_size, c.threads_per_worker) == ("local", 1, 2)
    assert c.decided == ("placement.backend", "placement.threads_per_worker", "placement.gpus_per_worker")
    assert "kept as set: placement.world_size" in c.line()
    c = choose(2, 0, P, AutoView(prompts_per_step=64, backend="local", world_size=1, threads_per_worker=1,
                                 gpus_per_worker=0))
    assert (c.backend, c.world_size, c.threads_per_worker, c.overrides()) == ("local", 1, 1, [])
    c = choose(4, 0, P, AutoView(prompts_per_step=64, threads_per_worker=3))
    assert (c.world_size, c.threads_per_worker) == (4, 3)


def test_auto_off_and_hand_made_pools_are_left_alone():
    assert choose(8, 0, P, AutoView(auto=False)).world_size == 1
    c = choose(8, 0, P, AutoView(has_pools=True, backend="ray", world_size=2))
    assert (c.backend, c.world_size, c.overrides()) == ("ray", 2, [])


def test_deterministic():
    assert choose(2, 0, P, DEMO) == choose(2, 0, P, DEMO)


def test_view_from_a_validated_config():
    cfg = SimpleNamespace(placement=SimpleNamespace(backend="local", world_size=2, threads_per_worker=0,
                                                    gpus_per_worker=0,
                                                    pool_of=lambda role: "gen" if role == "rollout" else "main"),
                          trainer=SimpleNamespace(mode="one_step_off"),
                          data=SimpleNamespace(prompts_per_step=8, source="rollout"),
                          actor=SimpleNamespace(mini_batch_size=16))
    v = view_from_config(cfg, {"placement.world_size", "data.prompts_per_step"})
    assert (v.world_size, v.backend, v.threads_per_worker, v.gpus_per_worker, v.mode, v.prompts_per_step,
            v.rows_per_update, v.has_pools) == (2, None, None, None, "one_step_off", 8, 16, False)
    assert v.generator  # the registry's "generator" source: a process of its own
    assert view_from_config(cfg, {"placement.roles"}).has_pools
    assert set(AUTO_KEYS) == {"placement.backend", "placement.world_size", "placement.threads_per_worker",
                              "placement.gpus_per_worker"}


def test_bad_machine():
    with pytest.raises(ValueError, match="cores >= 1"):
        choose(0, 0, P, DEMO)


def test_machine_and_model_size_probes():
    from pathlib import Path

    from baton.trainers.placement.auto import count_model_params, detect_machine
    from baton.models.load import load_model

    cores, gpus = detect_machine()
    assert cores >= 1 and gpus >= 0
    demo = Path(__file__).resolve().parents[1] / "checkpoints" / "arith-sft"
    real = sum(p.numel() for p in load_model(demo).parameters())  # the weights, really loaded
    assert count_model_params(str(demo)) == real < MIN_DP_PARAMS


def test_no_more_cpu_ranks_than_fit_in_memory():
    """The Qwen2.5-0.5B shape (494M) on 2 cores and 24 GiB: a rank needs ~12 GiB
    (RANK_BYTES_PER_PARAM = 26 B a parameter); 80% of 24 GiB = 19.2 GiB holds one rank, not two
    (Ray's OOM monitor killed them at 10.5 GB each). With 256 GiB: one rank per core."""
    q05 = 494_000_000
    c = choose(2, 0, q05, DEMO, memory_bytes=24 * 2**30)
    assert (c.backend, c.world_size, c.mode, c.threads_per_worker) == ("local", 1, "sync", 2)
    assert "~12.0 GiB a rank, 1 rank(s) fit in 80% of 24 GiB" in c.line()
    assert choose(2, 0, q05, DEMO, memory_bytes=256 * 2**30) == choose(2, 0, q05, DEMO)
    assert choose(2, 0, q05, DEMO).world_size == 2
    # 16 cores, 64 GiB: 51.2 // 12.0 = 4 ranks (4 divides 64 prompts); with a generator ahead
    # (its ~2.8 GiB first) (51.2 - 2.8) // 12.0 = 4 as well
    assert choose(16, 0, q05, DEMO, memory_bytes=64 * 2**30).world_size == 4
    assert choose(16, 0, q05, AHEAD, memory_bytes=64 * 2**30).world_size == 4
    # not even one rank fits: one, said so; an explicit world size wins; GPUs are not limited here
    c = choose(2, 0, 1_500_000_000, DEMO, memory_bytes=24 * 2**30)
    assert c.world_size == 1 and "not even one does" in c.line()
    assert choose(2, 0, q05, AutoView(prompts_per_step=64, world_size=2), memory_bytes=24 * 2**30).world_size == 2
    assert choose(16, 2, q05, DEMO, memory_bytes=24 * 2**30).world_size == 2
