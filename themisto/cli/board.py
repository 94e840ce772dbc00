"""Subcommands of the leaderboard: submit, leaderboard."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from themisto.cli.common import (CommandError, add_ray_option, add_source_options, ray_held, scoring_runner,
                                 source_folders)


def submit_command(args: argparse.Namespace) -> int:
    """Validate a run folder as a submission, then copy it into a local submissions folder and/or open a pull
    request on the Hub's submissions dataset repo (and, with --eval-results, on the model repo)."""
    from themisto.leaderboard.submission import read_submission, submission_slug, write_submission
    from themisto.release.folder import open_release

    if not (args.to or args.to_dir):
        raise CommandError("say where the submission goes: --to REPO_ID (a Hub pull request) and/or --to-dir DIR")
    if args.eval_results and not (args.to and args.dataset_id):
        raise CommandError("--eval-results needs --to (its source_url is the submission PR) and --dataset-id")
    release = open_release(args.release)
    submission = read_submission(args.run_dir, release)
    for line in submission.ignored:
        print(f"ignored: {line}", file=sys.stderr)
    print(f"valid: {submission.model} ({submission.task}; contexts {', '.join(submission.contexts)}; "
          f"{len(submission.generations)} predictions; sha256 {submission.predictions_sha256[:12]})")
    if args.to:
        from themisto.leaderboard.hub import EvalResultsRequest, send_submission

        request = (EvalResultsRequest(args.eval_results, args.dataset_id, args.dataset_revision)
                   if args.eval_results else None)
        done = send_submission(submission, release, args.to, eval_results=request, execute=args.execute,
                               workspace=source_folders(args))
        print(f"submission pull request: {done.submission_pr}")
        if done.eval_results_pr:
            print(f"eval results pull request: {done.eval_results_pr}")
    if args.to_dir:
        dest = write_submission(submission, args.to_dir / submission_slug(submission))
        print(f"copied to {dest}")
    return 0


def add_submit(subparsers: argparse._SubParsersAction) -> None:
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
    add_source_options(parser, "with --execute")
    parser.set_defaults(run=submit_command)


def leaderboard_command(args: argparse.Namespace) -> int:
    """Re-score every submission against the release and write the board: Markdown, CSV, JSON, PNG, Space; exit 2
    when a submission was refused (the board lists it, the rest are on it)."""
    from themisto.gate import permit
    from themisto.resume import hold_folder

    if args.execute:
        permit(execute=True)  # refuse before reading any submission
    # One writer per board folder (its score cache and its files): another is refused with its pid.
    with hold_folder(args.output, "board folder"):
        return _write_board(args)


def _write_board(args: argparse.Namespace) -> int:
    from themisto.leaderboard.board import build_board
    from themisto.leaderboard.board_files import SPACE_DIR, write_board
    from themisto.release.folder import open_release

    release = open_release(args.release)
    with ray_held(args):
        board = build_board(args.submissions, release, execute=args.execute, cache_dir=args.output / "cache",
                            progress=lambda message: print(message, file=sys.stderr, flush=True),
                            runner=scoring_runner(args), workspace=source_folders(args))
    files = write_board(board, args.output)
    for note in board.notes:
        print(f"note: {note}")
    for refusal in board.refused:  # one line each; the reason names the submission's file, line and bound
        shown = refusal.reason if refusal.reason.startswith(refusal.folder) else f"{refusal.folder}: {refusal.reason}"
        print(f"refused: {shown}")
    print(f"{len(board.entries)} submission(s) on the board, {len(board.refused)} refused; wrote "
          + ", ".join(str(path) for path in files.values()))
    if args.push_space:
        from themisto.leaderboard.hub import push_space

        print(f"pushed the Space: {push_space(args.output / SPACE_DIR, args.push_space)}")
    return 2 if board.refused else 0


def add_leaderboard(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("leaderboard", help="re-score submissions and write the board and its Space")
    parser.add_argument("submissions", nargs="+", type=Path, metavar="SUBMISSION",
                        help="a run folder, or a folder of submissions")
    parser.add_argument("--release", required=True, type=Path, metavar="DIR", help="release folder")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="BOARD", help="folder to write")
    parser.add_argument("--execute", action="store_true",
                        help="execute next_cell predictions (also needs HF_ALLOW_CODE_EVAL=1)")
    parser.add_argument("--push-space", metavar="REPO_ID", help="upload BOARD/space/ to this static Space")
    add_source_options(parser, "with --execute")
    add_ray_option(parser, "with --execute, re-score")
    parser.set_defaults(run=leaderboard_command)
