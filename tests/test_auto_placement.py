"""`placement: auto` (baton.controller.auto_placement.choose): hand-worked cases."""

from __future__ import annotations

import pytest

from baton.controller.auto_placement import MIN_DP_PARAMS, AutoView, choose, view_from_raw

DEMO = AutoView(prompts_per_step=64)  # the demo recipe: 64 prompts, nothing placed by hand
P = 25_000_000  # above MIN_DP_PARAMS (4M): data parallel on every core
SMALL = 820_000  # the demo model's parameters


def test_two_cores_small_model_one_rank_and_the_generator():
    c = choose(2, 0, SMALL, DEMO)
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("local", 1, True, 1)
    assert c.overrides() == ["placement.backend=local", "placement.world_size=1",
                             "placement.threads_per_worker=1", "trainer.mode=one_step_off"]
    assert "0.82M params < 4M" in c.line()
    # the 2.2M preset generates ahead; the 5M one (4.8M) takes a rank per core
    assert choose(2, 0, 2_200_000, DEMO).overlap and not choose(2, 0, 4_800_000, DEMO).overlap
    # 8 cores: 7 do not divide 64 prompts, 4 do: 4 ranks + the generator, 1 thread each
    c = choose(8, 0, SMALL, DEMO)
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("ray", 4, True, 1)
    # an explicit world size wins over the small-model rule
    c = choose(2, 0, SMALL, AutoView(prompts_per_step=64, world_size=2))
    assert (c.world_size, c.overlap, c.threads_per_worker) == (2, False, 1)


def test_two_cores_two_ranks_one_thread_each():
    c = choose(2, 0, P, DEMO)
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("ray", 2, False, 1)
    assert c.overrides() == ["placement.backend=ray", "placement.world_size=2",
                             "placement.threads_per_worker=1", "trainer.mode=sync"]
    assert c.line().startswith("placement auto: 2 rank(s) on ray, 1 thread(s) each, generation colocated (2 cores")


def test_one_core_one_process():
    c = choose(1, 0, P, DEMO)
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("local", 1, False, 1)


def test_ranks_divide_the_prompts_and_the_mini_batch():
    # 8 cores, 12 prompts: 8, 7 and 5 do not divide 12; 6 does, and a 7th process generates
    c = choose(8, 0, P, AutoView(prompts_per_step=12))
    assert (c.world_size, c.overlap, c.threads_per_worker) == (6, True, 1)
    # 6 divides 12 prompts but not a mini-batch of 16 rows: 4 does both
    assert choose(8, 0, P, AutoView(prompts_per_step=12, rows_per_update=16)).world_size == 4
    # 3 prompts on 2 cores: one rank, and the generator in a second process; 1 thread each
    c = choose(2, 0, P, AutoView(prompts_per_step=3))
    assert (c.world_size, c.backend, c.overlap, c.threads_per_worker) == (1, "local", True, 1)
    assert "at most 1" in c.reason
    assert c.overrides()[-1] == "trainer.mode=one_step_off"


def test_gpus_one_rank_per_gpu():
    c = choose(16, 1, P, DEMO)
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("local", 1, False, 16)
    c = choose(16, 4, P, DEMO)
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("ray", 4, False, 4)


def test_explicit_settings_win():
    c = choose(2, 0, P, AutoView(prompts_per_step=64, world_size=1))  # the other core generates
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("local", 1, True, 1)
    assert c.decided == ("placement.backend", "placement.threads_per_worker", "trainer.mode")
    assert "kept as set: placement.world_size" in c.line()
    c = choose(2, 0, P, AutoView(prompts_per_step=64, mode="one_step_off"))
    assert (c.world_size, c.overlap, c.threads_per_worker) == (2, True, 1)  # 3 processes on 2 cores
    assert "trainer.mode=one_step_off" not in c.overrides()
    c = choose(2, 0, P, AutoView(prompts_per_step=64, world_size=1, mode="sync"))  # 1 process: both cores
    assert (c.world_size, c.overlap, c.threads_per_worker) == (1, False, 2)
    c = choose(2, 0, P, AutoView(prompts_per_step=64, backend="local", world_size=1, threads_per_worker=1,
                                 mode="sync"))
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker, c.overrides()) == ("local", 1, False, 1, [])
    c = choose(4, 0, P, AutoView(prompts_per_step=64, threads_per_worker=3))
    assert (c.world_size, c.threads_per_worker) == (4, 3)


