"""Prompt data: loaders (jsonl, task generators, HF datasets on disk) and a resumable sampler."""

from baton.data.prompts import PromptSampler, load_hf_disk, load_jsonl, load_prompts

__all__ = ["PromptSampler", "load_hf_disk", "load_jsonl", "load_prompts"]
