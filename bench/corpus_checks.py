"""The corpus reader's choice over the whole IPython corpus, read statically (nothing replayed): what it keeps and why.

Reads the IPython corpus (../shared/data/ipython, or THEMISTO_IPYTHON_DIR) with the project's reader
(`themisto.ingest.ipython_corpus.read_corpus`) and prints counts only, never a name: sessions read and long enough,
trajectories, steps and developers kept, sessions left out and trajectories cut by cause, how many started in another
folder than their matched notebook's, and seconds. The kernel environment's modules are asked of its interpreter
(`--python`, default the wild one), so the same figures come from any checkout of the reader (`PYTHONPATH=CHECKOUT`).

    python bench/corpus_checks.py                                    # defaults: 5 sessions a developer, 120 steps
    python bench/corpus_checks.py --per-developer 0 --min-steps 1 --save /tmp/after.json   # every session
    python bench/corpus_checks.py --per-developer 0 --min-steps 1 --against /tmp/before.json
    python bench/corpus_checks.py --plus "tensorflow=tensorflow,keras;torch=torch"   # each package added in turn

`--save` writes each trajectory's start folder, notebook folder and cut (trajectory ids are hashes); `--against` a
saved run compares them: trajectories whose start folder or cut changed, and how. `--plus` adds to the environment's
modules one package's import names at a time (`name=module,module;...`, cumulative) and prints the trajectories and
developers each brings.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, report  # noqa: E402

CORPUS = Path(os.environ.get("THEMISTO_IPYTHON_DIR", REPO.parent / "shared" / "data" / "ipython"))


def _summary(read) -> dict:
    report_ = read.report
    moved = sum(1 for t in read.trajectories if (t.start_dir or "") != _folder(t.notebook))
    return {"sessions_read": report_.sessions_read, "sessions_long_enough": report_.sessions_long_enough,
            "trajectories": report_.trajectories, "steps": report_.steps, "developers": report_.developers,
            "left_out": dict(sorted(report_.left_out.items())), "cut": dict(sorted(report_.cut.items())),
            "matched_notebook": report_.matched_notebook, "started_elsewhere_than_the_notebook": moved}


def _folder(notebook: str) -> str:
    return notebook.rsplit("/", 1)[0] if "/" in notebook else ""


def _per_trajectory(read) -> dict:
    return {t.id: {"start": t.start_dir or "", "notebook_folder": _folder(t.notebook), "steps": len(t.executions),
                   "developer": t.participant, "cut": t.provenance.get("cut")} for t in read.trajectories}


def _compare(before: dict, after: dict) -> dict:
    """What changed per trajectory between two saved runs."""
    both = sorted(set(before) & set(after))
    cuts: Counter = Counter()
    for key in both:
        old, new = before[key]["cut"] or {}, after[key]["cut"] or {}
        if (old.get("cause"), old.get("at")) != (new.get("cause"), new.get("at")):
            cuts[f"{old.get('cause', 'none')} -> {new.get('cause', 'none')}"] += 1
    return {"in_both": len(both), "only_before": len(set(before) - set(after)),
            "only_after": len(set(after) - set(before)),
            "start_changed": sum(before[k]["start"] != after[k]["start"] for k in both),
            "cut_changed": dict(cuts.most_common()),
            "steps_before": sum(before[k]["steps"] for k in both), "steps_after": sum(after[k]["steps"] for k in both)}


def _read_once() -> None:
    """Each database, log and notebook read once for the runs of --plus (only the environment's modules change
    between them; the repeated runs' reports do not count what was read)."""
    from themisto.ingest import ipython_corpus

    sessions, cells = {}, {}
    read_sessions, read_cells = ipython_corpus._sessions, ipython_corpus.notebook_cells

    def remembered_sessions(kind, file, report_):
        if file not in sessions:
            sessions[file] = read_sessions(kind, file, report_)
        return sessions[file]

    def remembered_cells(repo):
        if repo.folder not in cells:
            cells[repo.folder] = read_cells(repo)
        return cells[repo.folder]

    ipython_corpus._sessions, ipython_corpus.notebook_cells = remembered_sessions, remembered_cells


def main() -> None:
    from themisto.ingest.ipython_corpus import CorpusSettings, read_corpus
    from themisto.ingest.session_checks import importable_modules

    parser = arguments(__doc__)
    parser.add_argument("--python", default=str(REPO / ".venv-kernel-wild" / "bin" / "python"),
                        help="the kernel environment's interpreter (its modules decide `package_absent`)")
    parser.add_argument("--per-developer", type=int, default=5, help="sessions a developer (0: no cap)")
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--save", type=Path, help="write each trajectory's start folder and cut (JSON)")
    parser.add_argument("--against", type=Path, help="compare with a run saved by --save")
    parser.add_argument("--plus", default="", help="packages added one at a time: name=module,module;...")
    args = parser.parse_args()
    settings = CorpusSettings(sessions_per_developer=args.per_developer or 10**9, max_steps=args.max_steps,
                              min_steps=args.min_steps)
    modules = importable_modules(args.python)
    if args.plus:
        _read_once()
    start = time.perf_counter()
    read = read_corpus(CORPUS, settings, modules=modules)
    figures = {"settings": {"per_developer": args.per_developer, "max_steps": args.max_steps,
                            "min_steps": args.min_steps}, **_summary(read),
               "seconds": round(time.perf_counter() - start, 1)}
    mine = _per_trajectory(read)
    if args.save:
        args.save.write_text(json.dumps(mine, sort_keys=True), encoding="utf-8")
    if args.against:
        figures["against"] = _compare(json.loads(args.against.read_text(encoding="utf-8")), mine)
    added: list[dict] = []
    for part in (p for p in args.plus.split(";") if p.strip()):
        name, _, names = part.partition("=")
        modules = modules | {n.strip() for n in names.split(",") if n.strip()}
        more = read_corpus(CORPUS, settings, modules=modules).report
        added.append({"package": name.strip(), "trajectories": more.trajectories, "developers": more.developers,
                      "steps": more.steps, "package_absent_left_out": more.left_out.get("package_absent", 0)})
    if added:
        figures["plus"] = added
    report("corpus_checks", figures, args=args)


if __name__ == "__main__":
    main()
