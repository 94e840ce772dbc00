"""The `delta` context mode's change lists: after each history cell, what it changed in the user's variables (names
added `+`, removed `-`, changed `~`: rebound or modified in place), each with its kind and the old -> new facts a
developer looks at (shape, length, dtype, columns, a short repr), then the cell's output or error.

A cell's changes compare the snapshot after its step with the one after the cell before (both joined from the
release's `trajectories` config by `themisto.generation.release_rows`, as for `trace`): nothing is replayed. A
trajectory's first cell starts from an empty namespace, so its list is the whole (small) namespace it made; so is a
cell's after a kernel restart. Names come in `themisto.generation.variable_ranking`'s order (`trace_names`), and the
prompt budget cuts them as it cuts the `variables` mode's runtime section: each value's text first (repr characters,
then column names), then the lowest ranked names from every list, each list saying how many changes it left out. A
repr is short here (`REPR_CHARS` at most) and an error cell's output stops at its error message (the traceback left
out): the mode shows what changed, not the whole state. `DeltaSettings.cells` keeps only the last n cells (default:
as many as the budget allows).

>>> before = {"n": {"name": "n", "type": "builtins.int", "hash": "a", "repr": "3"}}
>>> after = [{"name": "n", "type": "builtins.int", "hash": "b", "repr": "4"},
...          {"name": "xs", "type": "builtins.list", "hash": "c", "repr": "[1, 2]", "len": 2}]
>>> print(change_block(before, after, ["n", "xs"], Cut(1, 2)))
Changed:
~ n: int = 3 -> 4
+ xs: list; len 2 = [1, 2]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from themisto.errors import InputError
from themisto.generation.budget import Cut, Fields

CHANGED_LABEL = "Changed:"
REPR_CHARS = 120  # a change's repr before any cut of the budget's (which may cut it to 40, then 0)
TRACEBACK_LEFT_OUT = "(traceback left out)"
DELTA_INTRO = ("After each cell's code, what it changed in the user's variables, the most relevant first: \"+ name\" "
               "added, \"- name\" removed, \"~ name\" changed (rebound or modified in place), each with its kind and "
               "old -> new shape, length, dtype, columns and a short repr; then its output or error.")
# How the mode differs from the budget's general rule, as its template's text states it (so its sha256 changes with it).
DELTA_RULE = (f"each change's repr is at most {REPR_CHARS} characters before the budget's cuts; an error cell's output "
              f"stops at its error message, marked {TRACEBACK_LEFT_OUT!r}; a change list leaves out the changes to "
              "variables the budget dropped and says how many; with --delta-cells N only the last N history cells "
              "are shown")
_RESTARTED = "Changed (the kernel was restarted before it: every name is new):"
_UNKNOWN_BEFORE = "Changed (no snapshot of the state before it: every name it left is listed):"
_NOT_RECORDED = f"{CHANGED_LABEL} (not recorded: the release has no snapshot of this step)"


class DeltaError(InputError):
    """A `delta` setting out of range: `field` (its dotted path in an example spec) given `value`, `why`; the message
    names the option as `themisto generate` spells it."""

    def __init__(self, field: str, value, why: str, option: str):
        super().__init__(f"--{option} {value!r}: {why}")
        self.field, self.value, self.why = field, value, why


@dataclass(frozen=True)
class DeltaSettings:
    """The `delta` mode's settings: the last `cells` history cells shown (None: as many as the budget allows)."""

    cells: int | None = None

    def __post_init__(self) -> None:
        if self.cells is not None and (isinstance(self.cells, bool) or not isinstance(self.cells, int)
                                       or self.cells < 1):
            raise DeltaError("delta.cells", self.cells, "must be a whole number of at least 1", "delta-cells")

    def record(self) -> dict:
        """The settings as run.json records them."""
        return asdict(self)

    def history(self, cells: int) -> int:
        """How many of a row's `cells` history cells the prompt may show before the budget cuts."""
        return cells if self.cells is None else min(cells, self.cells)


def kind(variable: dict) -> str:
    """A variable's kind: its type's own name (`pandas.core.frame.DataFrame` -> `DataFrame`)."""
    return (variable.get("type") or "object").rsplit(".", 1)[-1]


def _shape(variable: dict) -> str | None:
    shape = variable.get("shape")
    if not shape:
        return None
    return f"({', '.join(str(s) for s in shape)}{',' if len(shape) == 1 else ''})"


def _moved(label: str, old: object, new: object) -> str | None:
    """`label new`, or `label old -> new` where it moved; None where neither side has it."""
    if old is None and new is None:
        return None
    if old == new or old is None:
        return f"{label} {new}".strip() if new is not None else None
    return f"{label} {old} -> {new}".strip() if new is not None else f"{label} {old} -> none".strip()


