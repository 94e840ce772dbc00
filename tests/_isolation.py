"""Isolation tests skip where a developer's machine cannot isolate (no bubblewrap, not root), but in CI — which runs
as root and installs bubblewrap itself (.ci/run) — such a machine is a broken set-up: there they fail loudly."""

import os

import pytest

IN_CI = bool(os.environ.get("CI"))


def needs_isolation(available: bool, reason: str):
    """A marker: skip where `available` is false, except in CI, where the test runs and fails on its own."""
    return pytest.mark.skipif(not available and not IN_CI, reason=reason)


def isolation_unavailable(reason: str) -> None:
    """Skip this isolation test here, or fail it in CI."""
    if IN_CI:
        pytest.fail(f"an isolation test cannot run in CI, whose set-up provides root and bubblewrap: {reason}")
    pytest.skip(reason)
