"""Task 1 look-alike: the JetNet action log (sessions of actions with times and END markers, some lines dirty),
with the format and shares read off the participant's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterator

import numpy as np

from themisto.ingest.lookalike_spec import SizeSpec, seed_for

# The action vocabulary and its shares, read off the participant's bar chart of action counts.
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


# ---------------------------------------------------------------------------------------------- task 1


def jetnet_log_lines(spec: SizeSpec, seed: int, chunk_sessions: int = 4096) -> Iterator[str]:
    """Yield the JetNet log text in chunks: one `@User<id>: Action_k (dd/mm/yy | HH:MM:SS) -> … -> END (…)` line
    per session, with the kinds of dirt the participant's parser had to survive (see the module constants)."""
    # Every draw comes from one seeded stream in a fixed order, and the shipped sample's logged outcomes depend on
    # these exact bytes: the helpers are called in that order, each drawing in its own; keep both orders.
    rng = np.random.default_rng(seed_for(seed, "task1"))
    user_ids, owner, n_actions, has_end = _sessions(rng, spec)
    names, gaps, first, elapsed, duration = _actions(rng, n_actions)
    start = _starts(rng, spec, duration)
    shown = _shown_times(rng, gaps, first, elapsed, n_actions, start)
    long_arrow = rng.random(len(names)) < LONG_ARROW_SHARE
    order = rng.permutation(spec.sessions)  # sessions appear in the file in no particular order
    if order[0] < 2:  # the first line has no END (below); the two sessions that pin the dates need theirs
        order[[0, 2]] = order[[2, 0]]
    has_end[order[0]] = False
    dirt_at = _dirt(rng, order, first, n_actions)
    # Plain lists: indexing numpy arrays one element at a time is several times slower.
    log = _Log(user_ids, owner, first, n_actions, has_end, start + duration, names.tolist(), shown.tolist(),
               long_arrow.tolist(), order, dirt_at)
    clock = _Clock(FIRST_ACTION)
    for lo in range(0, spec.sessions, chunk_sessions):
        yield "".join(_line(log, s, clock) for s in order[lo:lo + chunk_sessions].tolist())


def _sessions(rng: np.random.Generator, spec: SizeSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The users' ids, and each session's user (by position in those ids), number of actions and whether it ends."""
    n = spec.sessions
    user_ids = np.sort(rng.choice(143, size=spec.users, replace=False)) if spec.users < 143 \
        else np.arange(spec.users)
    # Heavy-ish tailed activity per user; every user gets at least one session.
    weights = rng.lognormal(0.0, 0.5, size=spec.users)
    owner = np.concatenate([rng.permutation(spec.users),
                            rng.choice(spec.users, size=max(n - spec.users, 0), p=weights / weights.sum())])[:n]
    n_actions = rng.integers(SESSION_ACTIONS[0], SESSION_ACTIONS[1] + 1, size=n)
    has_end = rng.random(n) >= NO_END_SHARE
    has_end[:2] = True  # the first and last sessions by time pin the date range (`_starts`)
    return user_ids, owner, n_actions, has_end


def _actions(rng: np.random.Generator, n_actions: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each action's name, gap before it, and seconds since its session's start (the sessions' actions in a row,
    `first` the index of each session's first); each session's duration, its END included."""
    total = int(n_actions.sum())
    names = rng.choice(len(ACTION_SHARES), size=total, p=np.array(list(ACTION_SHARES.values())))
    # Gaps before each action and before END; the first action of a session has gap 0.
    gaps = rng.exponential(MEAN_ACTION_GAP_S, size=total).astype(np.int64) + 5
    first = np.concatenate([[0], np.cumsum(n_actions)[:-1]])
    gaps[first] = 0
    elapsed = np.cumsum(gaps)
    elapsed -= np.repeat(elapsed[first], n_actions)
    last = first + n_actions - 1
    end_gap = rng.exponential(MEAN_ACTION_GAP_S, size=len(n_actions)).astype(np.int64) + 5
    return names, gaps, first, elapsed, elapsed[last] + end_gap


def _starts(rng: np.random.Generator, spec: SizeSpec, duration: np.ndarray) -> np.ndarray:
    """Each session's start in seconds after FIRST_ACTION; the first two pin the real date range's two ends."""
    n = spec.sessions
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
    return start


def _shown_times(rng: np.random.Generator, gaps: np.ndarray, first: np.ndarray, elapsed: np.ndarray,
                 n_actions: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Each action's logged time in seconds after FIRST_ACTION: some (never the first two of a session) are logged
    earlier than their position."""
    shown = elapsed.copy()
    pos = np.arange(len(gaps)) - np.repeat(first, n_actions)
    jitter = (rng.random(len(gaps)) < OUT_OF_ORDER_SHARE) & (pos >= 2)
    shown[jitter] -= (rng.random(int(jitter.sum())) * 1.5 * gaps[jitter]).astype(np.int64)
    return np.maximum(shown, 0) + np.repeat(start, n_actions)


def _dirt(rng: np.random.Generator, order: np.ndarray, first: np.ndarray, n_actions: np.ndarray) -> dict[int, int]:
    """The dirty actions: index -> which of `_DIRT`."""
    total = int(n_actions.sum())
    # The real file's first CLEAN_FIRST_LINES lines had no dirt: drafts that parsed only data[:30] with a
    # strict regex succeeded. The first action of the earliest session pins the start date: keep it too.
    dirty_ok = np.ones(total, dtype=bool)
    dirty_ok[0] = False
    for s in order[:CLEAN_FIRST_LINES].tolist():
        dirty_ok[first[s]:first[s] + n_actions[s]] = False
    dirty = np.flatnonzero((rng.random(total) < DIRTY_ACTION_SHARE) & dirty_ok)
    return dict(zip(dirty.tolist(), rng.integers(0, len(_DIRT), size=len(dirty)).tolist()))


@dataclass(frozen=True)
class _Log:
    """Every draw of one log, by session (in time order) or by action (the sessions' actions in a row)."""

    user_ids: np.ndarray
    owner: np.ndarray
    first: np.ndarray
    n_actions: np.ndarray
    has_end: np.ndarray
    end_at: np.ndarray
    names: list[int]
    shown: list[int]
    long_arrow: list[bool]
    order: np.ndarray
    dirt_at: dict[int, int]


_ACTION_NAMES = list(ACTION_SHARES)


def _line(log: _Log, s: int, clock: _Clock) -> str:
    """Session `s`'s line."""
    a, b = int(log.first[s]), int(log.first[s] + log.n_actions[s])
    tokens = []
    for i in range(a, b):
        name = _ACTION_NAMES[log.names[i]]
        date, time = clock.parts(log.shown[i])
        kind = log.dirt_at.get(i)
        tokens.append(f"{name} ({date} | {time})" if kind is None else _DIRT[kind](name, date, time))
        tokens.append(" --> " if log.long_arrow[i] else " -> ")
    if log.has_end[s]:
        date, time = clock.parts(int(log.end_at[s]))
        tokens.append(f"END ({date} | {time})")
    else:
        tokens[-1] = " -> "  # the line stops after a separator, as the real file's first line does
    return f"@User{log.user_ids[log.owner[s]]}: {''.join(tokens)}\n"


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
