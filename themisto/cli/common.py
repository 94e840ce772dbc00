"""What several subcommands share: the user-error type, the settings' defaults, the trajectory inputs, --ray."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path
from typing import Any

TASK_CHOICES: tuple[str, ...] = ("task1", "task2", "all")
SIZE_CHOICES: tuple[str, ...] = ("small", "medium", "full")


class CommandError(Exception):
    """A command-line mistake the user can fix; `main` prints it on stderr and exits with 2."""


def default_of(settings: Any, name: str) -> Any:
    """The default of the field `name` of the settings dataclass `settings` (or of the keyword `name` of a backend
    class or function): an option that sets it takes its default from there, so the two cannot disagree
    (tests/test_cli_defaults.py checks every such option)."""
    if not dataclasses.is_dataclass(settings):
        parameter = inspect.signature(settings).parameters.get(name)
        if parameter is None or parameter.default is inspect.Parameter.empty:
            raise AttributeError(f"{settings.__name__} has no keyword {name!r} with a default")
        return parameter.default
    for field in dataclasses.fields(settings):
        if field.name == name:
            if field.default is not dataclasses.MISSING:
                return field.default
            if field.default_factory is not dataclasses.MISSING:
                return field.default_factory()
            raise AttributeError(f"{settings.__name__}.{name} has no default")
    raise AttributeError(f"{settings.__name__} has no field {name!r}")


def format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in counts.items()) or "none"


def read_inputs(args: argparse.Namespace):
    """Every input the command names (`themisto.ingest.inputs.read_inputs`), with its --participants mapping."""
    from themisto.ingest.inputs import read_inputs as read, read_participants

    mapping = read_participants(args.participants) if getattr(args, "participants", None) else None
    corpus = corpus_settings(args) if hasattr(args, "min_inputs") else None
    return read(args.paths, skip_bad_lines=getattr(args, "skip_bad_lines", False), participants=mapping,
                corpus=corpus)


def add_trajectory_inputs(parser: argparse.ArgumentParser, *, output_help: str, output_required: bool = True) -> None:
    """The arguments of every command that reads trajectories (see `read_inputs`) and writes one file."""
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help=".log, .csv (JuNE table) or .ipynb, or a directory (read recursively), or a corpus of "
                             "IPython histories")
    parser.add_argument("-o", "--output", required=output_required, type=Path, help=output_help)
    add_participants_option(parser)
    parser.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines")
    add_corpus_options(parser)


def add_corpus_options(parser: argparse.ArgumentParser) -> None:
    """Which sessions a corpus of IPython histories gives (`themisto.ingest.ipython_corpus.CorpusSettings`)."""
    from themisto.ingest.ipython_corpus import CorpusSettings
    from themisto.settings import KERNEL_ENVIRONMENTS

    group = parser.add_argument_group("IPython history corpora (a folder with repos/*/repo.json)")
    group.add_argument("--min-inputs", type=int, default=default_of(CorpusSettings, "min_inputs"), metavar="N",
                       help="sessions of fewer inputs are left out (default %(default)s)")
    group.add_argument("--max-steps", type=int, default=default_of(CorpusSettings, "max_steps"), metavar="N",
                       help="a session is cut after N inputs (default %(default)s)")
    group.add_argument("--sessions-per-developer", type=int, metavar="N",
                       default=default_of(CorpusSettings, "sessions_per_developer"),
                       help="at most N sessions of one repository owner (default %(default)s)")
    group.add_argument("--corpus-limit", type=int, metavar="N",
                       help="at most N sessions in all, every developer's first before anyone's second")
    group.add_argument("--kernel-environment", default=default_of(CorpusSettings, "environment"), metavar="NAME",
                       choices=sorted(KERNEL_ENVIRONMENTS),
                       help="the kernel environment the sessions are checked against and replay in (%(choices)s; "
                            "default %(default)s; wide: made by `scripts/install.sh --wide`)")
    group.add_argument("--licences", metavar="L1,L2",
                       help="keep only repositories under these licences (e.g. MIT,Apache-2.0; `none`: no licence "
                            "file); default: every one")
    group.add_argument("--removals", type=Path, metavar="FILE",
                       help="the opt-out list (`YYYY-MM-DD owner/name` or `YYYY-MM-DD owner` a line): those "
                            "repositories' sessions are left out, counted in the report")


def corpus_settings(args: argparse.Namespace):
    """The `CorpusSettings` of `add_corpus_options`' arguments; CommandError for values out of range."""
    from themisto.ingest.ipython_corpus import CorpusSettings

    for name in ("min_inputs", "max_steps", "sessions_per_developer", "corpus_limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    from themisto.ingest.removals import read_removals

    licences = None if args.licences is None else tuple(x.strip() for x in args.licences.split(",") if x.strip())
    return CorpusSettings(min_inputs=args.min_inputs, max_steps=args.max_steps,
                          sessions_per_developer=args.sessions_per_developer, limit=args.corpus_limit,
                          licences=licences, environment=args.kernel_environment,
                          removals=read_removals(args.removals))


def add_participants_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--participants", type=Path, metavar="MAP.json",
                        help="whose kernels the logs are: a JSON object {kernel_id: participant} (logs under "
                             "participants/<name>/ are <name>'s without it)")


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


def add_source_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--workspace and --sources: where a release's input files are, for `what` (rebuilding its states)."""
    parser.add_argument("--workspace", type=Path, metavar="DIR",
                        help=f"{what}: the input files the release was replayed over, if its build was given them "
                             "(default: made again from the build's record)")
    parser.add_argument("--sources", type=Path, nargs="+", metavar="DIR",
                        help=f"{what}: folders holding the sources its sessions replayed in (corpus folders of "
                             "IPython histories) where they are no longer where its build read them; a trajectory "
                             "whose files are in none, or differ, is scored by text only (and counted)")


def source_folders(args: argparse.Namespace):
    """The SourceFolders of --workspace and --sources (`themisto.release.workspaces`)."""
    from themisto.release.workspaces import SourceFolders

    named = tuple(args.sources or ())
    missing = [str(p) for p in named if not p.is_dir()]
    if missing:
        raise CommandError(f"--sources {missing[0]}: no such folder")
    return SourceFolders(workspace=args.workspace, sources=named)
