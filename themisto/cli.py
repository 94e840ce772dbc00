"""The `themisto` command line: one function per subcommand, heavy imports inside it.

To add a subcommand, write `_add_<name>(subparsers)` (its arguments, `set_defaults(run=<function>)`) and a
`<name>_command(args) -> int`, then list `_add_<name>` in `SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

INGEST_SUFFIXES: tuple[str, ...] = (".log", ".csv", ".ipynb")
TASK_CHOICES: tuple[str, ...] = ("task1", "task2", "all")
SIZE_CHOICES: tuple[str, ...] = ("small", "medium", "full")


class CommandError(Exception):
    """A command-line mistake the user can fix; `main` prints it on stderr and exits with 2."""


# ---------------------------------------------------------------------------------------------------------------
# ingest


def _ingest_inputs(paths: Sequence[str]) -> list[Path]:
    """Expand directories into their .log/.csv/.ipynb files (sorted); reject other files."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in INGEST_SUFFIXES)
            if not inside:
                raise CommandError(f"{path}: no {', '.join(INGEST_SUFFIXES)} file in this directory")
            found.extend(inside)
        elif not path.exists():
            raise CommandError(f"{path}: no such file")
        elif path.suffix.lower() not in INGEST_SUFFIXES:
            raise CommandError(f"{path}: expected a {', '.join(INGEST_SUFFIXES)} file or a directory of them")
        else:
            found.append(path)
    return found


def _format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in counts.items()) or "none"


def _print_summary(traj_id: str, summary: dict) -> None:
    logged = summary.get("logged_execute_events")
    logged_note = f" ({logged} logged execute events)" if logged is not None else ""
    print(
        f"{traj_id}  {summary['notebook']} [{summary['task'] or 'no task'}, {summary['source']}]: "
        f"{summary['executions']} executions{logged_note}, {summary['errors']} errors, "
        f"{summary['restarts']} restarts, {summary['interrupts']} interrupts"
    )
    print(f"  statuses: {_format_counts(summary['statuses'])}")
    print(f"  errors by ename: {_format_counts(summary['errors_by_ename'])}")
    if summary.get("executions_without_code"):
        print(f"  executions whose code was not logged: {summary['executions_without_code']}")
    print(f"  not executions: {_format_counts(summary['ignored'])}")


def read_trajectories(paths: Sequence[str], *, skip_bad_lines: bool = False) -> list:
    """Read every input (.log, JuNE table .csv, .ipynb, or directories of them) into trajectories, ids unique."""
    from themisto.ingest.june import read_june_logs
    from themisto.ingest.june_table import read_june_table
    from themisto.ingest.notebook import read_notebook

    inputs = _ingest_inputs(paths)
    trajectories = []
    logs = [p for p in inputs if p.suffix.lower() == ".log"]
    if logs:
        trajectories += [(", ".join(map(str, logs)), t) for t in read_june_logs(logs, skip_bad_lines=skip_bad_lines)]
    for path in inputs:
        if path.suffix.lower() == ".csv":
            trajectories += [(str(path), t) for t in read_june_table(path, skip_bad_lines=skip_bad_lines)]
        elif path.suffix.lower() == ".ipynb":
            trajectories.append((str(path), read_notebook(path)))
    seen: dict[str, str] = {}
    for origin, traj in trajectories:
        if traj.id in seen:
            raise CommandError(f"trajectory {traj.id} is read twice, from {seen[traj.id]} and from {origin}")
        seen[traj.id] = origin
    return [t for _, t in trajectories]


def ingest_command(args: argparse.Namespace) -> int:
    """Read JuNE logs, JuNE tables and notebooks into trajectories, print their figures, write JSONL."""
    from themisto.ingest.trajectory import write_jsonl

    trajectories = read_trajectories(args.paths, skip_bad_lines=args.skip_bad_lines)
    # Everything is read and checked before the output file is written, so a bad input leaves no file behind.
    write_jsonl(trajectories, args.output)
    summaries = {t.id: t.summary() for t in trajectories}
    for traj_id, summary in summaries.items():
        unknown = {k: v for k, v in summary["ignored"].items() if k.startswith("unknown:")}
        if unknown:
            print(f"warning: {traj_id}: events of unknown kinds, not executions: {_format_counts(unknown)}",
                  file=sys.stderr)
        if summary["ignored"].get("bad_line"):
            print(f"warning: {traj_id}: {summary['ignored']['bad_line']} bad line(s) skipped", file=sys.stderr)
    if args.json:
        print(json.dumps(summaries, ensure_ascii=False, sort_keys=True))
    else:
        for traj_id, summary in summaries.items():
            _print_summary(traj_id, summary)
        print(f"wrote {len(trajectories)} trajectories to {args.output}")
    return 0


