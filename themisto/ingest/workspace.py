"""Seeded look-alike input files for replaying the JuNE tasks, laid out as the participants' notebooks expect.

The real inputs (the JetNet log of task 1, the train/validation pickles of task 2) are not available, so replay
runs on files generated from a seed. What matters is fidelity of format and dtypes: the cells that worked on the
real data must work here, and the ones that failed must fail with the same exception. Everything below that
looks arbitrary was read off the real trajectories (../shared/data/june): printed lines and output sizes in the
logs, error messages, the final notebooks' outputs, and the real task-2 test features. The generators live in
`lookalike_jetnet` (task 1) and `lookalike_features` (task 2); this module writes their files atomically.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator

import pandas as pd

from themisto.errors import InputError
from themisto.ingest.lookalike_features import cell_feature_splits
from themisto.ingest.lookalike_jetnet import jetnet_log_lines
from themisto.ingest.lookalike_spec import SIZE_SPECS
from themisto.resume import folder_written_whole

TASKS: tuple[str, ...] = ("task1", "task2")
SIZES: tuple[str, ...] = ("small", "medium", "full")

# Paths relative to the workspace root, which is the kernel's working directory, the participant's checkout of the
# hackathon template. The template shipped the JetNet log as data/task1/jetnet_logs.zip, holding jetnet_logs.txt at
# its root; the logged code reads it in the zip (student_1, 3, 4), unzips it into data/task1 (student_0) or into
# data/task1/jetnet_logs/ (student_7, unzipped before the log began), or reads a copy unzipped by hand beside the
# notebook (student_5). The look-alike log lies at each of those places. Task 2 opens 'data/task2/' + name.
JETNET_LOG = "data/task1/jetnet_logs/jetnet_logs.txt"
JETNET_ZIP = "data/task1/jetnet_logs.zip"
JETNET_IN_ZIP = "jetnet_logs.txt"
JETNET_BESIDE = "jetnet_logs.txt"
TRAIN_FEATURES = "data/task2/train_features.pkl"
VALIDATION_FEATURES = "data/task2/validation_features.pkl"
TEST_FEATURES = "data/task2/test_features.pkl"
STAND_IN_MODULE = "mining_extension.py"

PICKLE_PROTOCOL = 5  # the protocol of the real test_features.pkl


class WorkspaceError(InputError):
    """A workspace cannot be written as asked; the message names the path or the argument."""


@dataclass
class Workspace:
    """A generated workspace: its root, and the sha256 of every file it holds (relative POSIX path → hex)."""

    root: Path
    files: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    size: str = "small"
    tasks: tuple[str, ...] = TASKS


def write_workspace(dest, tasks=TASKS, *, seed: int = 0, size: str = "small",
                    overwrite: bool = False) -> Workspace:
    """Generate the input files of `tasks` from `seed` into `dest`, atomically; same seed and size, same bytes.

    `dest` must not exist or be empty unless `overwrite` is true. Files are written to a temporary sibling
    folder that is renamed into place at the end, so an error leaves nothing half-written.
    """
    dest = Path(dest)
    tasks = tuple(tasks)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise WorkspaceError(f"tasks must be a non-empty subset of {TASKS}, got {tasks!r}")
    if size not in SIZE_SPECS:
        raise WorkspaceError(f"size must be one of {SIZES}, got {size!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise WorkspaceError(f"seed must be a non-negative int, got {seed!r}")
    if dest.exists() and not dest.is_dir():
        raise WorkspaceError(f"{dest}: exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()) and not overwrite:
        raise WorkspaceError(f"{dest}: folder is not empty (pass overwrite=True to replace it)")
    spec = SIZE_SPECS[size]

    with folder_written_whole(dest) as tmp:
        files: dict[str, str] = {}
        stand_in = resources.files("themisto.ingest._stand_ins").joinpath("mining_extension.py").read_bytes()
        files[STAND_IN_MODULE] = _write_bytes(tmp / STAND_IN_MODULE, stand_in)
        if "task1" in tasks:
            files[JETNET_LOG] = _write_chunks(tmp / JETNET_LOG, jetnet_log_lines(spec, seed))
            log = (tmp / JETNET_LOG).read_bytes()
            files[JETNET_BESIDE] = _write_bytes(tmp / JETNET_BESIDE, log)
            files[JETNET_ZIP] = _write_bytes(tmp / JETNET_ZIP, _zipped(JETNET_IN_ZIP, log))
        if "task2" in tasks:
            splits = cell_feature_splits(spec, seed)
            for rel, frame in zip((TRAIN_FEATURES, VALIDATION_FEATURES, TEST_FEATURES), splits):
                files[rel] = _write_bytes(tmp / rel, portable_frame_pickle(frame))
    return Workspace(root=dest, files=dict(sorted(files.items())), seed=seed, size=size, tasks=tasks)


def portable_frame_pickle(frame: pd.DataFrame) -> bytes:
    """Pickle `frame` so that any pandas with any numpy unpickles it to the same columns, values and dtypes.

    A DataFrame pickled by pandas 2.2 on numpy 2 names `numpy._core`, which numpy 1.x (the participants'
    era, and the replay kernel's environment) cannot import. This pickle holds only built-in values and one
    call, `pandas.DataFrame({column: list})`, which infers the same int64/float64/object dtypes.
    """
    for column, dtype in frame.dtypes.items():
        if dtype.kind not in "ifO":
            raise WorkspaceError(f"column {column!r}: dtype {dtype} would not survive the portable pickle")
    buffer = io.BytesIO()
    _FramePickler(buffer, protocol=PICKLE_PROTOCOL).dump(frame)
    return buffer.getvalue()


class _FramePickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, pd.DataFrame):
            return pd.DataFrame, ({column: obj[column].tolist() for column in obj.columns},)
        return NotImplemented


def _zipped(name: str, data: bytes) -> bytes:
    """A zip holding one file, the same bytes for the same data (a fixed time stamp and compression level)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        info = zipfile.ZipInfo(name, date_time=(2023, 5, 1, 0, 0, 0))
        info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
        archive.writestr(info, data, compresslevel=6)
    return buffer.getvalue()


def _write_bytes(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _write_chunks(path: Path, chunks: Iterator[str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    # newline="\n": the same bytes on every platform; the participants' parsers split on "\n".
    with open(path, "w", encoding="ascii", newline="\n") as out:
        for chunk in chunks:
            out.write(chunk)
            digest.update(chunk.encode("ascii"))
    return digest.hexdigest()
