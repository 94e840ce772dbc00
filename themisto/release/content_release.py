"""Two outputs of one build: the full release (for local research, as every build writes it) and, where asked, a
content release holding only what may be redistributed and a pointer list for the rest (`themisto.release.sharing`).

The full release is built first, from every row; its split is the one the pointers record. The content release is
built from the shared trajectories' rows with the same settings, so its split is its own (drawn the same way, over
fewer groups). The pointer list names repositories: it must lie outside both release folders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from themisto.release.folder import BuildReport, ReleaseError


@dataclass
class TwoOutputs:
    """What a build with sharing wrote: the full release's report, the content release's (None: not asked for, or
    nothing may be redistributed), and the pointers written (None: not asked for)."""

    full: BuildReport
    content: BuildReport | None
    pointers: int | None
    sharing: dict
    content_error: str | None = None  # why the content release could not be built (the full one and pointers were)


def _inside(path: Path, folder: Path | None) -> bool:
    if folder is None:
        return False
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def build_two(rows: Sequence[dict], trajectories: Sequence, corpus_paths: Sequence[Path], out: Path, source: dict,
              build: Callable[[list[dict], Path, dict], BuildReport], *, allowed: tuple[str, ...],
              content_out: Path | None = None, pointers_out: Path | None = None) -> TwoOutputs:
    """Build the full release into `out` and, where asked, the content release into `content_out` and the pointer
    list into `pointers_out`; `build(rows, folder, source)` writes one release (`build_release` with the build's
    settings)."""
    from themisto.ingest.pointers import write_pointers
    from themisto.release.sharing import corpus_origins, plan_sharing, pointers_of

    if pointers_out is not None and (_inside(pointers_out, out) or _inside(pointers_out, content_out)):
        raise ReleaseError(f"{pointers_out}: the pointer list names repositories: write it beside the releases, not "
                           "inside one")
    if content_out is not None and (_inside(content_out, out) or _inside(out, content_out)):
        raise ReleaseError(f"{content_out}: the content release is a folder of its own, beside the full release")
    origins = corpus_origins(corpus_paths)
    plan = plan_sharing(trajectories, origins, allowed)
    rows = plan.relabelled(rows)
    summary = plan.summary()
    full = build(list(rows), out, {**source, "release": "full", "sharing": summary})
    content, error = None, None
    if content_out is not None:
        shared = plan.shared()
        content_rows = [row for row in rows if row["kernel_id"] in shared]
        try:
            if content_rows:
                content = build(content_rows, content_out, {**source, "release": "content", "sharing": summary})
        except ReleaseError as exc:  # too few shared trajectories for the task rules, say: the rest still stands
            error = str(exc)
    written = None
    if pointers_out is not None:
        written = write_pointers(pointers_out, pointers_of(plan, trajectories, rows, full.split, origins), about={
            "release": full.content_sha256, "content_release": content.content_sha256 if content else None,
            "allowed": list(allowed)})
    return TwoOutputs(full, content, written, summary, error)
