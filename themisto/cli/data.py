"""Subcommands that make the data: ingest, workspace, replay, build, check, push (collect: `themisto.cli.sharing`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from themisto.cli.common import (
    SIZE_CHOICES,
    TASK_CHOICES,
    CommandError,
    add_corpus_options,
    add_participants_option,
    add_ray_option,
    add_trajectory_inputs,
    corpus_settings,
    default_of,
    format_counts,
    ray_target,
    read_inputs,
)
from themisto.cli.sharing import add_sharing_options, build_outputs


def _print_summary(traj_id: str, summary: dict) -> None:
    logged = summary.get("logged_execute_events")
    logged_note = f" ({logged} logged execute events)" if logged is not None else ""
    print(
        f"{traj_id}  {summary['notebook']} [{summary['task'] or 'no task'}, {summary['source']}]: "
        f"{summary['executions']} executions{logged_note}, {summary['errors']} errors, "
        f"{summary['restarts']} restarts, {summary['interrupts']} interrupts"
    )
    print(f"  statuses: {format_counts(summary['statuses'])}")
    print(f"  errors by ename: {format_counts(summary['errors_by_ename'])}")
    if summary.get("executions_without_code"):
        print(f"  executions whose code was not logged: {summary['executions_without_code']}")
    print(f"  not executions: {format_counts(summary['ignored'])}")
    states = summary["code_states"]
    if states["repaired"] or states["damaged"]:
        print(f"  code: {format_counts(states)} (damaged code is never a target)")
    if len(summary["kernels"]) > 1:
        print(f"  kernels: {len(summary['kernels'])}, joined with a restart where each took over")


def _print_file(name: str, report: dict) -> None:
    damaged = report["damaged"]
    lines = ", ".join(str(d["line"]) for d in damaged[:40]) + (", …" if len(damaged) > 40 else "")
    print(f"{name} [{report['writer']}]: {report['lines']} lines, {report['events']} events, "
          f"{report['executions']} executions; {len(damaged)} damaged lines"
          + (f" ({lines})" if damaged else "")
          + f", code repaired {report['repaired']}, unrepaired {report['unrepaired']}; "
          f"{len(report['no_finish'])} execute lines without a finished_execute"
          + (f", {len(report['uncompilable'])} logged ok whose code does not compile ("
             + ", ".join(map(str, report["uncompilable"])) + ")" if report["uncompilable"] else ""))


def ingest_command(args: argparse.Namespace) -> int:
    """Read JuNE logs, JuNE tables and notebooks into trajectories, print their figures, write JSONL (with -o)."""
    from themisto.ingest.trajectory import write_jsonl

    ingested = read_inputs(args)
    trajectories = ingested.trajectories
    # Everything is read and checked before the output file is written, so a bad input leaves no file behind.
    if args.output is not None:
        write_jsonl(trajectories, args.output)
    for note in ingested.notes:
        print(f"warning: {note}", file=sys.stderr)
    summaries = {t.id: t.summary() for t in trajectories}
    for traj_id, summary in summaries.items():
        unknown = {k: v for k, v in summary["ignored"].items() if k.startswith("unknown:")}
        if unknown:
            print(f"warning: {traj_id}: events of unknown kinds, not executions: {format_counts(unknown)}",
                  file=sys.stderr)
        if summary["ignored"].get("bad_line"):
            print(f"warning: {traj_id}: {summary['ignored']['bad_line']} bad line(s) skipped", file=sys.stderr)
    if args.json:
        print(json.dumps({"files": ingested.files, "trajectories": summaries, "notes": ingested.notes,
                          "corpora": ingested.corpora}, ensure_ascii=False, sort_keys=True))
    else:
        for name, report in ingested.files.items():
            _print_file(name, report)
        for corpus in ingested.corpora:
            print(f"corpus: {corpus['repositories']} repositories ({corpus['removed']} removed: opt-out list), "
                  f"{corpus['sessions_read']:,} sessions read, "
                  f"{corpus['trajectories']} kept ({corpus['developers']} developers); left out: "
                  f"{format_counts(corpus['left_out'])}; cut before replay: {format_counts(corpus['cut'])}")
            for refusal in corpus["refusals"]:
                print(f"  refused: {refusal}")
        for traj_id, summary in summaries.items():
            _print_summary(traj_id, summary)
        print(f"wrote {len(trajectories)} trajectories to {args.output}" if args.output is not None
              else f"read {len(trajectories)} trajectories (no -o: nothing written)")
    return 0


def add_ingest(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ingest", help="read JuNE logs/tables/notebooks into trajectories (JSONL)")
    add_trajectory_inputs(parser, output_help="trajectories JSONL to write (without it: the report only)",
                          output_required=False)
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: {files: {name: figures}, trajectories: {id: summary}, notes}")
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


def add_workspace(subparsers: argparse._SubParsersAction) -> None:
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


def _print_fidelity(report: dict, mismatches: bool = True) -> None:
    def share(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f} %"

    print(f"{report['kernel_id']}  {report['notebook']}: {report['executions_replayed']} executions replayed; "
          f"status match {share(report['status_match'])} of {report['comparable']}, "
          f"ename match {share(report['ename_match'])} of {report['logged_errors']} logged errors, "
          f"output types match {share(report['output_types_match'])}")
    final = report.get("final_notebook")
    if final:
        print(f"  against {final['notebook']}: {format_counts(final['compared'])}; "
              f"not compared: {format_counts(final['not_compared'])}")
    for m in report["mismatches"] if mismatches else ():
        print(f"  step {m['step']:>4} {m['kind']:<12} log: {m['logged']:<28} replay: {m['replayed']:<28} {m['reason']}")
    timeouts = report.get("timeouts") or []
    if timeouts:
        print(f"  {len(timeouts)} step(s) stopped at their limit:")
    for t in timeouts:
        developer = "not seen finishing" if t["developer_s"] is None else f"{t['developer_s']:.1f} s"
        limit = "?" if t["limit_s"] is None else f"{t['limit_s']:g} s"
        print(f"  step {t['step']:>4} replay {t['replay_s']:.1f} s (limit {limit}), developer {developer}, "
              f"log: {t['logged']}: {t['code']}")


def _replay_runner(args: argparse.Namespace):
    """The replay runner --ray asks for (an unreachable address is refused here, before any work), else this
    machine's cores (--workers, default one per core)."""
    target = ray_target(args)
    if target is not None:
        if args.workers is not None:
            raise CommandError("--workers and --ray both choose where trajectories replay: give one of them")
        from themisto.distributed.ray_runner import replay_runner

        return replay_runner(target)
    if args.workers is not None and args.workers < 1:
        raise CommandError(f"--workers must be at least 1, got {args.workers}")
    from themisto.replay.workers import workers_runner

    return workers_runner(args.workers)