def _add_trajectory_inputs(parser: argparse.ArgumentParser, *, output_help: str) -> None:
    """The arguments of every command that reads trajectories (see `read_trajectories`) and writes one file."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".log, .csv (JuNE table) or .ipynb, or a directory")
    parser.add_argument("-o", "--output", required=True, type=Path, help=output_help)
    parser.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines")


def _add_ingest(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ingest", help="read JuNE logs/tables/notebooks into trajectories (JSONL)")
    _add_trajectory_inputs(parser, output_help="trajectories JSONL to write")
    parser.add_argument("--json", action="store_true", help="print one JSON object {trajectory_id: summary}")
    parser.set_defaults(run=ingest_command)


# ---------------------------------------------------------------------------------------------------------------
# workspace


def workspace_command(args: argparse.Namespace) -> int:
    """Write a replay workspace (look-alike task inputs generated from a seed) into a directory."""
    from themisto.ingest.workspace import write_workspace

    tasks = ["task1", "task2"] if args.task == "all" else [args.task]
    extra = {"overwrite": True} if args.overwrite else {}
    result = write_workspace(args.output, tasks, seed=args.workspace_seed, size=args.size, **extra)
    if args.json:
        print(json.dumps({"root": str(result.root), "files": result.files}, ensure_ascii=False, sort_keys=True))
    else:
        for rel, digest in sorted(result.files.items()):
            print(f"{digest}  {rel}")
        print(f"wrote {len(result.files)} files to {result.root}")
    return 0


def _add_workspace(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("workspace", help="write the task input files replay needs")
    parser.add_argument("--task", required=True, choices=TASK_CHOICES, help="whose input files to write")
    parser.add_argument("-o", "--output", required=True, type=Path, help="directory to write")
    parser.add_argument("--workspace-seed", type=int, default=0, help="seed of the look-alike inputs")
    parser.add_argument("--size", choices=SIZE_CHOICES, default="small", help="how many rows the inputs hold")
    parser.add_argument("--overwrite", action="store_true", help="replace DIR when it is not empty")
    parser.add_argument("--json", action="store_true", help="print one JSON object {root, files}")
    parser.set_defaults(run=workspace_command)


# ---------------------------------------------------------------------------------------------------------------
# replay


def _print_fidelity(report: dict) -> None:
    def share(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f} %"

    print(f"{report['kernel_id']}  {report['notebook']}: {report['executions_replayed']} executions replayed; "
          f"status match {share(report['status_match'])} of {report['comparable']}, "
          f"ename match {share(report['ename_match'])} of {report['logged_errors']} logged errors, "
          f"output types match {share(report['output_types_match'])}")
    for m in report["mismatches"]:
        print(f"  step {m['step']:>4} {m['kind']:<12} log: {m['logged']:<28} replay: {m['replayed']:<28} {m['reason']}")


def _add_ray_option(parser: argparse.ArgumentParser, what: str, unit: str = "one trajectory per task") -> None:
    parser.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help=f"{what} on Ray, {unit}: alone, a local Ray on this machine's cores; "
                             "else a cluster's address (host:port, ray://host:port, auto)")


def _ray_target(args: argparse.Namespace):
    """The Ray that --ray names, or None; without --ray nothing imports Ray."""
    if args.ray is None:
        return None
    from themisto.distributed.cluster import RayTarget

    return RayTarget(address=None if args.ray == "local" else args.ray)


def _replay_runner(args: argparse.Namespace):
    """The replay runner --ray asks for (an unreachable address is refused here, before any work), or None."""
    target = _ray_target(args)
    if target is None:
        return None
    from themisto.distributed.ray_runner import replay_runner

    return replay_runner(target)


def replay_command(args: argparse.Namespace) -> int:
    """Replay trajectories in sandboxed kernels, write one step record per execution, print the fidelity report."""
    import tempfile

    from themisto.replay.fidelity import fidelity_report
    from themisto.replay.replay import ReplayIncomplete, ReplaySettings, read_steps, replay_to_file
    from themisto.ingest.workspace import write_workspace

    trajectories = read_trajectories(args.paths, skip_bad_lines=args.skip_bad_lines)
    settings = ReplaySettings(snapshots=not args.no_snapshots, cell_timeout_s=args.cell_timeout)
    with tempfile.TemporaryDirectory(prefix="themisto-ws-") as tmp:
        workspace = args.workspace
        if workspace is None:
            workspace = write_workspace(Path(tmp) / "ws", seed=args.workspace_seed, size=args.size).root
        elif not Path(workspace).is_dir():
            raise CommandError(f"{workspace}: no such workspace directory (make one with `themisto workspace`)")
        try:
            run = replay_to_file(trajectories, args.output, workspace, settings, resume=not args.no_resume,
                                 runner=_replay_runner(args))
        except ReplayIncomplete as exc:
            raise CommandError(str(exc)) from None
    reports = [r.to_dict() for r in fidelity_report(read_steps(args.output))]
    if args.json:
        print(json.dumps({"steps": run.steps, "seconds": round(run.seconds, 2), "output": str(args.output),
                          "resumed": run.resumed, "trajectories": {r["kernel_id"]: r for r in reports}},
                         ensure_ascii=False, sort_keys=True))
    else:
        for report in reports:
            _print_fidelity(report)
        print(f"wrote {run.steps} steps to {args.output} in {run.seconds:.1f} s")
    return 0


def _add_replay(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("replay", help="replay trajectories in sandboxed kernels with runtime snapshots")
    _add_trajectory_inputs(parser, output_help="steps JSONL to write")
    parser.add_argument("--workspace", type=Path,
                        help="input files (default: look-alike inputs made from --workspace-seed)")
    parser.add_argument("--workspace-seed", type=int, default=0, help="seed of the look-alike inputs")
    parser.add_argument("--size", choices=SIZE_CHOICES, default="small", help="size of the look-alike inputs")
    parser.add_argument("--cell-timeout", type=float, default=60.0,
                        help="seconds each replayed cell may run before the watchdog interrupts it")
    parser.add_argument("--no-snapshots", action="store_true", help="skip the runtime snapshot after each step")
    parser.add_argument("--no-resume", action="store_true", help="start over instead of resuming a stopped run")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the fidelity per trajectory")
    _add_ray_option(parser, "replay")
    parser.set_defaults(run=replay_command)


# ---------------------------------------------------------------------------------------------------------------
# build, check, push (the dataset release)


def build_command(args: argparse.Namespace) -> int:
    """Replay the inputs (default: the shipped sample) and write a release folder: Parquet per config, card."""
    from themisto.release.parquet import BuildInputs, build_release, release_rows
    from themisto.release.tasks import TaskSettings

    paths = _ingest_inputs(args.paths) if args.paths else []
    tables = [p for p in paths if p.suffix.lower() == ".csv"]
    if len(tables) > 1:
        raise CommandError(f"one JuNE table per build, got {len(tables)}: {', '.join(map(str, tables))}")
    inputs = BuildInputs(
        logs=tuple(p for p in paths if p.suffix.lower() == ".log"), table=tables[0] if tables else None,
        notebooks=tuple(p for p in paths if p.suffix.lower() == ".ipynb"), steps=args.steps,
        paper=args.paper, workspace=args.workspace, workspace_seed=args.workspace_seed, steps_out=args.steps_out,
        cell_timeout_s=args.cell_timeout)
    if args.workspace is not None and not args.workspace.is_dir():
        raise CommandError(f"{args.workspace}: no such workspace directory (make one with `themisto workspace`)")
    settings = TaskSettings(seed=args.split_seed, test_fraction=args.test_fraction,
                            output_sample_size=None if args.all_outputs else TaskSettings.output_sample_size)
    steps_default = args.output.with_name(args.output.name + ".steps.jsonl")
    from themisto.replay.replay import ReplayIncomplete

    try:
        rows, source, extra = release_rows(inputs, steps_default, runner=_replay_runner(args))
    except ReplayIncomplete as exc:
        raise CommandError(str(exc)) from None
    report = build_release(rows, args.output, settings, source=source, extra_settings=extra,
                           overwrite=args.overwrite, allow_missing_files=args.allow_missing_files)
    if args.json:
        print(json.dumps({"output": str(args.output), **report.to_dict()}, ensure_ascii=False, sort_keys=True))
    else:
        for config, splits in report.sizes.items():
            print(f"{config}: " + ", ".join(f"{split} {n}" for split, n in splits.items()))
        for note in report.notes:
            print(f"note: {note}")
        print(f"wrote {args.output} (content sha256 {report.content_sha256})")
    return 0


def _add_build(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build", help="write the dataset release (Parquet per config and split + card)")
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help=".log, .csv (JuNE table) or .ipynb, or a directory (default: the shipped data/sample)")
    parser.add_argument("--steps", type=Path, help="an existing replay (steps JSONL): build from it, replay nothing")
    parser.add_argument("--paper", type=Path, help="the paper's published rows (.parquet/.jsonl/.json/.csv)")
    parser.add_argument("--workspace", type=Path, help="replay input files (default: look-alike inputs)")
    parser.add_argument("--workspace-seed", type=int, default=0, help="seed of the look-alike inputs")
    parser.add_argument("--steps-out", type=Path, help="where replay writes steps (default: DIR.steps.jsonl)")
    parser.add_argument("--cell-timeout", type=float, default=60.0,
                        help="seconds each replayed cell may run before the watchdog interrupts it")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the train/test split and the output sample")
    parser.add_argument("--test-fraction", type=float, default=0.5, help="share of steps for `test`")
    parser.add_argument("--all-outputs", action="store_true", help="output_prediction test: all eligible rows")
    parser.add_argument("--allow-missing-files", action="store_true",
                        help="build even when replay failed for a file the workspace lacks")
    parser.add_argument("--overwrite", action="store_true", help="replace DIR when it is not empty")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="DIR", help="release folder to write")
    parser.add_argument("--json", action="store_true", help="print the build report as one JSON object")
    _add_ray_option(parser, "replay")
    parser.set_defaults(run=build_command)


def check_command(args: argparse.Namespace) -> int:
    """Check a release folder: configs, splits, files, schema vs the declared Features; exit 1 on a problem."""
    from themisto.release.check import check_release

    report = check_release(args.folder)
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False, sort_keys=True))
    else:
        for problem in report.problems:
            print(f"problem: {problem}")
        for config, splits in report.sizes.items():
            print(f"{config}: " + ", ".join(f"{split} {n}" for split, n in splits.items()))
        print(f"{args.folder}: " + ("ok" if report.ok else f"{len(report.problems)} problem(s)"))
    return 0 if report.ok else 1


def _add_check(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("check", help="check a release folder before anyone trains on it")
    parser.add_argument("folder", type=Path, metavar="DIR")
    parser.add_argument("--json", action="store_true", help="print {ok, problems, sizes} as one JSON object")
    parser.set_defaults(run=check_command)


def push_command(args: argparse.Namespace) -> int:
    """Upload a checked release folder to a Hub dataset repository (huggingface_hub; needs network and a token)."""
    from dataclasses import asdict

    from themisto.release.push import push_release, upload_plan

    plan = upload_plan(args.folder, args.repo_id, private=args.private, revision=args.revision,
                       commit_message=args.message)
    commit = None if args.dry_run else push_release(plan)
    if args.json:
        print(json.dumps({**asdict(plan), "folder": str(plan.folder), "dry_run": args.dry_run,
                          "commit": None if commit is None else str(commit)}, sort_keys=True))
    else:
        for rel, size in plan.files.items():
            print(f"{size:>12,}  {rel}")
        print(("would upload" if args.dry_run else "uploaded") + f" {len(plan.files)} files to {plan.repo_id}")
    return 0


def _add_push(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("push", help="upload a release folder to the Hugging Face Hub")
    parser.add_argument("folder", type=Path, metavar="DIR")
    parser.add_argument("--repo-id", required=True, help="dataset repository, owner/name")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", help="branch to commit to")
    parser.add_argument("--message", help="commit message")
    parser.add_argument("--dry-run", action="store_true", help="check and list the files, upload nothing")
    parser.add_argument("--json", action="store_true", help="print the upload plan as one JSON object")
    parser.set_defaults(run=push_command)


# ---------------------------------------------------------------------------------------------------------------
# score


def _score_run_folder(args: argparse.Namespace) -> int:
    """`themisto score RUN/`: every context of a run folder, the baselines, intervals; prints the Markdown table."""
    from themisto.scoring.results_table import render_markdown
    from themisto.scoring.run_scores import score_run

    if args.predictions is not None:
        raise CommandError("give either a run folder or --predictions, not both")
    results = score_run(args.run_dir, release=args.release, execute=args.execute, out=args.output,
                        runner=_scoring_runner(args), workspace=args.workspace)
    if args.json:
        print(json.dumps(results, ensure_ascii=False, sort_keys=True))
    else:
        print(render_markdown(results))
        print(f"wrote {args.output or args.run_dir / 'results.json'} and results.md in {results['seconds']:.1f} s")
    return 0


def _ray_held(args: argparse.Namespace):
    """With --ray, Ray connected for the whole command (so that several scorings share one start); else nothing."""
    import contextlib

    target = _ray_target(args)
    if target is None or not args.execute:
        return contextlib.nullcontext()
    from themisto.distributed.cluster import ray_session

    return ray_session(target)


def _scoring_runner(args: argparse.Namespace):
    """The runner --ray asks for (each trajectory's execution as one Ray task), or None: here, one per core."""
    target = _ray_target(args)
    if target is None:
        return None
    if not args.execute:
        raise CommandError("--ray spreads execution over Ray workers; it needs --execute (text scores run here)")
    from themisto.distributed.ray_scoring import scoring_runner

    return scoring_runner(target)


def score_command(args: argparse.Namespace) -> int:
    """Score a predictions JSONL against a release: text scores, and with --execute (and HF_ALLOW_CODE_EVAL=1)
    execution in the exact pre-cell state; results are written per trajectory and a rerun resumes."""
    from themisto.scoring.scorer import ScoreSettings, score_to_file

    if args.run_dir is not None:
        return _score_run_folder(args)
    if args.release is None or args.predictions is None or args.output is None:
        raise CommandError("give a run folder (themisto score RUN/), or --release, --predictions and -o")
    settings = ScoreSettings(task=args.config, k=tuple(args.k), timeout_s=args.prediction_timeout,
                             continuation_cells=args.continuation_cells)
    run = score_to_file(args.release, args.predictions, args.output, settings, execute=args.execute,
                        workspace=args.workspace, resume=not args.no_resume, runner=_scoring_runner(args))
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


def _add_score(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("score", help="score a run folder, or predictions against a release "
                                                 "(text; --execute: run them)")
    parser.add_argument("run_dir", nargs="?", type=Path, metavar="RUN",
                        help="a run folder (themisto generate -o RUN/): writes RUN/results.json and RUN/results.md")
    parser.add_argument("--release", type=Path, metavar="DIR",
                        help="release folder (themisto build); for a run folder, default: the one run.json names")
    parser.add_argument("--config", choices=("next_cell", "output_prediction"), default="next_cell",
                        help="the task the predictions answer (with --predictions)")
    parser.add_argument("--predictions", type=Path, metavar="JSONL",
                        help='one {"id": ..., "prediction": str | [str, ...]} per line')
    parser.add_argument("--execute", action="store_true",
                        help="run next_cell predictions in the pre-cell state (also needs HF_ALLOW_CODE_EVAL=1)")
    parser.add_argument("--k", nargs="+", type=int, default=[1], help="pass@k for each k (default: 1)")
    parser.add_argument("--prediction-timeout", type=float, default=30.0,
                        help="seconds each executed prediction may run (grown for slow reference cells)")
    parser.add_argument("--continuation-cells", type=int, default=3, metavar="K",
                        help="logged cells run after each prediction for continuation_match (default 3; 0: off)")
    parser.add_argument("--workspace", type=Path, help="the release's replay inputs, if it was built with a given one")
    parser.add_argument("--no-resume", action="store_true", help="start over instead of resuming a stopped run")
    parser.add_argument("-o", "--output", type=Path, help="results JSON to write (a run folder: RUN/results.json)")
    parser.add_argument("--json", action="store_true", help="print {output, scores, notes, ...} as one JSON object")
    _add_ray_option(parser, "with --execute, score", unit="one trajectory per task")
    parser.set_defaults(run=score_command)


# ---------------------------------------------------------------------------------------------------------------
# sft-export (fine-tuning data)


def sft_export_command(args: argparse.Namespace) -> int:
    """Write a release split as TRL prompt/completion examples (JSONL + datasets folder) with a manifest."""
    from themisto.training.export import ExportSettings, export_sft

    settings = ExportSettings(split=args.split, tasks=tuple(args.task), contexts=tuple(args.context), mix=args.mix,
                              seed=args.mix_seed, verify=not args.no_verify, max_prompt_tokens=args.max_prompt_tokens)
    report = export_sft(args.release, args.output, settings, overwrite=args.overwrite)
    if args.json:
        print(json.dumps({"output": str(args.output), **report.manifest["counts"], "dropped": report.dropped},
                         ensure_ascii=False, sort_keys=True))
        return 0
    for task, contexts in report.by_task_context.items():
        dropped = {reason: n for reason, n in report.dropped[task].items() if n}
        print(f"{task}: " + ", ".join(f"{context} {n}" for context, n in contexts.items())
              + f"; dropped: {_format_counts(dropped)}")
    for note in report.manifest["notes"]:
        print(f"note: {note}")
    print(f"wrote {report.examples} examples to {args.output}")
    return 0


def _add_sft_export(subparsers: argparse._SubParsersAction) -> None:
    from themisto.generation.prompts import CONTEXT_MODES, TASKS

    parser = subparsers.add_parser("sft-export", help="a release split as fine-tuning examples (TRL format)")
    parser.add_argument("--release", required=True, type=Path, metavar="DIR", help="release folder")
    parser.add_argument("--split", default="train", help="split to export (default: train)")
    parser.add_argument("--task", nargs="+", choices=TASKS, default=list(TASKS), help="tasks (default: both)")
    parser.add_argument("--context", nargs="+", choices=CONTEXT_MODES, default=list(CONTEXT_MODES),
                        help="runtime-context modes (default: all)")
    parser.add_argument("--mix", choices=("all", "one"), default="all",
                        help="all: each row once per context mode; one: each row once, in a seeded context mode")
    parser.add_argument("--mix-seed", type=int, default=0, help="seed of --mix one (which context each row gets)")
    parser.add_argument("--max-prompt-tokens", type=int, help="drop examples over this estimated prompt length")
    parser.add_argument("--no-verify", action="store_true",
                        help="keep targets the replay did not reproduce (the manifest says so)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT when it is not empty")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="OUT", help="folder to write")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    parser.set_defaults(run=sft_export_command)


# ---------------------------------------------------------------------------------------------------------------
# submit, leaderboard (themisto.leaderboard)


def submit_command(args: argparse.Namespace) -> int:
    """Validate a run folder as a submission, then copy it into a local submissions folder and/or open a pull
    request on the Hub's submissions dataset repo (and, with --eval-results, on the model repo)."""
    from themisto.leaderboard.submission import read_submission, release_info, submission_slug, write_submission

    if not (args.to or args.to_dir):
        raise CommandError("say where the submission goes: --to REPO_ID (a Hub pull request) and/or --to-dir DIR")
    if args.eval_results and not (args.to and args.dataset_id):
        raise CommandError("--eval-results needs --to (its source_url is the submission PR) and --dataset-id")
    release = release_info(args.release)
    submission = read_submission(args.run_dir, release)
    for line in submission.ignored:
        print(f"ignored: {line}", file=sys.stderr)
    print(f"valid: {submission.model} ({submission.task}; contexts {', '.join(submission.contexts)}; "
          f"{len(submission.generations)} predictions; sha256 {submission.predictions_sha256[:12]})")
    if args.to:
        _submit_to_hub(args, submission, release)
    if args.to_dir:
        dest = write_submission(submission, args.to_dir / submission_slug(submission))
        print(f"copied to {dest}")
    return 0


def _submit_to_hub(args: argparse.Namespace, submission, release) -> None:
    from themisto.leaderboard.board import rescore
    from themisto.leaderboard.hub import EvalResultsRequest, hub_token, submit_to_hub
    from themisto.release.eval_yaml import declared_task_ids

    hub_token()  # no token: refuse before any scoring or upload
    request = results = task_ids = None
    if args.eval_results:
        task_ids = declared_task_ids(args.release)
        results, _ = rescore(submission, release, execute=args.execute)
        request = EvalResultsRequest(args.eval_results, args.dataset_id, args.dataset_revision)
    done = submit_to_hub(submission, args.to, eval_results=request, results=results, task_ids=task_ids)
    print(f"submission pull request: {done.submission_pr}")
    if done.eval_results_pr:
        print(f"eval results pull request: {done.eval_results_pr}")


def _add_submit(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("submit", help="validate a run folder and submit it (Hub PR or local folder)")
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="run folder (themisto generate)")
    parser.add_argument("--release", required=True, type=Path, metavar="DIR", help="the release it was run on")
    parser.add_argument("--to", metavar="REPO_ID", help="submissions dataset repo: opens a pull request")
    parser.add_argument("--to-dir", type=Path, metavar="DIR", help="a local submissions folder to copy it into")
    parser.add_argument("--eval-results", metavar="MODEL_REPO",
                        help="also open a PR adding .eval_results/themisto.yaml to this model repo")
    parser.add_argument("--dataset-id", metavar="REPO_ID", help="the benchmark's Hub dataset id (eval results)")
    parser.add_argument("--dataset-revision", help="its git revision (default: asked from the Hub)")
    parser.add_argument("--execute", action="store_true",
                        help="eval results: execute next_cell predictions (also needs HF_ALLOW_CODE_EVAL=1)")
    parser.set_defaults(run=submit_command)


def leaderboard_command(args: argparse.Namespace) -> int:
    """Re-score every submission against the release and write the board: Markdown, CSV, JSON, PNG, Space."""
    from themisto.leaderboard.board import build_board
    from themisto.leaderboard.board_files import SPACE_DIR, write_board
    from themisto.leaderboard.submission import release_info
    from themisto.scoring.gate import permit

    if args.execute:
        permit(execute=True)  # refuse before reading any submission
    release = release_info(args.release)
    with _ray_held(args):
        board = build_board(args.submissions, release, execute=args.execute, cache_dir=args.output / "cache",
                            progress=lambda message: print(message, file=sys.stderr, flush=True),
                            runner=_scoring_runner(args))
    files = write_board(board, args.output)
    for note in board.notes:
        print(f"note: {note}")
    for refusal in board.refused:
        print(f"refused: {refusal.folder}: {refusal.reason}")
    print(f"{len(board.entries)} submission(s) on the board, {len(board.refused)} refused; wrote "
          + ", ".join(str(path) for path in files.values()))
    if args.push_space:
        from themisto.leaderboard.hub import push_space

        print(f"pushed the Space: {push_space(args.output / SPACE_DIR, args.push_space)}")
    return 0


def _add_leaderboard(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("leaderboard", help="re-score submissions and write the board and its Space")
    parser.add_argument("submissions", nargs="+", type=Path, metavar="SUBMISSION",
                        help="a run folder, or a folder of submissions")
    parser.add_argument("--release", required=True, type=Path, metavar="DIR", help="release folder")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="BOARD", help="folder to write")
    parser.add_argument("--execute", action="store_true",
                        help="execute next_cell predictions (also needs HF_ALLOW_CODE_EVAL=1)")
    parser.add_argument("--push-space", metavar="REPO_ID", help="upload BOARD/space/ to this static Space")
    _add_ray_option(parser, "with --execute, re-score")
    parser.set_defaults(run=leaderboard_command)


# ---------------------------------------------------------------------------------------------------------------
# generate


def _backend_options(args: argparse.Namespace) -> dict:
    """The options each backend takes from the command line (recorded in run.json; a resume must match them)."""
    if args.backend == "transformers":
        return {"device": args.device}
    if args.backend == "openai":
        return {"base_url": args.base_url, "concurrency": args.concurrency, "max_retries": args.max_retries,
                "timeout_s": args.request_timeout}
    if args.backend == "vllm":
        return {"tensor_parallel_size": args.tensor_parallel_size, "seed": args.seed}
    return {}


def _generation_backend(args: argparse.Namespace, settings):
    """With --ray, a data-parallel backend (one engine per Ray actor) as a context manager; else None (the run
    makes its own backend)."""
    import contextlib

    target = _ray_target(args)
    if target is None:
        return contextlib.nullcontext(None)
    from themisto.distributed.ray_generation import ray_backend

    gpus = float(args.tensor_parallel_size) if args.backend == "vllm" else None
    return ray_backend(settings, target, actors=args.ray_actors, gpus_per_actor=gpus)


def generate_command(args: argparse.Namespace) -> int:
    """Generate predictions for every test example × context mode × sample into a resumable run folder."""
    from themisto.generation.backends import Sampling
    from themisto.generation.runs import RunSettings, generate_run

    sampling = Sampling(n=args.n, temperature=args.temperature, top_p=args.top_p,
                        max_new_tokens=args.max_new_tokens, seed=args.seed)
    settings = RunSettings(task=args.task, contexts=tuple(args.context), backend=args.backend, model=args.model,
                           sampling=sampling, limit=args.limit, max_prompt_tokens=args.max_prompt_tokens,
                           batch_size=args.batch_size, backend_options=_backend_options(args))
    try:
        with _generation_backend(args, settings) as backend:
            report = generate_run(args.release, args.output, settings, backend=backend, progress=not args.json)
    except KeyboardInterrupt:
        print(f"themisto generate: interrupted; rerun the same command to resume into {args.output}",
              file=sys.stderr)
        return 130
    summary = {"output": str(report.folder), "written": report.written, "resumed": report.resumed,
               "torn_line_dropped": report.torn_line_dropped, "counts": report.counts,
               "seconds": round(report.seconds, 2), "generations_per_s": report.run.get("generations_per_s")}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        counts = ", ".join(f"{k} {v}" for k, v in report.counts.items())
        print(f"wrote {report.written} generations ({report.resumed} from before) to {report.folder} in "
              f"{report.seconds:.1f} s: {counts}")
    return 0


def _add_generate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="run a model (or a baseline) on a release's task, resumable")
    parser.add_argument("--release", required=True, type=Path, metavar="DIR", help="release folder (themisto build)")
    parser.add_argument("--task", required=True, choices=("next_cell", "output_prediction"))
    parser.add_argument("--context", nargs="+", default=["none", "variables", "full"], metavar="MODE",
                        help="runtime-context modes: none, variables, full (default: all three)")
    parser.add_argument("--backend", required=True, help="transformers, openai, vllm or baseline")
    parser.add_argument("--model", required=True, help="model folder, Hub id or .gguf file; endpoint model name; "
                        "or a baseline: previous-cell, common-cell, previous-output, last-repr")
    parser.add_argument("--n", type=int, default=1, help="samples per example and context (default 1)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int,
                        help="prompt budget (default: the model's context length less --max-new-tokens)")
    parser.add_argument("--limit", type=int, help="only K test examples, evenly spread over the release")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per batch and per write (default 8)")
    parser.add_argument("--device", default="auto", help="transformers: cpu, cuda, auto (default)")
    parser.add_argument("--base-url", help="openai: the endpoint (default: OPENAI_BASE_URL); key from OPENAI_API_KEY")
    parser.add_argument("--concurrency", type=int, default=8, help="openai: requests in flight (default 8)")
    parser.add_argument("--max-retries", type=int, default=4, help="openai: retries on 429/5xx/timeouts")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="openai: seconds per request")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs per model")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="RUN", help="run folder")
    parser.add_argument("--json", action="store_true", help="no progress bar; print a summary JSON object")
    parser.add_argument("--ray-actors", type=int, help="with --ray: engines, one per actor (default: one per GPU "
                        "for vllm, else one per CPU); each batch of --batch-size prompts is split among them")
    _add_ray_option(parser, "generate", unit="one engine per actor")
    parser.set_defaults(run=generate_command)


# ---------------------------------------------------------------------------------------------------------------

SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_ingest, _add_workspace, _add_replay, _add_build, _add_check, _add_push, _add_score, _add_sft_export,
    _add_submit, _add_leaderboard, _add_generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="themisto", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; errors in the input print `themisto <command>: error: …` on stderr and return 2."""
    args = build_parser().parse_args(argv)
    from themisto.errors import InputError
    from themisto.scoring.gate import ExecutionRefused

    try:
        return args.run(args)
    # Input errors name their file and line or example id; a path the user gave that is not there names itself.
    # Anything else is a bug and keeps its traceback.
    except (CommandError, InputError, ExecutionRefused, FileNotFoundError, IsADirectoryError,
            NotADirectoryError) as exc:
        print(f"themisto {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
