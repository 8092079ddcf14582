#!/usr/bin/env bash
# The GPU check: tests/gpu/ and the GPU benchmarks' short forms on one CUDA machine, a table
# whose rows print as each step finishes.
#
#   scripts/gpu_check.sh            (from the repository root; at most 6 minutes, every limit hit)
#
# For any CUDA machine with torch, transformers and their usual companions (peft, accelerate,
# safetensors, tokenizers, numpy, pyyaml, rich, httpx, pandas, pyarrow, psutil, pytest,
# pytest-timeout) and no package registry: no Ray, no vLLM. baton runs from source. The
# small wheels it lacks come in .whl/ (git-ignored) and are installed into .site/; a missing
# .whl/ is an error row (the tests that import those packages would fail), not skipped.
#
# The wheels (pins that import together: installed with --no-deps into an empty --target and
# every module tests/gpu and the benchmarks import imported from there; pydantic-core is the
# one pydantic 2.14.4 needs; openai 3.57 imports httpx2 -> httpcore2 -> truststore; uvicorn
# needs click; datasets needs xxhash (and the machine's pandas); aiohttp stays optional):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 click==8.5.1 pydantic==2.14.4 pydantic-core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 annotated-doc==0.0.7 opentelemetry-api==1.45.2 \
#     math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 \
#     openai==3.57.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
#     trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0
# (--python-version: the GPU machine's Python; about 9 MB in all.)
#
# Rows: every file of tests/gpu (pytest -v: a step killed at its limit still lists the tests
# that ended); GRPO vs TRL at the goal's shape (a random Qwen2.5-0.5B built on the GPU in bf16,
# 16 prompts x 8 samples x 128 new tokens); the engine vs HF generate (0.5B bf16, HF's
# baseline timed once) with its fraction of the decode limit. Left out: GRPO vs TRL at the 5M
# smoke shape (the 0.5B row runs the same code, and its ~45 s do not fit). Each row: status,
# seconds, the peak GPU memory while it ran (nvidia-smi, every 0.5 s) and its log's telling
# line (the benches print each rate as it is measured). Logs go to $OUT (the device tool's
# folder) or ./gpu_check_logs, at most 8 files. Exit status: 1 if any row is not ok.
#
# Each step's time limit (STEP=N) comes from an estimate of its work over the rates below,
# times a margin, both written on the `# estimate:` line above it; tests/test_gpu_check.py
# computes every estimate from these rates and fails when a limit is below estimate x margin,
# or when the limits with their kill grace sum to 360 s or more. A rate's source:
#   h200     measured on an H200 at bac2e1f (../shared reference: engine vs HF generate, 0.5B bf16)
#   cpu      measured on the project's shared 2-core CPU at load ~9 (host-side work, which a
#            16-core idle GPU machine does no slower)
#   assumed  not measured yet: the first device run replaces it (its log prints the figure)
# rate: start = 6 s (cpu 5.5: import torch, transformers, baton; + a CUDA context, assumed)
# rate: collect = 8 s (cpu 19 at load 9, ~6 quiet: pytest importing tests/gpu)
# rate: pip = 1.2 s (cpu: pip's own start)
# rate: unpack_mb = 0.5 s (assumed: a MB of wheels installed)
# rate: gpu_test = 2 s (assumed: a tiny-model GPU test; its CPU twin takes 0.3-2 s)
# rate: check_05b = 8 s (assumed: the 0.5B bf16 logprob test, 2 engines x 2048 tokens + 32 HF forwards)
# rate: serve = 12 s (assumed: `baton serve` start in a child, one request)
# rate: recipe_first = 15 s (cpu 14.5: the first in-process 2-step `baton train`, lazy imports)
# rate: recipe_run = 3 s (cpu 2.3-3.0: each later 2-step tiny run)
# rate: hf_tok_s = 5636 tokens/s (h200: HF generate, 0.5B bf16, 128 x 256)
# rate: engine_tok_s = 11064 tokens/s (h200: the eager engine, same; graphs are faster)
# rate: build_05b = 2 s (assumed: the random 0.5B initialised on the GPU, 1 GB of bf16 saved)
# rate: load_05b = 3 s (assumed: 1 GB of bf16 read into fp32)
# rate: trl_import = 12 s (assumed: trl, datasets, accelerate imported)
# rate: update_05b = 1.5 s (assumed: a 0.5B fwd + bwd over 128 x ~160 tokens, bf16, and AdamW)
# rate: eval_05b = 1.5 s (assumed: baton's start / end evaluation, 8 prompts)
set -u
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/gpu_check_logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
KILL_AFTER=5  # seconds a step gets after its limit's TERM before KILL
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONPATH="$PWD/.site:$PWD${PYTHONPATH:+:$PYTHONPATH}"