def _add_workers_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, metavar="N",
                        help="trajectories replayed at once, one sandboxed kernel each (default: one per core; "
                             "1: one after the other); the steps file is the same either way")


def _add_cell_timeout_option(parser: argparse.ArgumentParser) -> None:
    from themisto.replay.replay import ReplaySettings

    floor, ceiling, factor = (default_of(ReplaySettings, name) for name in
                              ("cell_timeout_s", "cell_timeout_ceiling_s", "logged_time_factor"))
    parser.add_argument("--cell-timeout", type=float, default=None, metavar="S",
                        help="a fixed limit: every replayed cell may run S seconds, whatever its developer's run took "
                             f"(default: the logged-time rule of themisto.replay.cell_limits: max({floor:g} s, "
                             f"min({ceiling:g} s, {factor:g} x the logged seconds)), {floor:g} s where the log did not "
                             "see the cell finish; seconds of CPU of the kernel and all it started, whatever the "
                             "host's load)")


def replay_command(args: argparse.Namespace) -> int:
    """Replay trajectories in sandboxed kernels, write one step record per execution, print the fidelity report."""
    import tempfile
    from dataclasses import replace

    from themisto.ingest.workspace import TASKS, write_workspace
    from themisto.replay.fidelity import fidelity_report
    from themisto.replay.replay import ReplaySettings
    from themisto.replay.steps_file import ReplayIncomplete, read_steps, replay_to_file
    from themisto.replay.workspace_recipe import look_alike

    runner = _replay_runner(args)
    ingested = read_inputs(args)
    trajectories = ingested.trajectories
    settings = ReplaySettings(snapshots=not args.no_snapshots, values=not args.no_values)
    if args.cell_timeout is not None:
        settings = replace(settings, cell_timeout_s=args.cell_timeout, logged_time_factor=None)
    with tempfile.TemporaryDirectory(prefix="themisto-ws-") as tmp:
        workspace, recipe = args.workspace, None  # a given folder is recorded by its name and hash
        if any(t.workspace for t in trajectories):  # sessions replayed in their own repositories' files
            from themisto.release.sources import replay_workspace

            try:
                workspace, recipe, trajectories = replay_workspace(
                    trajectories, ingested.workspace_folders, Path(tmp), given=args.workspace,
                    seed=args.workspace_seed, size=args.size, out=args.output)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        elif workspace is None:
            workspace = write_workspace(Path(tmp) / "ws", TASKS, seed=args.workspace_seed, size=args.size).root
            recipe = look_alike(TASKS, args.workspace_seed, args.size)
        elif not Path(workspace).is_dir():
            raise CommandError(f"{workspace}: no such workspace directory (make one with `themisto workspace`)")
        try:
            run = replay_to_file(trajectories, args.output, workspace, settings, resume=not args.no_resume,
                                 runner=runner, recipe=recipe)
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


