"""The release folder on disk, owned here: its file names, the link to the schema, the hashes, the build report,
the error, and the one reader every stage reads a release through.

A release folder is what `themisto build` writes (`themisto.release.parquet`) and `themisto push` uploads:

    README.md             the card; its YAML front matter lists each config's data files (no loading script)
    themisto_build.json   the build report: rows per config and split, each Parquet file's sha256, the content hash
    eval.yaml             the tasks, declared the Hub's way (`themisto.release.eval_yaml`)
    <config>/<split>-00000-of-00001.parquet

`open_release` checks the build report against the Parquet files (each one's sha256, no file the build did not
write) and gives one `ReleaseInfo`, the one handle every stage reads a release through: opened once at the edge (the
command line, the metric module, the Inspect task, the study) and passed down, it keeps the views that are read more
than once (a task's rows by id, the trajectories by kernel, the stored values). Every read of rows checks that file's
sha256 again, on the bytes it parses; a handle pickles (for Ray, a process of the study) as its path and content
hash, and opens there again without hashing every file (`reopened_release`). A release may come from the Hub, so its
JSON and YAML are read within `RELEASE_BOUNDS` (themisto.bounded).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

from themisto.bounded import BoundError, Bounds, loads_yaml, read_json, read_text, read_yaml
from themisto.errors import InputError
from themisto.jsonrecords import from_dict
from themisto.vocabulary import BENCHMARK_SPLIT

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_FILE = "themisto_build.json"
CARD_FILE = "README.md"
EVAL_FILE = "eval.yaml"
TRAJECTORIES = "trajectories"  # the config every task row's steps come from
# A release's own JSON and YAML: a card with a few configs' features, a build report with a few thousand notes.
RELEASE_BOUNDS = Bounds(file_bytes=16 << 20, lines=200_000, depth=32, items=1_000_000)
_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)


class ReleaseError(InputError):
    """A release cannot be built, read or pushed; the message names the file, trajectory or step."""


def shipped(relative: str) -> Path:
    """A file the project ships beside the package: at the repository root in a checkout; under share/themisto in
    an installed copy (pyproject's data-files: the environment's prefix, or beside the package for `--target`)."""
    for base in (REPO_ROOT, REPO_ROOT / "share" / "themisto", Path(sys.prefix) / "share" / "themisto"):
        if (base / relative).exists():
            return base / relative
    return REPO_ROOT / relative


def schema_module() -> ModuleType:
    """`themisto_dataset` (the Features of every config), imported by name or, where the repository root is not on
    sys.path, by its path."""
    try:
        return importlib.import_module("themisto_dataset")
    except ModuleNotFoundError:
        path = REPO_ROOT / "themisto_dataset.py"
        if not path.exists():
            raise ReleaseError(f"{path}: the dataset schema module is missing") from None
        spec = importlib.util.spec_from_file_location("themisto_dataset", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["themisto_dataset"] = module
        spec.loader.exec_module(module)
        return module


def parquet_name(config: str, split: str) -> str:
    """The release-relative path of one config's split."""
    return f"{config}/{split}-00000-of-00001.parquet"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_hash(files: dict[str, str]) -> str:
    """One sha256 over the release's Parquet files (their relative paths and sha256s, sorted)."""
    lines = "".join(f"{rel} {digest}\n" for rel, digest in sorted(files.items()) if rel.endswith(".parquet"))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


@dataclass
class BuildReport:
    """What a build wrote (themisto_build.json): rows per config and split, file hashes, settings, sources, task
    rules, notes, the split by group and the replay's fidelity per trajectory."""

    sizes: dict[str, dict[str, int]]
    files: dict[str, str]  # release-relative path -> sha256
    content_sha256: str
    settings: dict[str, Any]
    source: dict[str, Any]
    tasks: dict[str, dict]
    notes: list[str] = field(default_factory=list)
    split: dict[str, Any] = field(default_factory=dict)  # `themisto.release.splits.SplitPlan.to_dict`
    fidelity: dict[str, Any] = field(default_factory=dict)  # per trajectory (`themisto.replay.fidelity`); {} unreplayed
    # Per source (june-log, ipython-history, ...): trajectories, steps, developers, test developers, rows, replay
    # health, and for a corpus what its reader read, left out and cut (`themisto.release.sources`)
    sources: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def write_to(self, folder: Path) -> None:
        """Write the report as the folder's BUILD_FILE (keys sorted: same build, same bytes)."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        (Path(folder) / BUILD_FILE).write_text(text, encoding="utf-8")

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> BuildReport:
        """The report as read back; a record of another shape is a ReleaseError naming the file."""
        try:
            report = from_dict(cls, data)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ReleaseError(f"{path}: not a build report ({exc})") from None
        shapes = {"sizes": dict, "files": dict, "content_sha256": str, "settings": dict, "source": dict,
                  "tasks": dict, "notes": list, "split": dict, "fidelity": dict,
                  "sources": dict}
        wrong = [name for name, kind in shapes.items() if not isinstance(getattr(report, name), kind)]
        if wrong or not all(isinstance(k, str) and isinstance(v, str) for k, v in report.files.items()):
            raise ReleaseError(f"{path}: not a build report (wrong type of {', '.join(wrong) or 'files'})")
        return report


# ---------------------------------------------------------------------------------------------------------------
# The folder's files, each read within bounds


def split_card(text: str, path: str | Path = CARD_FILE) -> tuple[dict, str]:
    """A card's YAML front matter (as a dict) and its body; a card without one is a ReleaseError naming `path`."""
    match = _FRONT_MATTER.match(text)
    if not match:
        raise ReleaseError(f"{path}: the card has no YAML header between '---' lines")
    data = loads_yaml(match.group(1), RELEASE_BOUNDS, path=path, first_line=2) or {}
    if not isinstance(data, dict):
        raise ReleaseError(f"{path}: the card's YAML header is not a mapping")
    return data, text[match.end():]