def test_auto_off_and_hand_made_pools_are_left_alone():
    assert choose(8, 0, P, AutoView(auto=False)).world_size == 1
    c = choose(8, 0, P, AutoView(has_pools=True, backend="ray", world_size=2))
    assert (c.backend, c.world_size, c.overrides()) == ("ray", 2, [])


def test_deterministic():
    assert choose(2, 0, P, DEMO) == choose(2, 0, P, DEMO)


def test_view_from_raw():
    raw = {"placement": {"world_size": 2, "pools": {}}, "data": {"prompts_per_step": 8},
           "actor": {"mini_batch_size": 16}, "trainer": {"steps": 3}}
    v = view_from_raw(raw)
    assert (v.world_size, v.backend, v.mode, v.prompts_per_step, v.rows_per_update, v.has_pools) == \
        (2, None, None, 8, 16, False)
    assert view_from_raw({"placement": "auto"}) == AutoView()
    with pytest.raises(ValueError, match="placement: expected"):
        view_from_raw({"placement": 3})


def test_bad_machine():
    with pytest.raises(ValueError, match="cores >= 1"):
        choose(0, 0, P, DEMO)


def test_machine_and_model_size_probes():
    from pathlib import Path

    from baton.controller.auto_placement import count_model_params, detect_machine
    from baton.models.load import load_model

    cores, gpus = detect_machine()
    assert cores >= 1 and gpus >= 0
    demo = Path(__file__).resolve().parents[1] / "checkpoints" / "arith-sft"
    real = sum(p.numel() for p in load_model(demo).parameters())  # the weights, really loaded
    assert count_model_params(str(demo)) == real < MIN_DP_PARAMS


def test_no_generator_ahead_where_the_recipe_cannot_have_one():
    # rows from the environments, dynamic sampling, remax: every core holds a rank instead
    for raw in ({"data": {"source": "api", "prompts_per_step": 64}},
                {"data": {"prompts_per_step": 64}, "algo": {"dynamic_sampling": True}},
                {"data": {"prompts_per_step": 64}, "algo": {"advantage": "remax"}}):
        view = view_from_raw(raw)
        assert view.overlap_ok is False
        c = choose(2, 0, SMALL, view)
        assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("ray", 2, False, 1)
        assert "cannot run ahead" in c.line()
        c = choose(2, 0, SMALL, view_from_raw({**raw, "placement": {"world_size": 1}}))  # 1 rank as set
        assert (c.world_size, c.overlap, c.threads_per_worker) == (1, False, 2)
    assert view_from_raw({"data": {"source": "rollout"}}).overlap_ok


def test_no_more_cpu_ranks_than_fit_in_memory():
    """The Qwen2.5-0.5B shape (494M) on 2 cores and 24 GiB: a rank needs ~12 GiB
    (RANK_BYTES_PER_PARAM = 26 B a parameter), the generator ~2.8 GiB; 80% of 24 GiB = 19.2 GiB
    holds one rank and the generator, not two ranks (Ray's OOM monitor killed them at 10.5 GB
    each). With 256 GiB: one rank per core, as without a limit."""
    q05 = 494_000_000
    c = choose(2, 0, q05, DEMO, memory_bytes=24 * 2**30)
    assert (c.backend, c.world_size, c.overlap, c.threads_per_worker) == ("local", 1, True, 1)
    assert "~12.0 GiB a rank, 1 rank(s) fit in 80% of 24 GiB" in c.line() and "generates ahead" in c.line()
    assert choose(2, 0, q05, DEMO, memory_bytes=256 * 2**30) == choose(2, 0, q05, DEMO)
    assert choose(2, 0, q05, DEMO).world_size == 2
    # 16 cores, 64 GiB: (51.2 - 2.8) // 12.0 = 4 ranks (4 divides 64 prompts) + the generator
    assert choose(16, 0, q05, DEMO, memory_bytes=64 * 2**30).world_size == 4
    # not even one rank fits: one, said so; an explicit world size wins; GPUs are not limited here
    c = choose(2, 0, 1_500_000_000, DEMO, memory_bytes=24 * 2**30)
    assert c.world_size == 1 and "not even one does" in c.line()
    assert choose(2, 0, q05, AutoView(prompts_per_step=64, world_size=2), memory_bytes=24 * 2**30).world_size == 2
    assert choose(16, 2, q05, DEMO, memory_bytes=24 * 2**30).world_size == 2
    # a recipe that cannot generate ahead: one rank, colocated
    c = choose(2, 0, q05, AutoView(prompts_per_step=64, overlap_ok=False), memory_bytes=24 * 2**30)
    assert (c.world_size, c.overlap, c.threads_per_worker) == (1, False, 2)
