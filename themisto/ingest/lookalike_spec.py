"""How big and from which seed the look-alike inputs are: the sizes, and one random stream per part."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


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


def seed_for(seed: int, part: str) -> np.random.SeedSequence:
    # Each part draws from its own stream, so task 1's bytes do not depend on whether task 2 was asked for.
    return np.random.SeedSequence([seed, int.from_bytes(hashlib.sha256(part.encode()).digest()[:4], "big")])
