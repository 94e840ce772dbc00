"""Subcommands and options for a release anyone may download and anyone can rebuild: collect (a corpus from a pointer
list or a list of repositories), and build's content release, pointer list and redistribution setting."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from themisto.cli.common import CommandError, default_of, format_counts


def add_sharing_options(parser: argparse.ArgumentParser) -> None:
    """build's second output: the content release and the pointer list (`themisto.release.content_release`)."""
    from themisto.ingest.licences import REDISTRIBUTABLE

    group = parser.add_argument_group("what may be redistributed (a content release and pointers for the rest)")
    group.add_argument("--content-release", type=Path, metavar="DIR",
                       help="also write a release holding only what may be redistributed: the authored sample and "
                            "sessions of public repositories under --redistribute")
    group.add_argument("--pointers", type=Path, metavar="FILE",
                       help="write the pointer list for every other trajectory (repository, commit, history file, "
                            "session, blob id, inputs hash; no code or output), beside the releases: it names "
                            "repositories, never commit it")
    group.add_argument("--redistribute", metavar="SPDX,...",
                       help="the SPDX ids whose repositories' sessions a content release may hold (default: "
                            f"{','.join(REDISTRIBUTABLE)})")


def allowed_licences(args: argparse.Namespace) -> tuple[str, ...]:
    from themisto.ingest.licences import LicenceSettingError, redistribution_setting

    try:
        return redistribution_setting(args.redistribute)
    except LicenceSettingError as exc:
        raise CommandError(f"--redistribute: {exc}") from None


def build_outputs(args: argparse.Namespace, rows: list[dict], trajectories: list, source: dict, build):
    """The full release, and the content release and pointers where asked (`build(rows, folder, source)` writes
    one release); the full release's report, with the other two outputs noted in `args`' JSON and lines."""
    from themisto.release.content_release import build_two
    from themisto.release.folder import ReleaseError

    if args.removals is not None:
        from themisto.ingest.removals import read_removals

        source = {**source, "removals": {"by_date": read_removals(args.removals).by_date()}}
    try:
        two = build_two(rows, trajectories, [Path(p) for p in args.paths], args.output, source, build,
                        allowed=allowed_licences(args), content_out=args.content_release, pointers_out=args.pointers)
    except ReleaseError as exc:
        raise CommandError(str(exc)) from None
    lines = [f"redistributable: {two.sharing['shared']} trajectories; pointed at: {two.sharing['pointed']}"]
    if args.content_release is not None:
        why = two.content_error or "no trajectory may be redistributed"
        lines.append(f"content release: {args.content_release} (content sha256 {two.content.content_sha256})"
                     if two.content else f"content release: not written ({why})")
    if args.pointers is not None:
        lines.append(f"pointers: {two.pointers} written to {args.pointers} (they name repositories: never commit "
                     f"them)")
    return two, lines


def collect_command(args: argparse.Namespace) -> int:
    """Fetch the repositories a pointer list (or a list of repositories) names into a corpus `themisto build`
    reads; exit 1 when a repository failed or a pointed session did not read back the same."""
    from themisto.ingest.collect import (CollectSettings, check_rebuilt, collect, read_repository_list,
                                         targets_from_pointers)
    from themisto.ingest.collect_files import FileBounds
    from themisto.ingest.pointers import read_pointers
    from themisto.ingest.removals import read_removals

    if (args.pointers is None) == (args.repos is None):
        raise CommandError("give a pointer list or --repos FILE (one of them)")
    pointers = read_pointers(args.pointers)[1] if args.pointers is not None else None
    targets = targets_from_pointers(pointers)[0] if pointers is not None else read_repository_list(args.repos)
    files = FileBounds(file_bytes=int(args.max_file_mb * 2**20), repository_bytes=int(args.max_repo_mb * 2**20))
    settings = CollectSettings(base_url=args.base_url, timeout_s=args.timeout, files=files,
                               removals=read_removals(args.removals))
    report = collect(targets, args.output, settings)
    if pointers is not None:
        report.pointers = check_rebuilt(args.output, pointers)
    failed = report.failed or (report.pointers and (report.pointers["changed"] or report.pointers["missing"]))
    if args.json:
        print(json.dumps({"output": str(args.output), **report.to_dict()}, sort_keys=True))
        return 1 if failed else 0
    for line in report.refusals:
        print(line)
    print(f"{report.collected} repositories collected, {report.resumed} already there, {report.removed} removed "
          f"(opt-out list), {report.failed} failed; {report.histories} history databases, {report.logs} logs "
          f"({report.taken_before_deletion} repositories read before their deletion); {report.files_kept} files "
          f"kept, {report.files_omitted} omitted; credentials redacted: {format_counts(report.redactions)}")
    if report.pointers is not None:
        check = report.pointers
        print(f"pointers: {check['rebuilt']} of {check['pointed'] - check['not_fetchable']} pointed sessions read "
              f"back with the same id and inputs hash; changed {len(check['changed'])}, missing "
              f"{len(check['missing'])}; {check['not_fetchable']} name no repository (JuNE logs: not collected)")
    print(f"wrote {args.output}")
    return 1 if failed else 0


def add_collect(subparsers: argparse._SubParsersAction) -> None:
    from themisto.ingest.collect import CollectSettings
    from themisto.ingest.collect_files import FileBounds

    parser = subparsers.add_parser("collect", help="fetch the repositories of a pointer list into a corpus")
    parser.add_argument("pointers", nargs="?", type=Path, metavar="POINTERS",
                        help="a pointer list (`themisto build --pointers`)")
    parser.add_argument("--repos", type=Path, metavar="FILE",
                        help="instead: a list of repositories, `owner/name` or `owner/name@COMMIT` a line")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="DIR", help="corpus folder to write")
    parser.add_argument("--base-url", default=default_of(CollectSettings, "base_url"),
                        help="repositories are fetched from BASE/owner/name, and from nowhere else: https:// or "
                             "file:// (default %(default)s)")
    parser.add_argument("--removals", type=Path, metavar="FILE", help="the opt-out list: those repositories are not "
                                                                      "fetched, and removed where collected before")
    parser.add_argument("--max-file-mb", type=float, default=default_of(FileBounds, "file_bytes") / 2**20,
                        metavar="MB", help="a file the sessions read, at most (default %(default)g)")
    parser.add_argument("--max-repo-mb", type=float, default=default_of(FileBounds, "repository_bytes") / 2**20,
                        metavar="MB", help="the files kept of one repository, at most (default %(default)g)")
    parser.add_argument("--timeout", type=float, default=default_of(CollectSettings, "timeout_s"), metavar="S",
                        help="one git command, at most (default %(default)g)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(run=collect_command)
