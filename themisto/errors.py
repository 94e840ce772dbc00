"""The one base class of input errors: what a user can fix, as opposed to a bug in Themisto.

Every stage's own error for bad input (a malformed log line, an unknown example id, a run folder written against
another release…) derives from `InputError`, and its message names the file and line or the example id. The command
line prints these as one line and exits 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Input a user can fix; the message names the file and line, or the example id, it concerns."""