def read_card(folder: Path) -> tuple[dict, str]:
    """The release card's front matter and body."""
    path = Path(folder) / CARD_FILE
    return split_card(read_text(path, RELEASE_BOUNDS), path)


def read_build(folder: Path) -> BuildReport:
    """The build report of a release folder."""
    path = Path(folder) / BUILD_FILE
    if not path.is_file():
        raise ReleaseError(f"{folder}: not a release folder (no {BUILD_FILE}); build one with `themisto build`")
    return BuildReport.from_dict(read_json(path, RELEASE_BOUNDS), path)


def read_eval_file(folder: Path) -> Any:
    """eval.yaml as YAML (anchors and aliases refused); `themisto.release.eval_yaml` checks its schema."""
    return read_yaml(Path(folder) / EVAL_FILE, RELEASE_BOUNDS)


def read_parquet(path: Path, sha256: str | None, columns: list[str] | None = None) -> list[dict]:
    """The rows of one Parquet file, parsed from the very bytes whose sha256 is checked against `sha256` (None:
    unchecked, for `themisto check`, which reports the hash itself)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ReleaseError(f"{path}: changed since the release was built (its sha256 differs from {BUILD_FILE})")
    try:
        return pq.read_table(pa.BufferReader(data), columns=columns).to_pylist()
    except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
        raise ReleaseError(f"{path}: not a readable Parquet file ({exc})") from None


# ---------------------------------------------------------------------------------------------------------------
# The release as every stage reads it


@dataclass
class ReleaseInfo:
    """A release folder whose build report matches its Parquet files; rows are read through it, hashes checked. The
    views it caches (`task_rows`, `trajectories_by_kernel`, `values`, `ids`) are shared: read them, do not change
    them."""

    path: Path
    build: BuildReport
    files: dict[str, str]  # the Parquet files present (all that the build wrote, unless one was removed): sha256
    built: str  # the build's date (UTC), from its build report's modification time
    _views: dict = field(default_factory=dict, repr=False, compare=False)

    def __reduce__(self):
        # A handle crosses a process as where it lies and what it holds; the other side reads the build report again
        # and refuses a folder whose files say another content hash (`reopened_release`), without rehashing them.
        return reopened_release, (str(self.path), self.content_hash)

    @property
    def content_hash(self) -> str:
        """The hash of the Parquet files as they are: the build's own unless one was removed since."""
        return content_hash(self.files)

    def splits(self, config: str) -> list[str]:
        """The splits of `config` the build wrote, in their file order."""
        prefix = f"{config}/"
        return [rel[len(prefix):].split("-", 1)[0] for rel in sorted(self.files) if rel.startswith(prefix)]

    def has(self, config: str, split: str = BENCHMARK_SPLIT) -> bool:
        return parquet_name(config, split) in self.files

    def require(self, config: str, split: str = BENCHMARK_SPLIT) -> None:
        """A ReleaseError naming the configs that have `split`, unless `config` has it."""
        if not self.has(config, split):
            have = sorted({rel.split("/")[0] for rel in self.files if self.has(rel.split("/")[0], split)})
            raise ReleaseError(f"{self.path}: the release has no {config} {split} split "
                               f"(it has: {', '.join(have) or 'none'})")

    def rows(self, config: str, split: str = BENCHMARK_SPLIT, columns: list[str] | None = None) -> list[dict]:
        """All rows of one config's split (or the given columns), from the file the build wrote: a fresh list each
        call, the caller's to change."""
        self.require(config, split)
        rel = parquet_name(config, split)
        return read_parquet(self.path / rel, self.files[rel], columns)

    def _view(self, key: tuple, make):
        if key not in self._views:
            self._views[key] = make()
        return self._views[key]

    def task_rows(self, task: str) -> dict[str, dict]:
        """A task's rows of every split by id (read once)."""
        return self._view(("task_rows", task), lambda: {
            row["id"]: row for split in self.splits(task) for row in self.rows(task, split)})

    def trajectories_by_kernel(self) -> dict[str, list[dict]]:
        """The `trajectories` rows of every split by kernel, each kernel's in step order (read once)."""
        def read() -> dict[str, list[dict]]:
            by_kernel: dict[str, list[dict]] = {}
            for split in self.splits(TRAJECTORIES):
                for row in self.rows(TRAJECTORIES, split):
                    by_kernel.setdefault(row["kernel_id"], []).append(row)
            for rows in by_kernel.values():
                rows.sort(key=lambda r: r["step"])
            return by_kernel

        return self._view(("trajectories",), read)

    def trajectory(self, kernel_id: str) -> list[dict]:
        """One kernel's `trajectories` rows in step order; a ReleaseError when the release has none."""
        rows = self.trajectories_by_kernel().get(kernel_id)
        if rows is None:
            raise ReleaseError(f"{self.path}: the release has no trajectories rows for {kernel_id}")
        return rows

    def values(self):
        """The `values` rows of every split, as a restore's source (`themisto.release.values.ReleaseValues`; empty
        when the release stores none), read once."""
        from themisto.release.values import VALUES, ReleaseValues

        return self._view(("values",), lambda: ReleaseValues(
            {digest: row for split in self.splits(VALUES) for digest, row in ReleaseValues.of(self, split).rows.items()}))

    def ids(self, task: str, split: str = BENCHMARK_SPLIT) -> tuple[str, ...]:
        """The example ids of a task's split, in file order (read once)."""
        return self._view(("ids", task, split), lambda: tuple(
            row["id"] for row in self.rows(task, split, columns=["id"])))

    @property
    def workspace(self) -> dict:
        """The inputs the build's replay ran over: {"look_alike_seed", "size", "tasks"} or {"given": name}; {}."""
        return dict(self.build.source.get("workspace") or {})

    @property
    def replay(self) -> dict:
        """The build's ReplaySettings as a dict; {} when the rows were not replayed here (the paper's release)."""
        return dict(self.build.settings.get("replay") or {})