def _columns(old: dict | None, new: dict, limit: int) -> str | None:
    """The columns of an added variable, or those a change added and removed (`+[…] -[…]`), `limit` names each."""
    after = list(new.get("columns") or [])
    if old is None:
        if not after:
            return None
        if limit <= 0:
            return f"{len(after)} columns"
        return "columns [" + ", ".join(after[:limit]) + (", ..." if len(after) > limit else "") + "]"
    before = list(old.get("columns") or [])
    if before == after:
        return None
    if limit <= 0:
        return f"columns {len(before)} -> {len(after)}"
    gained, lost = [c for c in after if c not in before], [c for c in before if c not in after]
    parts = [f"{sign}[" + ", ".join(names[:limit]) + (", ..." if len(names) > limit else "") + "]"
             for sign, names in (("+", gained), ("-", lost)) if names]
    return "columns " + (" ".join(parts) if parts else "reordered")


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def _entry(sign: str, name: str, old: dict | None, new: dict | None, fields: Fields) -> str:
    """One change: `+`/`~` with the kind and the facts (old -> new where they moved) and the repr, `-` with the kind
    it had. A one-line repr goes on the line (`= old -> new`), a longer one (the new value's) below it."""
    if new is None:
        return f"- {name}: {kind(old or {})}"
    facts = [_moved("", kind(old) if old else None, kind(new))]
    shape = _moved("shape", _shape(old) if old else None, _shape(new))
    facts.append(shape if shape else _moved("len", old.get("len") if old else None, new.get("len")))
    facts.append(_moved("dtype", old.get("dtype") if old else None, new.get("dtype")))
    facts.append(_columns(old, new, fields.columns))
    line = f"{sign} {name}: " + "; ".join(f for f in facts if f)
    text, limit = new.get("repr") or "", min(fields.repr_chars, REPR_CHARS)
    if limit <= 0 or not text:
        return line
    before = (old.get("repr") or "") if old else ""
    if "\n" not in text and "\n" not in before:
        shown = _bounded(text, limit)
        return f"{line} = {_bounded(before, limit)} -> {shown}" if before and before != text else f"{line} = {shown}"
    return f"{line}\n  " + _bounded(text, limit).replace("\n", "\n  ")


def _same(old: dict, new: dict) -> bool:
    """Whether a name kept its value: the same content hash, or where either could not be hashed, the same facts."""
    digests = old.get("hash"), new.get("hash")
    if all(isinstance(d, str) and d and not d.startswith("unhashable") for d in digests):
        return digests[0] == digests[1]
    return all(old.get(k) == new.get(k) for k in ("type", "repr", "shape", "len", "dtype", "columns"))


def change_block(before: dict[str, dict] | None, after: list[dict], names: list[str], cut: Cut, *,
                 restarted: bool = False) -> str:
    """One cell's change list: `before` is the state it started from by name (None: not recorded), `after` the
    state it left; `names` (`trace_names`) of which the budget keeps the first `cut.variables`, in that order."""
    now = {v["name"]: v for v in after}
    was = before or {}
    changes = {name: ("+", None, v) for name, v in now.items() if name not in was}
    changes.update({name: ("~", was[name], v) for name, v in now.items() if name in was and not _same(was[name], v)})
    changes.update({name: ("-", v, None) for name, v in was.items() if name not in now})
    rank = {name: i for i, name in enumerate(names)}
    shown = [name for name in sorted(changes, key=lambda n: (rank.get(n, len(rank)), n))
             if rank.get(name, len(rank)) < cut.variables]
    label = _RESTARTED if restarted else _UNKNOWN_BEFORE if before is None else CHANGED_LABEL
    lines = [_entry(changes[name][0], name, changes[name][1], changes[name][2], cut.fields) for name in shown]
    hidden = len(changes) - len(shown)
    if hidden:
        lines.append(f"(and {hidden} more change{'s' if hidden > 1 else ''}, to variables ranked lower)")
    if not changes:
        return f"{CHANGED_LABEL} nothing"
    return "\n".join([label, *lines])


def change_blocks(row: dict, history: list[dict], names: list[str], cut: Cut) -> list[str]:
    """The change list of each shown history cell (the last `len(history)` of the row's), each compared with the
    state the cell before left (the row's `state_before_history` for its first; empty after a restart)."""
    first_state = row.get("state_before_history")
    before = None if first_state is None else {v["name"]: v for v in first_state}
    all_cells = list(row.get("history") or [])
    blocks = []
    for cell in all_cells:
        restarted = bool(cell.get("restarted_before"))
        if restarted:
            before = {}
        state = cell.get("state_after")
        if state is None:
            blocks.append(_NOT_RECORDED)
            before = None
            continue
        blocks.append(change_block(before, state, names, cut, restarted=restarted and bool(state)))
        before = {v["name"]: v for v in state}
    return blocks[len(all_cells) - len(history):]


def without_traceback(cell: dict) -> str:
    """An error cell's output up to its error message (`ename: evalue`, as the release's outputs write it), the
    traceback left out; any other cell's output, or one whose message is not found in it, as it is."""
    output = cell.get("output") or ""
    ename, evalue = cell.get("ename"), cell.get("evalue")
    if cell.get("status") != "error" or not ename:
        return output
    head = f"{ename}: {evalue or ''}"
    at = output.rfind(head)
    if at < 0 or not output[at + len(head):].strip():
        return output
    return f"{output[:at + len(head)]}\n{TRACEBACK_LEFT_OUT}"