FAILED=0
peak_mib() {  # peak_mib PID: the most GPU memory used (MiB) while PID runs, sampled every 0.5 s
  local pid=$1 peak=0 used
  command -v nvidia-smi >/dev/null 2>&1 || { echo "-"; return; }
  while kill -0 "$pid" 2>/dev/null; do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | sort -n | tail -1)
    [ -n "$used" ] && [ "$used" -gt "$peak" ] 2>/dev/null && peak=$used
    sleep 0.5
  done
  echo "$peak"
}
summary() {  # the line of a log that says the most
  grep -E "passed|failed|PASSED|FAILED|error|Error|x$|tokens/s|speed of|step time|missing" "$LOGS/$1" | tail -1 | cut -c1-100
}
row() {  # row NAME STATUS SECONDS PEAK SUMMARY: print one row of the table now
  printf '%-28s %-10s %5ss %8s  %s\n' "$1" "$2" "$3" "$4" "$5"
  [ "$2" = ok ] || FAILED=1
}
step() {  # step NAME LIMIT_S LOG CMD...: CMD under a time limit, its row printed when it ends
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$SECONDS
  timeout --kill-after="$KILL_AFTER" "$limit" "$@" >"$LOGS/$log" 2>&1 &
  local pid=$!
  local peak
  peak=$(peak_mib "$pid")
  wait "$pid"
  local rc=$? status=ok
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status=TIMEOUT || { [ $rc -ne 0 ] && status="FAIL($rc)"; }
  [ "$peak" = "-" ] || peak="${peak}MiB"
  row "$name" "$status" "$((SECONDS - t0))" "$peak" "$(summary "$log")"
}

printf '%-28s %-10s %6s %8s  %s\n' "check" "status" "time" "peak" "summary"
if ls .whl/*.whl >/dev/null 2>&1; then
  # estimate: pip + 9 * unpack_mb; margin 2
  STEP=15; step "wheels (.whl -> .site)" $STEP 0_wheels.log \
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$PWD/.site" .whl/*.whl
else
  echo "error: no wheels in $PWD/.whl (see this script's header for the download line)" >"$LOGS/0_wheels.log"
  row "wheels (.whl -> .site)" "MISSING" 0 "-" "error: .whl/ missing: fastapi, pydantic, openai, trl, ... not installed"
fi
# estimate: start; margin 1.6
STEP=10; step "environment" $STEP 1_env.log "$PY" -c '
import importlib.util, torch, transformers
print(f"torch {torch.__version__} cuda {torch.version.cuda} | transformers {transformers.__version__}")
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA")
missing = [m for m in ("fastapi", "uvicorn", "pydantic", "openai", "math_verify", "trl", "datasets")
           if importlib.util.find_spec(m) is None]
print(f"missing modules: {missing}" if missing else "every module the checks import is there")
if torch.cuda.is_available():
    from baton.algos.linear_logprobs import _mixed_addmm_ok
    from baton.rollout.embedded.cuda_graphs import HAS_LIVENESS_CHECK
    ok = _mixed_addmm_ok(torch.device("cuda"), torch.bfloat16, torch.float32)
    print(f"addmm bf16 -> fp32 in place: {ok} (no: training upcasts each chunk); graph liveness check: {HAS_LIVENESS_CHECK}")
raise SystemExit(1 if missing or not torch.cuda.is_available() else 0)'
cat "$LOGS/1_env.log"

# addopts replaced: pyproject's `-n auto` needs pytest-xdist, which such a machine may lack (one process);
# -v: each test's line as it ends. Two steps, so a hang in the recipes still leaves the rest
PYTEST=("$PY" -m pytest -v -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu -rA --timeout 60)
# estimate: collect + 16 * gpu_test + check_05b + serve; margin 1.3
STEP=80; step "pytest gpu engine+serve+..." $STEP 2_tests_engine.log "${PYTEST[@]}" tests/gpu/test_engine_cuda.py \
  tests/gpu/test_fast_families_cuda.py tests/gpu/test_eval_serve_cuda.py tests/gpu/test_update_side_cuda.py
# estimate: collect + recipe_first + 23 * recipe_run; margin 1.25
STEP=118; step "pytest gpu recipes" $STEP 3_tests_recipes.log "${PYTEST[@]}" tests/gpu/test_recipes_cuda.py
# the goal's shape (issue 36): random Qwen2.5-0.5B, 16 prompts x 8 samples x 128 new tokens, bf16 autocast
# 2 steps (the first a warm-up: the median is step 2's), each side's rollout of 16 x 8 x 128 tokens and update
# estimate: 2 * start + trl_import + build_05b + 2 * load_05b + 2 * eval_05b + 2 * (16 * 8 * 128 / engine_tok_s + 16 * 8 * 128 / hf_tok_s + 2 * update_05b); margin 1.3
STEP=65; step "grpo vs trl 0.5b 16x8x128" $STEP 4_grpo_vs_trl_05b.log \
  "$PY" bench/grpo_vs_trl.py --device cuda --shape qwen2.5-0.5b --steps 2 --prompts 16 --G 8 --max-new-tokens 128 \
  --runs baton@4,trl@4
# the engine goal: bf16, Qwen2.5-0.5B shape, 128 prompts x 256 new tokens, engine vs HF generate (once);
# its summary line carries the fraction of the decode limit
# estimate: start + build_05b + 128 * 256 / hf_tok_s + 4 * 128 * 256 / engine_tok_s; margin 1.3
STEP=35; step "engine 0.5b bf16 128x256" $STEP 5_engine.log \
  "$PY" bench/engine_throughput.py --device cuda --dtype bfloat16 --sizes 0.5b --prompts 128 --new-tokens 256 \
  --repeats 1 --hf-once --no-hf-runner

echo "logs: $LOGS"
exit $FAILED
