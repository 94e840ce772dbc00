"""Seeded look-alike input files for replaying the JuNE tasks, laid out as the participants' notebooks expect.

The real inputs (the JetNet log of task 1, the train/validation pickles of task 2) are not available, so replay
runs on files generated from a seed. What matters is fidelity of format and dtypes: the cells that worked on the
real data must work here, and the ones that failed must fail with the same exception. Everything below that
looks arbitrary was read off the real trajectories (../shared/data/june): printed lines and output sizes in the
logs, error messages, the final notebooks' outputs, and the real task-2 test features.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from themisto.errors import InputError

TASKS: tuple[str, ...] = ("task1", "task2")
SIZES: tuple[str, ...] = ("small", "medium", "full")

# Paths relative to the workspace root, which is the kernel's working directory. The logged code opens
# "./data/task1/jetnet_logs/jetnet_logs.txt" and 'data/task2/' + name; nothing else.
JETNET_LOG = "data/task1/jetnet_logs/jetnet_logs.txt"
TRAIN_FEATURES = "data/task2/train_features.pkl"
VALIDATION_FEATURES = "data/task2/validation_features.pkl"
TEST_FEATURES = "data/task2/test_features.pkl"
STAND_IN_MODULE = "mining_extension.py"

PICKLE_PROTOCOL = 5  # the protocol of the real test_features.pkl

# The 21 feature columns and their dtypes, as in the real test_features.pkl.
FEATURE_DTYPES: dict[str, str] = {
    "filename": "object", "cell_type": "object", "cell_number": "int64", "execution_count": "int64",
    "linesofcomment": "float64", "linesofcode": "float64", "variable_count": "float64",
    "function_count": "float64", "text/plain": "int64", "image/png": "int64", "text/html": "int64",
    "execute_result": "int64", "display_data": "int64", "stream": "int64", "error": "int64",
    "text": "object", "comment": "object", "code_line_before": "object", "code_line_after": "object",
    "markdown_heading": "object", "packages_info": "object",
}
# Label columns in the order the participant's `train_features.columns` printed them.
LABEL_COLUMNS: tuple[str, ...] = (
    "helper_functions", "load_data", "data_exploration", "data_preprocessing", "evaluation", "modelling",
    "prediction", "result_visualization", "save_results", "comment_only",
)
# Shares of `primary_label` in the real train split (the participant printed value_counts(normalize=True)).
PRIMARY_LABEL_SHARES: dict[str, float] = {
    "data_exploration": 0.285273, "data_preprocessing": 0.239328, "modelling": 0.158066,
    "helper_functions": 0.080062, "load_data": 0.074404, "result_visualization": 0.050060,
    "evaluation": 0.039945, "prediction": 0.030859, "comment_only": 0.023144, "save_results": 0.018858,
}
PRIMARY_LINE_SHARE = 0.5  # share of a cell's code lines typical of its primary label

# Task 1: the action vocabulary and its shares, read off the participant's bar chart of action counts.
ACTION_SHARES: dict[str, float] = {
    "Action_0": 0.078, "Action_1": 0.074, "Action_2": 0.010, "Action_3": 0.158, "Action_4": 0.130,
    "Action_5": 0.014, "Action_6": 0.072, "Action_7": 0.236, "Action_8": 0.062, "Action_9": 0.038,
    "Action_10": 0.128,
}
FIRST_ACTION = datetime(2019, 9, 20, 13, 44, 16)  # earliest action time in the real data
LAST_ACTION = datetime(2021, 7, 28, 15, 41, 31)  # time of the real file's last END
MEAN_ACTION_GAP_S = 31 * 60
SESSION_ACTIONS = (10, 35)  # inclusive range of actions per session; the real mean is ~22.5
NO_END_SHARE = 0.101  # 87,572 sessions, 78,731 END rows: a tenth of the lines end in " -> " with no END
LONG_ARROW_SHARE = 0.04  # a few separators are " --> " (both real lines the participant pasted have one)
OUT_OF_ORDER_SHARE = 0.2  # logged times within a session are not monotonic in the real file
DIRTY_ACTION_SHARE = 0.0015  # 3,045 of 1,974,979 non-END rows were dropped by the participant's dropna()
CLEAN_FIRST_LINES = 50  # drafts parsing data[:30], data[:40] and data[:50] found no dirty action


class WorkspaceError(InputError):
    """A workspace cannot be written as asked; the message names the path or the argument."""


@dataclass(frozen=True)
class SizeSpec:
    """How much data one size generates."""

    users: int
    sessions: int
    active_days: int | None  # None: sessions start on any day of the real date range
    train_rows: int
    validation_rows: int
    test_rows: int


# "full" matches the real statistics: 143 users, 87,572 sessions (~2.05M log rows), and the split sizes
# the participant printed: (5833, 32), (1927, 32), (1918, 21). "small" packs its sessions into a few days
# so that per-day statistics (top 20 % of users per day) still have several users to rank.
SIZE_SPECS: dict[str, SizeSpec] = {
    "small": SizeSpec(users=12, sessions=200, active_days=20, train_rows=1800, validation_rows=600,
                      test_rows=600),
    "medium": SizeSpec(users=143, sessions=8800, active_days=None, train_rows=2900, validation_rows=960,
                       test_rows=960),
    "full": SizeSpec(users=143, sessions=87572, active_days=None, train_rows=5833, validation_rows=1927,
                     test_rows=1918),
}


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

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        files: dict[str, str] = {}
        stand_in = resources.files("themisto.ingest._stand_ins").joinpath("mining_extension.py").read_bytes()
        files[STAND_IN_MODULE] = _write_bytes(tmp / STAND_IN_MODULE, stand_in)
        if "task1" in tasks:
            files[JETNET_LOG] = _write_chunks(tmp / JETNET_LOG, jetnet_log_lines(spec, seed))
        if "task2" in tasks:
            splits = cell_feature_splits(spec, seed)
            for rel, frame in zip((TRAIN_FEATURES, VALIDATION_FEATURES, TEST_FEATURES), splits):
                files[rel] = _write_bytes(tmp / rel, portable_frame_pickle(frame))
        _replace_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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


def _replace_dir(tmp: Path, dest: Path) -> None:
    if not dest.exists():
        os.replace(tmp, dest)
        return
    # Move the old folder aside first, so that dest is never a mix of old and new files.
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    os.replace(dest, old / "previous")
    try:
        os.replace(tmp, dest)
    except BaseException:
        os.replace(old / "previous", dest)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _seed_for(seed: int, part: str) -> np.random.SeedSequence:
    # Each part draws from its own stream, so task 1's bytes do not depend on whether task 2 was asked for.
    return np.random.SeedSequence([seed, int.from_bytes(hashlib.sha256(part.encode()).digest()[:4], "big")])


# ---------------------------------------------------------------------------------------------- task 1


def jetnet_log_lines(spec: SizeSpec, seed: int, chunk_sessions: int = 4096) -> Iterator[str]:
    """Yield the JetNet log text in chunks: one `@User<id>: Action_k (dd/mm/yy | HH:MM:SS) -> … -> END (…)` line
    per session, with the kinds of dirt the participant's parser had to survive (see the module constants)."""
    ss = _seed_for(seed, "task1")
    rng = np.random.default_rng(ss)
    n = spec.sessions
    user_ids = np.sort(rng.choice(143, size=spec.users, replace=False)) if spec.users < 143 \
        else np.arange(spec.users)
    # Heavy-ish tailed activity per user; every user gets at least one session.
    weights = rng.lognormal(0.0, 0.5, size=spec.users)
    owner = np.concatenate([rng.permutation(spec.users),
                            rng.choice(spec.users, size=max(n - spec.users, 0), p=weights / weights.sum())])[:n]
    n_actions = rng.integers(SESSION_ACTIONS[0], SESSION_ACTIONS[1] + 1, size=n)
    has_end = rng.random(n) >= NO_END_SHARE
    has_end[:2] = True  # the first and last sessions by time pin the date range (below)
    total = int(n_actions.sum())
    names = rng.choice(len(ACTION_SHARES), size=total, p=np.array(list(ACTION_SHARES.values())))
    # Gaps before each action and before END; the first action of a session has gap 0.
    gaps = rng.exponential(MEAN_ACTION_GAP_S, size=total).astype(np.int64) + 5
    first = np.concatenate([[0], np.cumsum(n_actions)[:-1]])
    gaps[first] = 0
    elapsed = np.cumsum(gaps)
    elapsed -= np.repeat(elapsed[first], n_actions)
    last = first + n_actions - 1
    end_gap = rng.exponential(MEAN_ACTION_GAP_S, size=n).astype(np.int64) + 5
    duration = elapsed[last] + end_gap

    span = int((LAST_ACTION - FIRST_ACTION).total_seconds())
    if spec.active_days is None:
        start = (rng.random(n) * np.maximum(span - duration, 0)).astype(np.int64)
    else:
        n_days = span // 86400
        days = np.concatenate([[0, n_days], rng.choice(np.arange(1, n_days), size=spec.active_days - 2,
                                                        replace=False)])
        start = rng.choice(days, size=n) * 86400 + rng.integers(0, 86400, size=n)
        start = np.clip(start, 0, np.maximum(span - duration, 0))
    start[0] = 0
    start[1] = span - duration[1]

    # Shown times: some actions (never the first two of a session) are logged earlier than their position.
    shown = elapsed.copy()
    pos = np.arange(total) - np.repeat(first, n_actions)
    jitter = (rng.random(total) < OUT_OF_ORDER_SHARE) & (pos >= 2)
    shown[jitter] -= (rng.random(int(jitter.sum())) * 1.5 * gaps[jitter]).astype(np.int64)
    shown = np.maximum(shown, 0) + np.repeat(start, n_actions)
    end_at = start + duration

    long_arrow = rng.random(total) < LONG_ARROW_SHARE
    order = rng.permutation(n)  # sessions appear in the file in no particular order
    if order[0] < 2:  # the first line has no END (below); the two sessions that pin the dates need theirs
        order[[0, 2]] = order[[2, 0]]
    has_end[order[0]] = False
    # The real file's first CLEAN_FIRST_LINES lines had no dirt: drafts that parsed only data[:30] with a
    # strict regex succeeded. The first action of the earliest session pins the start date: keep it too.
    dirty_ok = np.ones(total, dtype=bool)
    dirty_ok[0] = False
    for s in order[:CLEAN_FIRST_LINES].tolist():
        dirty_ok[first[s]:first[s] + n_actions[s]] = False
    dirty = np.flatnonzero((rng.random(total) < DIRTY_ACTION_SHARE) & dirty_ok)
    dirt_at = dict(zip(dirty.tolist(), rng.integers(0, len(_DIRT), size=len(dirty)).tolist()))

    clock = _Clock(FIRST_ACTION)
    action_names = list(ACTION_SHARES)
    # Plain lists: indexing numpy arrays one element at a time is several times slower.
    names, shown, long_arrow = names.tolist(), shown.tolist(), long_arrow.tolist()
    for lo in range(0, n, chunk_sessions):
        lines = []
        for s in order[lo:lo + chunk_sessions].tolist():
            a, b = int(first[s]), int(first[s] + n_actions[s])
            tokens = []
            for i in range(a, b):
                name = action_names[names[i]]
                date, time = clock.parts(shown[i])
                kind = dirt_at.get(i)
                tokens.append(f"{name} ({date} | {time})" if kind is None else _DIRT[kind](name, date, time))
                tokens.append(" --> " if long_arrow[i] else " -> ")
            if has_end[s]:
                date, time = clock.parts(int(end_at[s]))
                tokens.append(f"END ({date} | {time})")
            else:
                tokens[-1] = " -> "  # the line stops after a separator, as the real file's first line does
            lines.append(f"@User{user_ids[owner[s]]}: {''.join(tokens)}\n")
        yield "".join(lines)


