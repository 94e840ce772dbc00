"""The score subcommand: a run folder, or predictions against a release."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from themisto.cli.common import (CommandError, add_ray_option, add_source_options, default_of, scoring_runner,
                                 source_folders)
from themisto.vocabulary import CLUSTER_UNITS, TASKS


def _score_run_folder(args: argparse.Namespace) -> int:
    """`themisto score RUN/`: every context of a run folder, the baselines, intervals; prints the summary (the whole
    Markdown table with --tables), the tables go to results.md beside results.json."""
    from themisto.release.folder import open_release
    from themisto.scoring.results_table import render_markdown, render_summary
    from themisto.scoring.records import ScoreSettings
    from themisto.scoring.run_scores import score_run

    if args.predictions is not None:
        raise CommandError("give either a run folder or --predictions, not both")
    from themisto.scoring.intervals import IntervalSettings

    if args.run_dir.suffix == ".eval" and not args.run_dir.is_dir():  # an Inspect log: scored as its run folder
        from themisto.harness.log_run import run_folder_from_log

        args.run_dir = run_folder_from_log(args.run_dir)
        print(f"read the Inspect log into the run folder {args.run_dir}", file=sys.stderr)

    if tuple(args.k) != default_of(ScoreSettings, "k"):
        raise CommandError("--k is for --predictions: a run folder's pass@k follows the samples it generated "
                           "(themisto generate --samples)")
    # The release given, else the one the run folder names (score_run opens that one): once for the command.
    release = open_release(args.release) if args.release is not None else None
    results = score_run(args.run_dir, release=release, execute=args.execute, out=args.output,
                        runner=scoring_runner(args), workspace=source_folders(args),
                        settings=IntervalSettings(cluster=args.cluster), scoring=_score_settings(args),
                        resume=not args.no_resume)
    if args.json:
        print(json.dumps(results, ensure_ascii=False, sort_keys=True))
    else:
        written = Path(args.output) if args.output else args.run_dir / "results.json"
        tables = written.with_name("results.md" if args.output is None else written.stem + ".md")
        print(render_markdown(results) if args.tables else render_summary(results, tables), end="")
        print(f"wrote {written} and {tables.name} in {results['seconds']:.1f} s")
    return 0


def _score_settings(args: argparse.Namespace):
    """The scorer's settings from the command line (a run folder's task is its own: score_run sets it)."""
    from themisto.scoring.records import ScoreSettings

    return ScoreSettings(task=args.task, k=tuple(args.k), timeout_s=args.prediction_timeout,
                         max_reference_s=args.max_reference_s, continuation_cells=args.continuation_cells,
                         restore=args.restore)


def summary_command(args: argparse.Namespace) -> int:
    """Print the short summary of scored run folders (their results.json), one block per run."""
    from themisto.bounded import read_json
    from themisto.scoring.results_table import render_summary
    from themisto.scoring.run_scores import RESULTS_JSON, RESULTS_MD

    blocks = []
    for run in args.runs:
        path = run / RESULTS_JSON
        if not path.is_file():
            raise CommandError(f"{path}: no results (score the run first: themisto score {run})")
        results = read_json(path)
        blocks.append(render_summary(results, run / RESULTS_MD))
    print("\n".join(blocks), end="")
    return 0


def add_summary(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("summary", help="the short summary of scored run folders: the headline metric, "
                                                   "model against the best baseline, the runtime effect")
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders scored by themisto score")
    parser.set_defaults(run=summary_command)


def score_command(args: argparse.Namespace) -> int:
    """Score a predictions JSONL against a release: text scores, and with --execute (and HF_ALLOW_CODE_EVAL=1)
    execution in the exact pre-cell state; results are written per trajectory and a rerun resumes."""
    from themisto.gate import permit
    from themisto.release.folder import open_release
    from themisto.scoring.scorer import ScoreSettings, score_to_file

    if args.run_dir is not None:
        return _score_run_folder(args)
    if args.release is None or args.predictions is None or args.output is None:
        raise CommandError("give a run folder (themisto score RUN/), or --release, --predictions and -o")
    settings = _score_settings(args)
    if args.execute:
        permit(execute=True)  # refused before anything is read
    run = score_to_file(open_release(args.release), args.predictions, args.output, settings, execute=args.execute,
                        workspace=source_folders(args), resume=not args.no_resume, runner=scoring_runner(args))
    scores = run.result.scores
    if args.json:
        print(json.dumps({"output": str(run.path), "scores": scores, "notes": run.result.notes,
                          "resumed": run.resumed, "seconds": round(run.seconds, 2)}, ensure_ascii=False,
                         sort_keys=True))
    else:
        for name, value in scores.items():
            print(f"{name}: {value:.4f}" if isinstance(value, float) else f"{name}: {value}")
        for note in run.result.notes:
            print(f"note: {note}")
        print(f"wrote {run.path} in {run.seconds:.1f} s")
    return 0


class _DeprecatedAlias(argparse.Action):
    """An option's old name: it still sets the option and prints a one-line note on stderr."""

    def __init__(self, option_strings, dest, new_name: str, **kwargs):
        self.new_name = new_name
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"themisto score: {option_string} is deprecated; use {self.new_name}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_score(subparsers: argparse._SubParsersAction) -> None:
    from themisto.scoring.intervals import IntervalSettings
    from themisto.scoring.records import ScoreSettings

    k = list(default_of(ScoreSettings, "k"))
    parser = subparsers.add_parser("score", help="score a run folder, or predictions against a release "
                                                 "(text; --execute: run them)")
    parser.add_argument("run_dir", nargs="?", type=Path, metavar="RUN",
                        help="a run folder (themisto generate -o RUN/), or an Inspect log LOG.eval of a Themisto task "
                             "(read into the run folder LOG.run/): writes RUN/results.json and RUN/results.md")
    parser.add_argument("--release", type=Path, metavar="DIR",
                        help="release folder (themisto build); for a run folder, default: the one run.json names")
    parser.add_argument("--task", choices=TASKS, default=default_of(ScoreSettings, "task"),
                        help="the task the predictions answer (with --predictions; default %(default)s)")
    # The option's name before it was --task, as every other command calls it; kept for scripts.
    parser.add_argument("--config", dest="task", choices=TASKS, action=_DeprecatedAlias, new_name="--task",
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--predictions", type=Path, metavar="JSONL",
                        help='one {"id": ..., "prediction": str | [str, ...]} per line')
    parser.add_argument("--execute", action="store_true",
                        help="run next_cell predictions in the pre-cell state (also needs HF_ALLOW_CODE_EVAL=1)")
    parser.add_argument("--k", nargs="+", type=int, default=k,
                        help=f"pass@k for each k (default: {' '.join(map(str, k))})")
    parser.add_argument("--prediction-timeout", type=float, default=default_of(ScoreSettings, "timeout_s"),
                        metavar="S", help="seconds each executed prediction may run (grown for slow reference cells; "
                                          "default %(default)g)")
    parser.add_argument("--max-reference-s", type=float, default=default_of(ScoreSettings, "max_reference_s"),
                        metavar="S", help="an example whose reference took longer in the build's replay is refused "
                                          "unrun (default %(default)g)")
    parser.add_argument("--continuation-cells", type=int, default=default_of(ScoreSettings, "continuation_cells"),
                        metavar="K",
                        help="logged cells run after each prediction for continuation_match (default %(default)s; "
                             "0: off)")
    add_source_options(parser, "with --execute")
    parser.add_argument("--cluster", choices=CLUSTER_UNITS, default=default_of(IntervalSettings, "cluster"),
                        help="a run folder's intervals resample whole trajectories or whole participants "
                             "(a developer's trajectories are not independent; default %(default)s)")
    parser.add_argument("--restore", action="store_true",
                        help="with --execute: start each trajectory from the state its release's values restore "
                             "(checked against the state hash) instead of replaying the prefix, and restore again in "
                             "the same kernel before each later example whose gap costs more to replay")
    parser.add_argument("--no-resume", action="store_true", help="start over instead of resuming a stopped run")
    parser.add_argument("-o", "--output", type=Path, help="results JSON to write (a run folder: RUN/results.json)")
    parser.add_argument("--json", action="store_true", help="print {output, scores, notes, ...} as one JSON object")
    parser.add_argument("--tables", action="store_true",
                        help="a run folder: print the whole Markdown tables (results.md), not the short summary")
    add_ray_option(parser, "with --execute, score", unit="one trajectory per task")
    parser.set_defaults(run=score_command)
