"""The `themisto` command line: one function per subcommand, heavy imports inside it.

To add a subcommand, write `add_<name>(subparsers)` (its arguments, `set_defaults(run=<function>)`) and a
`<name>_command(args) -> int`, then list `add_<name>` in `SUBCOMMANDS`.

Subcommands live by stage: `sharing` (collect, and build's content release and pointers), `data` (ingest, workspace,
replay, build, check, push), `scoring` (score, summary), `models` (generate, sft-export), `study` (the fine-tuning
study) and `board` (submit, leaderboard); `common` holds what they share.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from themisto.cli.board import add_leaderboard, add_submit
from themisto.cli.common import CommandError
from themisto.cli.data import add_build, add_check, add_ingest, add_push, add_replay, add_workspace
from themisto.cli.models import add_generate, add_sft_export
from themisto.cli.scoring import add_score, add_summary
from themisto.cli.sharing import add_collect
from themisto.cli.study import add_study

SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    add_collect, add_ingest, add_workspace, add_replay, add_build, add_check, add_push, add_score, add_summary,
    add_sft_export, add_submit, add_leaderboard, add_generate, add_study)


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
    from themisto.gate import ExecutionRefused

    try:
        return args.run(args)
    # Input errors name their file and line or example id; a path the user gave that is not there names itself.
    # Anything else is a bug and keeps its traceback.
    except (CommandError, InputError, ExecutionRefused, FileNotFoundError, IsADirectoryError,
            NotADirectoryError) as exc:
        print(f"themisto {args.command}: error: {exc}", file=sys.stderr)
        return 2

