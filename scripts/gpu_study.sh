#!/usr/bin/env bash
# The fine-tuning study's generate-only part on a short rented GPU slot, in two calls (scripts/gpu_stage.py writes
# what each carries; docs/fine-tuning.md gives the calls):
#
#   bash scripts/gpu_study.sh stage .gpu/call1        # call 1: keep the wheels and the model's first part, install
#   bash scripts/gpu_study.sh run .gpu/call2 [--cpu]  # call 2: join and check the model, check the GPU, run, pack
#
# `run` joins the model's two parts and checks them by sha256, refuses a model whose weights differ from the study's,
# installs the carried wheels (into .gpu/kept/site, ahead of the image's packages), checks the GPU, runs
# `themisto study --generate-only --budget-s B` (units in run order, each written whole; a unit the budget cannot
# finish is not started), and packs what must come back into $OUT: study.tgz (the study folder without models/ and
# exports/), gpu.json (times, units done and left, GPU, versions), study.log, study.json.out, nvidia-smi.txt, and
# generation.json and .log (bench/batched_generation.py: both generation paths' prompts/s and how many answers
# agree). It packs whatever happened, so a failed or stopped run still returns its whole units; it ends within
# THEMISTO_GPU_LIMIT_S (570 s: a call's limit is 600).
#
# PYTHON (default python3) is the interpreter; --cpu runs it without a GPU (a check of the path: the tiny model, a
# reduced study). THEMISTO_GPU_BUDGET_S overrides the staged budget.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
KEPT=${THEMISTO_GPU_KEPT:-$REPO/.gpu/kept}
OUT=${OUT:-$REPO/.gpu/out}
started=$(date +%s)
say() { echo "== gpu_study [$(( $(date +%s) - started )) s]: $*" >&2; }
usage() { echo "usage: bash scripts/gpu_study.sh stage CALL1_DIR | run CALL2_DIR [--cpu]" >&2; exit 2; }

