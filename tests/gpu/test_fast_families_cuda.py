"""Issue 43 part A on CUDA: the families' fast path under CUDA graphs against HF's forward,
and the CPU's kernel count (`baton.rollout.embedded.op_count`) against the kernels a GPU launches.

Skipped without CUDA (CI); NOT YET RUN on a GPU (written without one). On a GPU machine:
    python3 -m pytest -q -s -m gpu tests/gpu/test_fast_families_cuda.py
Everything but the device is tested on the CPU in tests/rollout/test_fast_families.py and
tests/rollout/test_decode_kernels.py.
"""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from baton.rollout.embedded.llama import LlamaRunner
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.embedded.op_count import count_kernels
from baton.protocol import SamplingParams
from baton.rollout.embedded.static_decode import StaticDecoder
from tests.rollout.test_decode_kernels import model_of
from tests.rollout.test_fast_families import FAMILIES, PROMPTS, build, reference_logprobs

pytestmark = pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)


def test_rms_norm_is_one_cuda_kernel():
    """op_count's CPU stand-in is honest only if CUDA has the kernel it stands in for."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "CUDA")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_graphs_match_hfs_forward_fp32(family):
    model = build(family).cuda()
    outs = EmbeddedEngine(model).generate(PROMPTS, SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=0))
    for c in outs:
        ref = reference_logprobs(model.cpu(), PROMPTS[c.prompt_index], c.token_ids, 0.7)
        model.cuda()
        # CUDA's SDPA and matmul kernels sum in their own order: a looser bound than the CPU's 2e-5
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_cuda_kernels_a_step_are_the_cpu_count(family):
    """The kernels one static decode step launches (bf16, 24 layers at the 0.5B head layout),
    from the profiler, vs the CPU's dispatch count: SDPA or the norm may launch a helper
    kernel on some GPUs, a matmul a split-K reduction: so within half again."""
    model = model_of(family, 24)
    cpu = LlamaRunner(model)
    cpu.pack()
    ids = torch.randint(4, 60, (4, 8))
    with torch.no_grad():
        cpu.start(ids, torch.ones_like(ids), 8, 1)
        counted = sum(count_kernels(StaticDecoder(cpu, 4, step="fixed").step)[1].values())
        gpu = LlamaRunner(model.cuda())
        gpu.pack()
        gpu.start(ids.cuda(), torch.ones_like(ids).cuda(), 8, 1)
        step = StaticDecoder(gpu, 4, step="fixed").step
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
    launched = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")
    print(f"{family}: {launched} CUDA kernels a step, {counted} counted on the CPU")
    assert counted <= launched <= 1.5 * counted
