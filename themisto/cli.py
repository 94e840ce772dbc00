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
    """A failure the user can fix; `main` prints it on stderr and exits with 2."""


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


def ingest_command(args: argparse.Namespace) -> int:
    """Read JuNE logs, JuNE tables and notebooks into trajectories, print their figures, write JSONL."""
    from themisto.june import read_june_logs, read_june_table
    from themisto.notebook import read_notebook
    from themisto.trajectory import write_jsonl

    inputs = _ingest_inputs(args.paths)
    trajectories = []
    logs = [p for p in inputs if p.suffix.lower() == ".log"]
    if logs:
        trajectories += [(", ".join(map(str, logs)), t) for t in read_june_logs(logs, skip_bad_lines=args.skip_bad_lines)]
    for path in inputs:
        if path.suffix.lower() == ".csv":
            trajectories += [(str(path), t) for t in read_june_table(path, skip_bad_lines=args.skip_bad_lines)]
        elif path.suffix.lower() == ".ipynb":
            trajectories.append((str(path), read_notebook(path)))
    seen: dict[str, str] = {}
    for origin, traj in trajectories:
        if traj.id in seen:
            raise CommandError(f"trajectory {traj.id} is read twice, from {seen[traj.id]} and from {origin}")
        seen[traj.id] = origin
    # Everything is read and checked before the output file is written, so a bad input leaves no file behind.
    write_jsonl((t for _, t in trajectories), args.output)
    summaries = {t.id: t.summary() for _, t in trajectories}
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


def _add_ingest(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ingest", help="read JuNE logs/tables/notebooks into trajectories (JSONL)")
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".log, .csv (JuNE table) or .ipynb, or a directory")
    parser.add_argument("-o", "--output", required=True, type=Path, help="trajectories JSONL to write")
    parser.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines")
    parser.add_argument("--json", action="store_true", help="print one JSON object {trajectory_id: summary}")
    parser.set_defaults(run=ingest_command)


# ---------------------------------------------------------------------------------------------------------------
# workspace


def workspace_command(args: argparse.Namespace) -> int:
    """Write a replay workspace (look-alike task inputs generated from a seed) into a directory."""
    from themisto.workspace import write_workspace

    tasks = ["task1", "task2"] if args.task == "all" else [args.task]
    extra = {"overwrite": True} if args.overwrite else {}
    result = write_workspace(args.output, tasks, seed=args.seed, size=args.size, **extra)
    if args.json:
        print(json.dumps({"root": str(result.root), "files": result.files}, ensure_ascii=False, sort_keys=True))
    else:
        for rel, digest in sorted(result.files.items()):
            print(f"{digest}  {rel}")
        print(f"wrote {len(result.files)} files to {result.root}")
    return 0


def _add_workspace(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("workspace", help="write the task input files replay needs")
    parser.add_argument("--task", required=True, choices=TASK_CHOICES)
    parser.add_argument("-o", "--output", required=True, type=Path, help="directory to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=SIZE_CHOICES, default="small")
    parser.add_argument("--overwrite", action="store_true", help="replace DIR when it is not empty")
    parser.add_argument("--json", action="store_true", help="print one JSON object {root, files}")
    parser.set_defaults(run=workspace_command)


# ---------------------------------------------------------------------------------------------------------------

SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_add_ingest, _add_workspace)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="themisto", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; errors in the input print `themisto <command>: error: …` on stderr and return 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    # Reader errors are ValueError subclasses whose message starts with file:line; OSError names its file.
    except (CommandError, ValueError, OSError) as exc:
        print(f"themisto {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