def add_replay(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("replay", help="replay trajectories in sandboxed kernels with runtime snapshots")
    add_trajectory_inputs(parser, output_help="steps JSONL to write")
    parser.add_argument("--workspace", type=Path,
                        help="input files (default: look-alike inputs made from --workspace-seed)")
    parser.add_argument("--workspace-seed", type=int, default=0, help="seed of the look-alike inputs")
    parser.add_argument("--size", choices=SIZE_CHOICES, default="small", help="size of the look-alike inputs")
    _add_cell_timeout_option(parser)
    parser.add_argument("--no-snapshots", action="store_true", help="skip the runtime snapshot after each step")
    parser.add_argument("--no-values", action="store_true",
                        help="snapshots without the variables' values (default: stored in OUTPUT.values/)")
    parser.add_argument("--no-resume", action="store_true", help="start over instead of resuming a stopped run")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the fidelity per trajectory")
    _add_workers_option(parser)
    add_ray_option(parser, "replay")
    parser.set_defaults(run=replay_command)


# ---------------------------------------------------------------------------------------------------------------
# build, check, push (the dataset release)


def build_command(args: argparse.Namespace) -> int:
    """Replay the inputs (default: the shipped sample) and write a release folder: Parquet per config, card."""
    from themisto.generation.prompts import text_track_renderer
    from themisto.release.parquet import BuildInputs, build_release, release_rows, replay_values
    from themisto.release.values import ValueCaps
    from themisto.release.tasks import TaskSettings

    inputs = BuildInputs(
        paths=tuple(Path(p) for p in args.paths), participants=args.participants, steps=args.steps,
        paper=args.paper, workspace=args.workspace, workspace_seed=args.workspace_seed, steps_out=args.steps_out,
        cell_timeout_s=args.cell_timeout, values=not args.no_values, corpus=corpus_settings(args))
    if args.workspace is not None and not args.workspace.is_dir():
        raise CommandError(f"{args.workspace}: no such workspace directory (make one with `themisto workspace`)")
    settings = TaskSettings(seed=args.split_seed, test_fraction=args.test_fraction,
                            output_sample_size=None if args.all_outputs else TaskSettings.output_sample_size)
    steps_default = args.output.with_name(args.output.name + ".steps.jsonl")
    from themisto.replay.steps_file import ReplayIncomplete

    trajectories: list = []
    try:
        rows, source, extra, fidelity = release_rows(inputs, steps_default, runner=_replay_runner(args),
                                                     trajectories_out=trajectories)
    except ReplayIncomplete as exc:
        raise CommandError(str(exc)) from None
    from themisto.ingest.ipython_corpus import is_corpus
    from themisto.release.workspaces import write_sources_note

    def build(rows: list[dict], folder: Path, source: dict):
        report = build_release(rows, folder, settings, source=source, extra_settings=extra, overwrite=args.overwrite,
                               allow_missing_files=args.allow_missing_files, fidelity=fidelity,
                               values=replay_values(inputs, steps_default),
                               value_caps=ValueCaps(value_bytes=int(args.max_value_mb * 2**20),
                                                    release_bytes=int(args.max_values_mb * 2**20)),
                               prompts=text_track_renderer())
        # where this host read the sources, beside each release (never in it): execution finds its files there
        write_sources_note(folder, [p for p in inputs.paths if is_corpus(p)], inputs.workspace)
        return report

    two, sharing_lines = build_outputs(args, rows, trajectories, source, build)
    report = two.full
    if args.json:
        print(json.dumps({"output": str(args.output), **report.to_dict(), "content_release": str(args.content_release)
                          if two.content else None, "pointers": two.pointers}, ensure_ascii=False, sort_keys=True))
    else:
        for config, splits in report.sizes.items():
            print(f"{config}: " + ", ".join(f"{split} {n}" for split, n in splits.items()))
        for fidelity in report.fidelity.values():
            _print_fidelity(fidelity, mismatches=False)
        for note in report.notes:
            print(f"note: {note}")
        print(f"wrote {args.output} (content sha256 {report.content_sha256})")
        for line in sharing_lines:
            print(line)
    return 1 if two.content_error else 0


def add_build(subparsers: argparse._SubParsersAction) -> None:
    from themisto.release.parquet import BuildInputs
    from themisto.release.tasks import TaskSettings
    from themisto.release.values import ValueCaps

    parser = subparsers.add_parser("build", help="write the dataset release (Parquet per config and split + card)")
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help=".log, .csv (JuNE table) or .ipynb, or a directory, read recursively, or a corpus of "
                             "IPython histories (default: the shipped data/sample)")
    add_participants_option(parser)
    add_corpus_options(parser)
    parser.add_argument("--steps", type=Path, help="an existing replay (steps JSONL): build from it, replay nothing")
    parser.add_argument("--paper", type=Path, help="the paper's published rows (.parquet/.jsonl/.json/.csv)")
    parser.add_argument("--workspace", type=Path, help="replay input files (default: look-alike inputs)")
    parser.add_argument("--workspace-seed", type=int, default=default_of(BuildInputs, "workspace_seed"),
                        help="seed of the look-alike inputs")
    parser.add_argument("--steps-out", type=Path, help="where replay writes steps (default: DIR.steps.jsonl)")
    _add_cell_timeout_option(parser)
    parser.add_argument("--split-seed", type=int, default=default_of(TaskSettings, "seed"),
                        help="seed of the train/test split and the output sample")
    parser.add_argument("--test-fraction", type=float, default=default_of(TaskSettings, "test_fraction"),
                        help="share of steps for `test` (default %(default)g)")
    parser.add_argument("--all-outputs", action="store_true", help="output_prediction test: all eligible rows")
    parser.add_argument("--no-values", action="store_true",
                        help="no `values` config (a replay stores no values; --steps: its values are left out)")
    parser.add_argument("--max-value-mb", type=float, default=default_of(ValueCaps, "value_bytes") / 2**20,
                        metavar="MB", help="cap on one stored value in the release (default %(default)g)")
    parser.add_argument("--max-values-mb", type=float, default=default_of(ValueCaps, "release_bytes") / 2**20,
                        metavar="MB",
                        help="cap on all of the release's values (default %(default)g)")
    parser.add_argument("--allow-missing-files", action="store_true",
                        help="build even when replay failed for a file the workspace lacks")
    parser.add_argument("--overwrite", action="store_true", help="replace DIR when it is not empty")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="DIR", help="release folder to write")
    parser.add_argument("--json", action="store_true", help="print the build report as one JSON object")
    add_sharing_options(parser)
    _add_workers_option(parser)
    add_ray_option(parser, "replay")
    parser.set_defaults(run=build_command)


