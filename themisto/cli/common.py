"""What several subcommands share: the user-error type, the trajectory inputs, the --ray option."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

INGEST_SUFFIXES: tuple[str, ...] = (".log", ".csv", ".ipynb")
TASK_CHOICES: tuple[str, ...] = ("task1", "task2", "all")
SIZE_CHOICES: tuple[str, ...] = ("small", "medium", "full")


class CommandError(Exception):
    """A command-line mistake the user can fix; `main` prints it on stderr and exits with 2."""


def ingest_inputs(paths: Sequence[str]) -> list[Path]:
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


def format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in counts.items()) or "none"


def read_trajectories(paths: Sequence[str], *, skip_bad_lines: bool = False) -> list:
    """Read every input (.log, JuNE table .csv, .ipynb, or directories of them) into trajectories, ids unique."""
    from themisto.ingest.june import read_june_logs
    from themisto.ingest.june_table import read_june_table
    from themisto.ingest.notebook import read_notebook

    inputs = ingest_inputs(paths)
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


def add_trajectory_inputs(parser: argparse.ArgumentParser, *, output_help: str) -> None:
    """The arguments of every command that reads trajectories (see `read_trajectories`) and writes one file."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".log, .csv (JuNE table) or .ipynb, or a directory")
    parser.add_argument("-o", "--output", required=True, type=Path, help=output_help)
    parser.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines")


def add_ray_option(parser: argparse.ArgumentParser, what: str, unit: str = "one trajectory per task") -> None:
    parser.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help=f"{what} on Ray, {unit}: alone, a local Ray on this machine's cores; "
                             "else a cluster's address (host:port, ray://host:port, auto)")


def ray_target(args: argparse.Namespace):
    """The Ray that --ray names, or None; without --ray nothing imports Ray."""
    if args.ray is None:
        return None
    from themisto.distributed.cluster import RayTarget

    return RayTarget(address=None if args.ray == "local" else args.ray)


def ray_held(args: argparse.Namespace):
    """With --ray, Ray connected for the whole command (so that several scorings share one start); else nothing."""
    import contextlib

    target = ray_target(args)
    if target is None or not args.execute:
        return contextlib.nullcontext()
    from themisto.distributed.cluster import ray_session

    return ray_session(target)


def scoring_runner(args: argparse.Namespace):
    """The runner --ray asks for (each trajectory's execution as one Ray task), or None: here, one per core."""
    target = ray_target(args)
    if target is None:
        return None
    if not args.execute:
        raise CommandError("--ray spreads execution over Ray workers; it needs --execute (text scores run here)")
    from themisto.distributed.ray_scoring import scoring_runner

    return scoring_runner(target)
