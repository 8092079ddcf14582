#!/usr/bin/env bash
# The GPU check: tests/gpu/ and the GPU benchmarks' short forms on a CUDA machine, one table.
#
#   scripts/gpu_check.sh            (from the repository root; about 6-8 minutes on an H100/H200)
#
# Made for the GPU test machine (../shared/reference/gpu-device.md): no package registry, no
# Ray, no vLLM, torch/transformers from the image. baton runs from source; the small wheels it
# lacks (fastapi, pydantic, openai, trl, ...) come in .whl/ and are installed into .site/
# (both git-ignored) when .whl/ is there. Prepare .whl/ on a machine with the registry with
# the `pip download` line of gpu-device.md. Logs go to $OUT (the device tool's folder) or
# ./gpu_check_logs; at most 8 files. Each step has its own time limit, so a hang in one
# still leaves the table; the whole run stays under 8 minutes.
set -u
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/gpu_check_logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$PWD/.site" .whl/*.whl \
    >"$LOGS/0_wheels.log" 2>&1 || echo "wheel install failed: $LOGS/0_wheels.log"
fi
export PYTHONPATH="$PWD/.site:$PWD${PYTHONPATH:+:$PYTHONPATH}"

ROWS=()
step() {  # step NAME LIMIT_S LOG CMD...: run CMD with a time limit, record status, seconds, a summary line
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$log" 2>&1
  local rc=$? secs=$((SECONDS - t0)) status=ok
  [ $rc -eq 124 ] && status="TIMEOUT" || { [ $rc -ne 0 ] && status="FAIL($rc)"; }
  ROWS+=("$(printf '%-26s %-9s %5ss  %s' "$name" "$status" "$secs" "$(summary "$log")")")
}
summary() {  # the line of a log that says the most
  grep -E "passed|failed|error|x$|tokens/s|speed of|step time" "$LOGS/$1" | tail -1 | cut -c1-90
}

"$PY" - >"$LOGS/1_env.log" 2>&1 <<'EOF'
import torch, transformers
print(f"torch {torch.__version__} cuda {torch.version.cuda} | transformers {transformers.__version__}")
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA")
EOF
cat "$LOGS/1_env.log"

# addopts replaced: pyproject's `-n 2` needs pytest-xdist, which the GPU image lacks (one process there)
step "pytest tests/gpu" 330 2_tests_gpu.log \
  "$PY" -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu tests/gpu --timeout 240 -rs
step "grpo vs trl (cuda, short)" 150 3_grpo_vs_trl.log \
  "$PY" bench/grpo_vs_trl.py --device cuda --shape 5m --steps 3 --prompts 8 --G 4 --max-new-tokens 32 \
  --runs baton@4,trl@4
# the engine goal (issue 28 section 2): bf16, Qwen2.5-0.5B shape, 128 prompts x 256 new tokens,
# engine vs HF generate and the fraction of the decode limit (its last line)
step "engine 0.5b bf16 128x256" 150 4_engine.log \
  "$PY" bench/engine_throughput.py --device cuda --dtype bfloat16 --sizes 0.5b --prompts 128 --new-tokens 256 \
  --repeats 3 --no-hf-runner

echo
printf '%-26s %-9s %6s  %s\n' "check" "status" "time" "summary"
printf '%s\n' "${ROWS[@]}"
echo "logs: $LOGS"
