"""Values that differ in every run of the same cells, and the state a release vouches for without them.

A cell that reads the clock (`time.time()`, `datetime.now()`), the system's entropy (`uuid.uuid4()`, `os.urandom`, an
unseeded `numpy.random.default_rng()`, a CatBoost model, which draws an identifier when fitted), its own process
(`os.getpid()`) or a temporary file's random name binds values no replay gives back, and so do the cells that compute
from them. Their hashes cannot be made stable (memory addresses can: `themisto.runtime.agent.addresses`; unseeded draws
from `random` and numpy's global generator are seeded per kernel life: `themisto.runtime.kernel_main`), so two builds of
one log, and the scorer's rebuilt state, disagree on them whatever the code does. The rule, over a trajectory's rows in
step order: a cell *reads run-specific data* when it calls one of those sources (its names resolved through the
trajectory's imports) outside a function body, or uses a name bound to such data or to a function whose body calls one;
every variable such a cell changed (by the step's snapshot) is run-specific after it, until a cell that reads none
rebinds it. A run-specific variable is marked (`stable` false), left out of the step's `state_hash` (over the others:
the state the release vouches for), of the values a build stores, and of the scorer's check, where a difference in it is
counted apart, never matched.
"""

from __future__ import annotations

import ast
from typing import Sequence

# The calls whose result differs from run to run, by their module's dotted name (imports resolved).
SOURCES = frozenset({
    "time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.monotonic_ns",
    "time.process_time", "time.localtime", "time.gmtime", "time.ctime", "time.asctime", "time.strftime",
    "datetime.datetime.now", "datetime.datetime.today", "datetime.datetime.utcnow", "datetime.date.today",
    "pandas.Timestamp.now", "pandas.Timestamp.today", "pandas.Timestamp.utcnow", "pandas.datetime.now",
    "uuid.uuid1", "uuid.uuid4", "os.urandom", "os.getpid", "os.getppid", "os.times", "secrets.token_bytes",
    "secrets.token_hex", "secrets.token_urlsafe", "secrets.randbelow", "secrets.choice", "random.SystemRandom",
    "tempfile.mkstemp", "tempfile.mkdtemp", "tempfile.mktemp", "tempfile.NamedTemporaryFile",
    "tempfile.TemporaryDirectory", "numpy.random.default_rng", "numpy.random.RandomState", "numpy.random.seed",
    "random.seed", "random.Random", "socket.gethostname",
    # A CatBoost model draws a random `model_guid` when it is fitted, inside the model's bytes (measured: two fits
    # of one model on the same data pickle apart there, and the identifier's length moves the bytes after it).
    "catboost.CatBoost", "catboost.CatBoostClassifier", "catboost.CatBoostRegressor", "catboost.CatBoostRanker",
})
# Sources that draw from the system only when called without a seed (`default_rng(0)` is reproducible).
_SEEDLESS = frozenset({"numpy.random.default_rng", "numpy.random.RandomState", "numpy.random.seed", "random.seed",
                       "random.Random"})
# Texts a date parser reads as the clock (`pd.to_datetime("now")`, `np.datetime64("today")`).
_CLOCK_TEXTS = frozenset({"now", "today"})
_CLOCK_PARSERS = frozenset({"pandas.to_datetime", "pandas.Timestamp", "numpy.datetime64", "pandas.datetime"})


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The dotted name an expression names (`dt.datetime.now` -> `datetime.datetime.now`), imports resolved."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    head = aliases.get(node.id, node.id)
    return ".".join([head, *reversed(parts)])


def _reads_source(call: ast.Call, aliases: dict[str, str]) -> bool:
    name = _dotted(call.func, aliases)
    if name is None:
        return False
    if name in _CLOCK_PARSERS:
        return any(isinstance(a, ast.Constant) and str(a.value).strip().lower() in _CLOCK_TEXTS for a in call.args)
    if name in _SEEDLESS:
        return not call.args and not any(k.arg in ("seed", "x", "a") for k in call.keywords)
    return name in SOURCES