def open_release(folder: str | Path) -> ReleaseInfo:
    """Open a release folder: its build report read, every Parquet file the build recorded hashed against it, and
    no other Parquet file present (a loader would read it too). A file the report lists may be missing (a task
    left empty); reading it says so."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReleaseError(f"{folder}: no such release folder")
    try:
        build = read_build(folder)
    except BoundError as exc:
        raise ReleaseError(str(exc)) from None
    if content_hash(build.files) != build.content_sha256:
        raise ReleaseError(f"{folder / BUILD_FILE}: its content hash does not match the file hashes it lists")
    for path in sorted(folder.rglob("*.parquet")):
        rel = path.relative_to(folder).as_posix()
        if rel not in build.files:
            raise ReleaseError(f"{path}: a Parquet file the build did not write ({BUILD_FILE} does not list it)")
        if sha256_file(path) != build.files[rel]:
            raise ReleaseError(f"{path}: changed since the release was built (its sha256 differs from {BUILD_FILE})")
    return _handle(folder, build)


def _handle(folder: Path, build: BuildReport) -> ReleaseInfo:
    present = {rel: digest for rel, digest in build.files.items() if (folder / rel).is_file()}
    stamp = (folder / BUILD_FILE).stat().st_mtime
    return ReleaseInfo(folder, build, present, datetime.fromtimestamp(stamp, tz=timezone.utc).date().isoformat())


def reopened_release(folder: str | Path, expected_hash: str) -> ReleaseInfo:
    """A handle opened elsewhere (`open_release`), opened again from its path and content hash: the build report read
    again, its files' hashes not recomputed (every read of rows still checks its file's); a ReleaseError when the
    folder now holds another content."""
    folder = Path(folder)
    try:
        info = _handle(folder, read_build(folder))
    except BoundError as exc:
        raise ReleaseError(str(exc)) from None
    if info.content_hash != expected_hash:
        raise ReleaseError(f"{folder}: the release changed since it was opened (content hash {info.content_hash[:12]}… "
                           f"now, {expected_hash[:12]}… then)")
    return info