# Dirty action tokens: each keeps the line parseable by the participant's final parser (no "@", "-> ", ": "
# or newline inside) but yields a NaN name or a NaT time there, which its dropna() removes.
_DIRT = (
    lambda name, date, time: f"{name} ()",  # no timestamp
    lambda name, date, time: f"{name} ({date} | )",  # no time of day
    lambda name, date, time: f"{name} ({date} | {time[:5]})",  # truncated time
    lambda name, date, time: f"{name.lower()} ({date} | {time})",  # name in the wrong case
    lambda name, date, time: f"Action_ ({date} | {time})",  # name without its number
    lambda name, date, time: f"({date} | {time})",  # no name
)


class _Clock:
    """Formats seconds after the first day's midnight as ("dd/mm/yy", "HH:MM:SS"), with cached day strings."""

    def __init__(self, first: datetime):
        self.midnight = first.replace(hour=0, minute=0, second=0)
        self.offset = int((first - self.midnight).total_seconds())
        self.days: dict[int, str] = {}

    def parts(self, seconds_after_first: int) -> tuple[str, str]:
        day, tod = divmod(seconds_after_first + self.offset, 86400)
        date = self.days.get(day)
        if date is None:
            date = self.days[day] = (self.midnight + timedelta(days=day)).strftime("%d/%m/%y")
        hours, rest = divmod(tod, 3600)
        return date, f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


