"""The tiny model presets' shapes (names for `baton make-tiny --preset` and `model.preset`):
a plain dict, so the command line lists them without importing torch (baton.models.tiny
builds them). A preset with a `family` builds that architecture whatever the default family
(the mixture-of-experts presets: their shape only means something for their family)."""

PRESETS: dict[str, dict[str, int | str]] = {
    "0.2m": dict(hidden=64, layers=4, heads=4, kv_heads=2, intermediate=192),  # a student for the 0.75m teacher
    "0.75m": dict(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384),
    "2m": dict(hidden=192, layers=5, heads=6, kv_heads=2, intermediate=576),
    "5m": dict(hidden=256, layers=6, heads=8, kv_heads=4, intermediate=768),
    "25m": dict(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536),
    # mixtures of experts: 4 experts, 2 per token, in every layer
    "qwen3-moe": dict(family="qwen3_moe", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, experts=4, top_k=2),
    "mixtral": dict(family="mixtral", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, experts=4, top_k=2),
}

FAMILIES = ("qwen2", "llama", "qwen3_moe", "mixtral")  # `--family` / `model.family` (baton.models.tiny builds them)
MOE_FAMILIES = ("qwen3_moe", "mixtral")