def check_command(args: argparse.Namespace) -> int:
    """Check a release folder: configs, splits, files, schema vs the declared Features; exit 1 on a problem."""
    from themisto.release.check import check_release

    report = check_release(args.folder)
    inspect_checked = _inspect_schema(report)
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False, sort_keys=True))
    else:
        for problem in report.problems:
            print(f"problem: {problem}")
        for config, splits in report.sizes.items():
            print(f"{config}: " + ", ".join(f"{split} {n}" for split, n in splits.items()))
        print(f"eval.yaml: {inspect_checked}")
        print(f"{args.folder}: " + ("ok" if report.ok else f"{len(report.problems)} problem(s)"))
    return 0 if report.ok else 1


def _inspect_schema(report) -> str:
    """Add what Inspect's Hub loader would refuse in the release's eval.yaml to `report` (where inspect_ai is
    installed); says which rules were applied."""
    import importlib.util

    if importlib.util.find_spec("inspect_ai") is None:
        return "the Hub's schema only (inspect_ai is not installed: Inspect's HFTask not applied)"
    from themisto.harness.hub_schema import hub_schema_problems, inspect_version

    report.problems += hub_schema_problems(report.folder)
    return f"the Hub's schema and Inspect's HFTask (inspect_ai {inspect_version()})"


def add_check(subparsers: argparse._SubParsersAction) -> None:
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


def add_push(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("push", help="upload a release folder to the Hugging Face Hub")
    parser.add_argument("folder", type=Path, metavar="DIR")
    parser.add_argument("--repo-id", required=True, help="dataset repository, owner/name")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", help="branch to commit to")
    parser.add_argument("--message", help="commit message")
    parser.add_argument("--dry-run", action="store_true", help="check and list the files, upload nothing")
    parser.add_argument("--json", action="store_true", help="print the upload plan as one JSON object")
    parser.set_defaults(run=push_command)