# ---------------------------------------------------------------------------------------------- task 2


def cell_feature_splits(spec: SizeSpec, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Return (train, validation, test) cell-feature frames: 32, 32 and 21 columns, dtypes as the real data."""
    rng = random.Random(int(_seed_for(seed, "task2").generate_state(1)[0]))
    used_names: set[int] = set()
    train = _features_frame(_notebook_rows(rng, spec.train_rows, used_names), labelled=True)
    validation = _features_frame(_notebook_rows(rng, spec.validation_rows, used_names), labelled=True)
    test = _features_frame(_notebook_rows(rng, spec.test_rows, used_names), labelled=False)
    return train, validation, test


def _features_frame(rows: list[dict], labelled: bool) -> pd.DataFrame:
    columns = list(FEATURE_DTYPES) + (["primary_label", *LABEL_COLUMNS] if labelled else [])
    frame = pd.DataFrame({c: [r[c] for r in rows] for c in columns})
    for column, dtype in FEATURE_DTYPES.items():
        frame[column] = frame[column].astype(dtype)
    for column in LABEL_COLUMNS if labelled else ():
        frame[column] = frame[column].astype("int64")
    return frame


def _notebook_rows(rng: random.Random, n_rows: int, used_names: set[int]) -> list[dict]:
    rows: list[dict] = []
    while len(rows) < n_rows:
        # Cells per notebook: real test split has mean 20, median 15, max 127.
        n_cells = min(max(1, int(rng.lognormvariate(2.65, 0.75))), n_rows - len(rows), 130)
        number = rng.randrange(1, 70000)
        while number in used_names:
            number = rng.randrange(1, 70000)
        used_names.add(number)
        rows.extend(_notebook(rng, f"nb_{number}.ipynb", n_cells))
    return rows


def _notebook(rng: random.Random, filename: str, n_cells: int) -> list[dict]:
    labels = list(PRIMARY_LABEL_SHARES)
    shares = list(PRIMARY_LABEL_SHARES.values())
    cells = []
    cell_number = rng.randrange(0, 3)
    execution_count = 0
    heading: object = 0
    for _ in range(n_cells):
        primary = rng.choices(labels, weights=shares)[0]
        extra = [lab for lab in labels if lab != primary and lab != "comment_only" and rng.random() < 0.06]
        text, comment = _cell_code(rng, primary, extra)
        if rng.random() < 0.45:  # a markdown cell sits before this one
            cell_number += 1 + int(rng.expovariate(1.2))
            heading = [rng.choice(_HEADINGS)] if rng.random() < 0.85 else heading
        if rng.random() < 0.09:
            shown_count = -1  # never executed in the saved notebook
        else:
            execution_count += 1 + (int(rng.expovariate(0.45)) if rng.random() < 0.5 else 0)
            shown_count = execution_count
        cells.append({
            "filename": filename, "cell_type": "code", "cell_number": cell_number,
            "execution_count": shown_count, "linesofcomment": float(len(comment)),
            "linesofcode": float(len(text)), "variable_count": float(_count_variables(text)),
            "function_count": float(sum(line.lstrip().startswith("def ") for line in text)),
            **_outputs(rng, primary, shown_count),
            "text": text, "comment": comment, "markdown_heading": heading,
            "packages_info": _packages_info(rng, text),
            "primary_label": primary,
            **{lab: int(lab == primary or lab in extra) for lab in LABEL_COLUMNS},
        })
        cell_number += 1
    # The neighbours' code lines: [last line of the previous code cell] / [first line of the next]; 0 at the ends.
    for i, cell in enumerate(cells):
        before = cells[i - 1]["text"] if i > 0 else []
        after = cells[i + 1]["text"] if i + 1 < len(cells) else []
        cell["code_line_before"] = [before[-1]] if before else 0
        cell["code_line_after"] = [after[0]] if after else 0
    return cells


def _outputs(rng: random.Random, label: str, execution_count: int) -> dict[str, int]:
    shows = {"data_exploration": 0.6, "evaluation": 0.45, "prediction": 0.3, "result_visualization": 0.2}
    plots = {"result_visualization": 0.85, "data_exploration": 0.2, "evaluation": 0.2}
    prints = {"modelling": 0.35, "evaluation": 0.4, "data_exploration": 0.25, "load_data": 0.15}
    ran = execution_count != -1
    execute_result = int(ran and rng.random() < shows.get(label, 0.1))
    display_data = 0
    if ran and rng.random() < plots.get(label, 0.03):
        display_data = 1 + (int(rng.expovariate(0.9)) if rng.random() < 0.2 else 0)
    stream = 0
    if ran and rng.random() < prints.get(label, 0.12):
        stream = 1 if rng.random() < 0.9 else 1 + int(rng.paretovariate(1.1))  # long training logs exist
    return {
        "text/plain": execute_result + display_data,
        "image/png": display_data,
        "text/html": int(execute_result and label == "data_exploration" and rng.random() < 0.5),
        "execute_result": execute_result, "display_data": display_data, "stream": min(stream, 1000),
        "error": int(ran and rng.random() < 0.009),
    }


def _count_variables(text: list[str]) -> int:
    names = []
    for line in text:
        head, sep, _ = line.partition("=")
        if sep and not line.lstrip().startswith(("#", "def ", "if ", "for ", "print(")) and "==" not in line \
                and "(" not in head:
            names.extend(n.strip() for n in head.split(","))
    return len(dict.fromkeys(n for n in names if n))


def _cell_code(rng: random.Random, primary: str, extra: list[str]) -> tuple[list[str], list[str]]:
    comments = [rng.choice(_COMMENTS) for _ in range(rng.randrange(1, 4) if rng.random() < 0.35 else 0)]
    if primary == "comment_only":
        return [], comments or [rng.choice(_COMMENTS)]
    n_lines = max(1, min(int(rng.lognormvariate(1.0, 0.95)), 60))
    fill = _Fill(rng)
    text = []
    for _ in range(n_lines):
        # Real cells mix activities: about half of the lines carry the primary label's typical code, which
        # leaves a text classifier near the participant's F1 (0.72) rather than near 1.
        draw = rng.random()
        label = primary if draw < PRIMARY_LINE_SHARE else rng.choice(extra) if extra and draw < 0.6 \
            else rng.choice(_SNIPPET_LABELS)
        text.append(fill(rng.choice(_SNIPPETS[label])))
    if primary == "helper_functions":
        text = [fill("def {fn}({var}):")] + ["    " + line for line in text] + [fill("    return {var}")]
    return text, comments


class _Fill:
    """Fills a snippet's placeholders with names chosen by the notebook's RNG."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def __call__(self, snippet: str) -> str:
        pick = self.rng.choice
        return snippet.format(
            df=pick(("df", "data", "train", "test", "df_train", "dataset")), col=pick(_COLUMNS),
            model=pick(("model", "clf", "rf", "lr", "xgb", "knn")), file=pick(_FILES),
            fn=pick(("clean_text", "load", "preprocess", "get_features", "plot_history", "score")),
            var=pick(("x", "row", "s", "values", "arr", "name")), n=pick((3, 5, 10, 42, 100, 200, 1000)),
            X=pick(("X", "X_train", "features")), y=pick(("y", "y_train", "target", "labels")),
        )


_COLUMNS = ("age", "price", "Survived", "label", "text", "date", "category", "SalePrice", "target", "income")
_FILES = ("train", "test", "data", "sales", "titanic", "reviews", "housing", "tweets")
_SNIPPETS: dict[str, tuple[str, ...]] = {
    "load_data": (
        "import pandas as pd", "import numpy as np", "{df} = pd.read_csv('{file}.csv')",
        "{df} = pd.read_csv('../input/{file}.csv', index_col=0)", "{df} = pd.read_json('{file}.json')",
        "with open('{file}.txt') as f:", "    lines = f.readlines()", "{df} = pd.read_excel('{file}.xlsx')",
        "from sklearn.datasets import load_iris", "import matplotlib.pyplot as plt",
    ),
    "helper_functions": (
        "{var} = {var}.strip().lower()", "if {var} is None:", "for {var} in values:",
        "result = [{var} for {var} in {df}['{col}']]", "{var} = np.log1p({var})", "out.append({var})",
    ),
    "data_preprocessing": (
        "{df}['{col}'] = {df}['{col}'].fillna(0)", "{df} = {df}.dropna()", "{X} = {df}.drop('{col}', axis=1)",
        "{y} = {df}['{col}']", "{df}['{col}'] = {df}['{col}'].astype(int)",
        "X_train, X_test, y_train, y_test = train_test_split({X}, {y}, test_size=0.2)",
        "scaler = StandardScaler()", "{X} = scaler.fit_transform({X})",
        "{df} = pd.get_dummies({df}, columns=['{col}'])", "{df}['{col}'] = {df}['{col}'].map({{'a': 0, 'b': 1}})",
    ),
    "data_exploration": (
        "{df}.head()", "{df}.describe()", "{df}['{col}'].value_counts()", "{df}.shape", "{df}.info()",
        "print({df}.columns)", "{df}.isnull().sum()", "{df}.groupby('{col}').mean()", "{df}.corr()",
        "{df}['{col}'].unique()", "sns.countplot(x='{col}', data={df})",
    ),
    "modelling": (
        "{model} = RandomForestClassifier(n_estimators={n})", "{model}.fit({X}, {y})",
        "{model} = LogisticRegression(C=1.0)", "{model} = GradientBoostingRegressor(max_depth={n})",
        "from sklearn.ensemble import RandomForestClassifier", "{model}.add(Dense({n}, activation='relu'))",
        "history = {model}.fit({X}, {y}, epochs={n}, batch_size=32)", "{model} = KNeighborsClassifier({n})",
    ),
    "prediction": (
        "y_pred = {model}.predict(X_test)", "preds = {model}.predict_proba(X_test)[:, 1]",
        "predictions = {model}.predict({X})", "test['{col}'] = {model}.predict(test_X)",
    ),
    "evaluation": (
        "print(accuracy_score(y_test, y_pred))", "confusion_matrix(y_test, y_pred)",
        "print(classification_report(y_test, y_pred))", "mean_squared_error(y_test, y_pred)",
        "scores = cross_val_score({model}, {X}, {y}, cv={n})", "roc_auc_score(y_test, preds)",
    ),
    "result_visualization": (
        "plt.plot(history.history['loss'])", "plt.figure(figsize=(10, 6))", "plt.show()",
        "sns.heatmap(cm, annot=True)", "plt.title('{col}')", "plt.xlabel('{col}')",
        "plt.scatter({df}['{col}'], y_pred)", "{df}['{col}'].hist(bins={n})",
    ),
    "save_results": (
        "submission.to_csv('submission.csv', index=False)", "{model}.save('{file}.h5')",
        "pickle.dump({model}, open('{file}.pkl', 'wb'))", "{df}.to_csv('{file}_clean.csv')",
        "submission = pd.DataFrame({{'id': test.index, '{col}': y_pred}})",
    ),
}
_SNIPPET_LABELS = tuple(_SNIPPETS)
_COMMENTS = (
    "# Load the data", "# TODO: tune parameters", "# Plot the results", "# Split into train and test",
    "# your code here", "# check for missing values", "# Train the model", "# aesthetics",
)
_HEADINGS = (
    "## Data exploration", "# Load the data", "### Feature engineering", "## Model", "## Results",
    "Now we train the model on the training set", "## Evaluation", "# Introduction",
)
_PACKAGE_INFO = {
    "pandas": "pandas provides labelled data structures for tabular and time series data.",
    "numpy": "NumPy is the package for array computing with Python.",
    "matplotlib": "Matplotlib produces static, animated and interactive plots in Python.",
    "sklearn": "scikit-learn is a Python module for machine learning built on top of SciPy.",
}


def _packages_info(rng: random.Random, text: list[str]) -> list[str]:
    info = []
    for line in text:
        if line.startswith(("import ", "from ")):
            package = line.split()[1].split(".")[0]
            if package in _PACKAGE_INFO and rng.random() < 0.7:
                info.append(_PACKAGE_INFO[package])
    return info