class _Cell(ast.NodeVisitor):
    """What one cell does with run-specific data: whether it calls a source outside a function body, the functions
    and classes it defines that call one, the names it loads, and the imports it adds."""

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases, self.calls_source, self.loads = aliases, False, set()
        self.source_definitions: set[str] = set()
        self._inside: list[str] = []  # the top-level definitions being walked

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            for alias in node.names:
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _definition(self, node) -> None:
        self._inside.append(node.name)
        self.generic_visit(node)
        self._inside.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _definition

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._inside.append("<lambda>")
        self.generic_visit(node)
        self._inside.pop()

    def visit_Call(self, node: ast.Call) -> None:
        if _reads_source(node, self.aliases):
            if self._inside:
                if self._inside[0] != "<lambda>":
                    self.source_definitions.add(self._inside[0])
                else:
                    self.calls_source = True  # a lambda is bound to whatever name the cell gives it: taint them all
            else:
                self.calls_source = True
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.loads.add(node.id)


def run_specific_names(rows: Sequence[dict]) -> list[frozenset[str]]:
    """Per row of one trajectory (in step order), the variables whose value after the step is run-specific."""
    from themisto.ingest.compiles import parse_cell

    aliases: dict[str, str] = {}
    tainted: set[str] = set()
    sources: set[str] = set()  # the user's functions and classes that call a source
    before: dict[str, str] = {}
    out = []
    for row in rows:
        after = {v["name"]: v["hash"] for v in row.get("variables") or []}
        if row.get("restarted_before") or row.get("kernel_restarted"):
            tainted, sources, before = set(), set(), {}  # a fresh kernel: nothing of the last life is left
        changed = {name for name, digest in after.items() if before.get(name) != digest}
        tree = parse_cell(row.get("replayed_code") or row.get("code") or "")
        cell = _Cell(aliases)
        if tree is not None:
            cell.visit(tree)
        if cell.calls_source or cell.loads & (tainted | sources):
            tainted |= changed
        else:
            tainted -= changed
        sources = (sources - changed) | (cell.source_definitions & set(after))
        tainted &= set(after)
        before = after
        out.append(frozenset(tainted))
    return out


def mark_run_specific(rows: Sequence[dict]) -> tuple[list[dict], dict[str, int]]:
    """The rows (copies where they change) with every trajectory's run-specific variables marked (each variable's
    `stable`), each row's `state_hash` over the others, and their values kept out of what a build stores; and what
    was marked (variables, steps, trajectories)."""
    from themisto.runtime.agent.hashing import state_hash
    from themisto.release.tasks import group_by_kernel

    counts = {"variables": 0, "steps": 0, "trajectories": 0}
    marked_rows: dict[int, dict] = {}
    for kernel_rows in group_by_kernel(rows).values():
        names_per_step = run_specific_names(kernel_rows)
        counts["trajectories"] += any(names_per_step)
        for row, names in zip(kernel_rows, names_per_step):
            variables = [dict(v, stable=v["name"] not in names) for v in row.get("variables") or []]
            new = dict(row, variables=variables)
            if names:
                counts["steps"] += 1
                counts["variables"] += len(names)
                if row.get("state_hash") is not None:
                    new["state_hash"] = state_hash({v["name"]: v["hash"] for v in variables if v["stable"]})
                if row.get("stored_values") is not None:
                    stored = dict(row["stored_values"])
                    unstored = {item["name"] for item in stored["unstored"]}
                    stored["unstored"] = sorted(list(stored["unstored"]) + [
                        {"name": name, "reason": RUN_SPECIFIC_REASON} for name in sorted(names - unstored)],
                        key=lambda item: item["name"])
                    new["stored_values"] = stored
            marked_rows[id(row)] = new
    return [marked_rows.get(id(row), row) for row in rows], counts


def run_specific_note(counts: dict[str, int]) -> str:
    """The build's note on what it marked run-specific."""
    return (f"run-specific: {counts['variables']:,} variable records of {counts['steps']:,} steps in "
            f"{counts['trajectories']:,} trajectories were computed from the clock, the system's entropy or the "
            "process (themisto.release.run_specific): marked `stable: false`, left out of the state hash, the stored "
            "values and the scorer's check")


RUN_SPECIFIC_REASON = "run-specific: computed from the clock, the system's entropy or the process (differs each run)"