[ $# -ge 2 ] || usage
MODE=$1; CALL=$2; CPU=0
[ "${3:-}" = "--cpu" ] && CPU=1
[ -f "$CALL/stage.json" ] || { echo "gpu_study: $CALL has no stage.json (scripts/gpu_stage.py stage writes it)" >&2; exit 2; }
mkdir -p "$KEPT" "$OUT"
stage_value() { "$PYTHON" -c "import json,sys; print(json.load(open('$KEPT/stage.json'))$1)"; }

keep() {  # what a call carried, moved where the next call does not replace it (a study begun here is kept)
  for item in "$CALL"/*; do
    if [ "$(basename "$item")" = study ] && [ -d "$KEPT/study" ]; then continue; fi
    rm -rf "$KEPT/$(basename "$item")"
    mv "$item" "$KEPT/"
  done
}

install_wheels() {
  [ -d "$KEPT/wheels" ] || { say "no wheels carried: the image's packages as they are"; return 0; }
  [ -f "$KEPT/site/.installed" ] && return 0
  say "installing $(ls "$KEPT"/wheels/*.whl | wc -l) carried wheels into $KEPT/site"
  "$PYTHON" -m pip install -q --no-deps --no-index --target "$KEPT/site" "$KEPT"/wheels/*.whl
  touch "$KEPT/site/.installed"
}

check_imports() {
  export PYTHONPATH="$KEPT/site:$REPO"
  if ! "$PYTHON" -c "import transformers, trl, peft, datasets, gguf" 2>"$KEPT/imports.txt"; then
    # The carried transformers may need a newer huggingface_hub than the image has: use the image's own.
    say "the carried transformers does not import here ($(tail -1 "$KEPT/imports.txt")): the image's transformers"
    rm -rf "$KEPT"/site/transformers "$KEPT"/site/transformers-* "$KEPT"/site/tokenizers "$KEPT"/site/tokenizers-*
    "$PYTHON" -c "import transformers, trl, peft, datasets, gguf" || { say "the packages do not import"; exit 4; }
  fi
  "$PYTHON" -c "import themisto.cli, themisto.study.run, transformers, torch
print('torch', torch.__version__, 'transformers', transformers.__version__)" >&2
}

if [ "$MODE" = "stage" ]; then
  keep
  install_wheels
  check_imports
  say "staged; now call 2 (run) while the machine is still up"
  exit 0
fi
[ "$MODE" = "run" ] || usage
keep

pack() {  # whatever happened: the whole units there are, and what the run said
  local rc=$?
  set +e
  [ -f "$OUT/study.log" ] && tail -c 4000000 "$OUT/study.log" > "$OUT/study.log.tail" && \
    mv "$OUT/study.log.tail" "$OUT/study.log"  # a file that comes back is at most 16 MiB
  if [ -d "$KEPT/study" ]; then
    tar -czf "$OUT/study.tgz" -C "$KEPT" --exclude=study/models --exclude=study/exports --exclude='*.checkpoints' \
      --exclude=study/.lock study
  fi
  "$PYTHON" - "$KEPT/study" "$OUT" "$started" "${STUDY_RC:-none}" <<'PY'
import json, platform, sys, time
from pathlib import Path
study, out, started, rc = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
units = [json.loads(p.read_text()) for p in sorted((study / "units").glob("*.json"))] if (study / "units").is_dir() else []
info = {"seconds": round(time.time() - started, 1), "study_exit": rc, "python": platform.python_version(),
        "units_done": [u["unit"] for u in units],
        "prompts": sum(u.get("prompts") or 0 for u in units),
        "generate_seconds": round(sum(u.get("generate_seconds") or 0 for u in units), 1),
        "train_seconds": round(sum(u.get("train_seconds") or 0 for u in units), 1)}
try:
    import torch, transformers
    info.update(torch=torch.__version__, transformers=transformers.__version__,
                gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
except Exception as exc:  # the report still comes back
    info["import_error"] = str(exc)
(out / "gpu.json").write_text(json.dumps(info, indent=2) + "\n")
PY
  say "packed into $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return $rc
}
trap pack EXIT

NAME=$(stage_value "['model_name']")
say "joining the model's parts into $KEPT/model.tar"
cat "$KEPT"/model.tar.part1 "$KEPT"/model.tar.part2 > "$KEPT/model.tar"
GOT=$(sha256sum "$KEPT/model.tar" | cut -d' ' -f1)
WANT=$(stage_value "['model_tar_sha256']")
if [ "$GOT" != "$WANT" ]; then
  echo "gpu_study: the joined model's sha256 is $GOT, the staged one $WANT: a part is missing or damaged" >&2
  exit 3
fi
rm -rf "$KEPT/model" && mkdir -p "$KEPT/model" && tar -xf "$KEPT/model.tar" -C "$KEPT/model" && rm "$KEPT/model.tar"
MODEL="$KEPT/model/$NAME"
install_wheels
check_imports
WEIGHTS=$("$PYTHON" -c "from themisto.training.finetune import describe_base_model
print(describe_base_model('$MODEL').get('weights_sha256'))")
if [ "$WEIGHTS" != "$(stage_value "['weights_sha256']")" ]; then
  echo "gpu_study: $MODEL's weights ($WEIGHTS) differ from the study's base model: refusing to start" >&2
  exit 3
fi
if [ "$CPU" = 0 ]; then
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || { say "no nvidia-smi: no GPU here (--cpu checks the path without one)"; exit 5; }
  "$PYTHON" -c "import torch, sys
ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
print('GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, 'bf16', ok, file=sys.stderr)
sys.exit(0 if ok else 5)"
fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
# The two generation paths on the release's prompts: their prompts/s, and how many answers agree (float32, bfloat16).
BENCH_PROMPTS=${THEMISTO_GPU_BENCH_PROMPTS:-$([ "$CPU" = 1 ] && echo 4 || echo 64)}
say "the generation paths on $BENCH_PROMPTS prompts (bench/batched_generation.py, at most 75 s)"
timeout 75 "$PYTHON" bench/batched_generation.py --release "$KEPT/release" --model "$MODEL" --prompts "$BENCH_PROMPTS" \
  --max-new-tokens "$([ "$CPU" = 1 ] && echo 8 || echo 128)" --json > "$OUT/generation.json" 2> "$OUT/generation.log" \
  || say "the generation bench did not finish (generation.log)"
# Everything must be packed before the slot's command limit: the study's budget and its backstop fit what is left.
LIMIT=${THEMISTO_GPU_LIMIT_S:-570}
LEFT=$(( LIMIT - ($(date +%s) - started) ))
BUDGET=${THEMISTO_GPU_BUDGET_S:-$(stage_value "['budget_s']")}
BUDGET=$(( ${BUDGET%.*} < LEFT - 120 ? ${BUDGET%.*} : LEFT - 120 ))
mapfile -t OPTIONS < <("$PYTHON" -c "import json; print('\n'.join(json.load(open('$KEPT/stage.json'))['study_options']))")
say "the study's generate-only part within ${BUDGET} s (${LEFT} s left of ${LIMIT}): ${OPTIONS[*]}"
set +e
# The budget starts no unit it cannot finish; the timeout is the backstop (a unit's estimate was wrong).
timeout --signal=INT "$(( LEFT - 30 ))" "$PYTHON" -m themisto.cli study --release "$KEPT/release" \
  --model "$MODEL" -o "$KEPT/study" "${OPTIONS[@]}" --generate-only --budget-s "$BUDGET" --json \
  > "$OUT/study.json.out" 2> "$OUT/study.log"
STUDY_RC=$?
set -e
say "the study ended with exit status $STUDY_RC"
exit "$STUDY_RC"
