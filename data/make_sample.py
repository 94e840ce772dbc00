"""Author and generate the sample JuNE trajectories shipped in `data/sample/`.

The trajectories are written by the Themisto authors (not study data): each is a script of cell runs with the
edits, typos, re-runs and restarts of real development. `generate` executes every script for real in a fresh
Jupyter kernel, inside a temporary copy of the look-alike workspace (`themisto.ingest.workspace.write_workspace`,
seed 0, size "small"), and writes the JuNE events from what actually happened, so every logged outcome is
true by construction. Timestamps, think-time gaps and ids come from seeded generators: regeneration is
byte-identical on the same library versions.

Run `python data/make_sample.py` to regenerate, `python data/make_sample.py --check` to verify the shipped files.

How output sizes are measured (the extension logged only `{output_type, size}`): a stream's size is the length
of its text (consecutive outputs of the same stream merged, as the notebook front end shows them); an
`execute_result` or `display_data` is the length of its `image/png` data (base64 text) when it has one, else of
its `text/plain`, else of its largest mime value; an error's size is 0, as in the real logs. This reproduces the
magnitudes of the real logs (DataFrames of a few KB, plots of tens of KB).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import random
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "sample"
SEED = 0
WORKSPACE_SEED = 0
WORKSPACE_SIZE = "small"
CELL_TIMEOUT_S = 60.0
INTERRUPT_AFTER_S = 1.0
TEMPLATE_CELL = (
    "# # Do not forget to check if your notebook log collection plugin is working\n"
    "# from mining_extension import check_logging\n"
    '# check_logging("PASTE FULL URL HERE")'
)
# The collector URL of the check-logging habit; `.invalid` can never resolve, and the workspace's stand-in
# `mining_extension` never opens a connection anyway.
COLLECTOR_URL = "http://collector.invalid:9999"


class SampleError(RuntimeError):
    """Authoring or generation went wrong; the message names the trajectory and the step."""


# --------------------------------------------------------------------------------------------------------------
# Authoring: a trajectory is a list of steps built with a small recorder.


@dataclass(frozen=True)
class Step:
    """One thing the developer did: run a cell, (re)start or interrupt the kernel, delete a cell."""

    action: str  # "run" | "restart" | "delete"
    cell: str = ""  # the authored cell name (ids are drawn at generation time)
    code: str = ""
    expect: str | None = None  # authored intent: None = runs fine, else the ename it must raise
    interrupt: bool = False  # the developer interrupts it (a run that would not finish)


@dataclass
class Script:
    """An authored trajectory: a notebook, its template cells and the developer's steps."""

    name: str
    notebook: str
    start: str  # ISO-8601 UTC of the save_notebook event
    steps: list[Step] = field(default_factory=list)
    # The current source of each cell while authoring; every notebook starts as the task template did.
    sources: dict[str, str] = field(default_factory=lambda: {"template": TEMPLATE_CELL})

    def run(self, cell: str, code: str | None = None, *, edit: tuple[str, str] | list[tuple[str, str]] | None = None,
            expect: str | None = None, interrupt: bool = False) -> "Script":
        """Run `cell` with new `code`, with its current source edited (`edit=(old, new)`), or unchanged."""
        if code is None:
            if cell not in self.sources:
                raise SampleError(f"{self.name}: step {len(self.steps)}: cell {cell!r} has no source yet")
            code = self.sources[cell]
            edits = [edit] if isinstance(edit, tuple) else list(edit or [])
            for old, new in edits:
                if old not in code:
                    raise SampleError(f"{self.name}: step {len(self.steps)}: {old!r} is not in cell {cell!r}")
                code = code.replace(old, new, 1)
        elif edit is not None:
            raise SampleError(f"{self.name}: step {len(self.steps)}: give code or edit, not both")
        self.sources[cell] = code
        self.steps.append(Step("run", cell, code, expect, interrupt))
        return self

    def restart(self) -> "Script":
        self.steps.append(Step("restart"))
        return self

    def delete(self, cell: str) -> "Script":
        if cell not in self.sources:
            raise SampleError(f"{self.name}: step {len(self.steps)}: cannot delete unknown cell {cell!r}")
        self.steps.append(Step("delete", cell, self.sources.pop(cell)))
        return self


# --------------------------------------------------------------------------------------------------------------
# Execution: what really happened when a step ran in the kernel.


@dataclass
class Outcome:
    """The real result of one run: outputs as (output_type, size) and the error, if any."""

    outputs: list[tuple[str, int]]
    ename: str | None = None
    evalue: str | None = None


def _bundle_size(data: dict) -> int:
    if "image/png" in data:
        return len(data["image/png"])
    if "text/plain" in data:
        return len(data["text/plain"])
    return max((len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values()), default=0)


def _kernel_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    # Reproducible outputs: fixed str hashing (set/dict order), single-threaded BLAS (bit-stable sums).
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


class Runner:
    """One real kernel in a workspace copy; runs cells and reports what happened."""

    def __init__(self, cwd: Path):
        from jupyter_client import KernelManager

        # ipc socket paths are relative to the cwd unless made absolute, and the kernel runs elsewhere.
        self.sockets = tempfile.mkdtemp(prefix="themisto-ipc-")
        self.km = KernelManager(transport="ipc", ip=os.path.join(self.sockets, "kernel"))
        self.km.start_kernel(cwd=str(cwd), env=_kernel_env())
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def close(self) -> None:
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        finally:
            shutil.rmtree(self.sockets, ignore_errors=True)

    def restart(self) -> None:
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, *, interrupt: bool = False) -> Outcome:
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        if interrupt:
            time.sleep(INTERRUPT_AFTER_S)
            self.km.interrupt_kernel()
        outcome = Outcome(outputs=[])
        streams: list[list] = []  # [name, text] pairs in output order, merged while consecutive
        deadline = time.monotonic() + CELL_TIMEOUT_S
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no idle status within {CELL_TIMEOUT_S} s") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                break
            if kind == "stream":
                if streams and streams[-1][0] == content["name"] and outcome.outputs[-1][0] == "stream":
                    streams[-1][1] += content["text"]
                    outcome.outputs[-1] = ("stream", len(streams[-1][1]))
                else:
                    streams.append([content["name"], content["text"]])
                    outcome.outputs.append(("stream", len(content["text"])))
            elif kind in ("execute_result", "display_data"):
                outcome.outputs.append((kind, _bundle_size(content["data"])))
            elif kind == "error":
                outcome.ename, outcome.evalue = content["ename"], content["evalue"]
                outcome.outputs.append(("error", 0))
            elif kind == "clear_output":
                outcome.outputs.clear()
                streams.clear()
        self.kc.get_shell_msg(timeout=CELL_TIMEOUT_S)  # the execute_reply, so the next run starts clean
        return outcome


# --------------------------------------------------------------------------------------------------------------
# Writing: JuNE events from the steps and their real outcomes.


def _uuid4(rng: random.Random) -> uuid.UUID:
    return uuid.UUID(int=rng.getrandbits(128), version=4)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class LogWriter:
    """Builds the event list of one trajectory with the real logs' field order, clock and cell positions."""

    script: Script
    rng: random.Random
    kernel_id: str = field(init=False)
    session_id: str = field(init=False)
    clock: datetime = field(init=False)
    events: list[dict] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # cell names in notebook order
    ids: dict[str, str] = field(default_factory=dict)
    selected: int = 0

    def __post_init__(self) -> None:
        self.kernel_id = str(_uuid4(self.rng))
        self.session_id = str(_uuid4(self.rng))
        self.clock = datetime.fromisoformat(self.script.start.replace("Z", "+00:00"))
        self._new_cell("template")

    def _new_cell(self, name: str) -> None:
        self.ids[name] = _uuid4(self.rng).hex

    def _advance(self, low: float, high: float) -> None:
        self.clock += timedelta(milliseconds=int(self.rng.uniform(low, high) * 1000))

    def _think(self) -> None:
        # Mostly quick re-runs and short edits, now and then a long read of the output or the docs.
        r = self.rng.random()
        if r < 0.55:
            self._advance(2, 25)
        elif r < 0.9:
            self._advance(25, 150)
        else:
            self._advance(150, 900)

    def _event(self, event: str, cell: str | None, source: str, output: object = None, *,
               num: int | None = -1) -> None:
        cell_index = self.ids[cell] if cell else ""
        cell_num = self.selected if num == -1 else num
        cell_type = "code" if cell else ""
        if event == "error":  # the real error events carry neither ip_address nor cell_output
            self.events.append({"time": _stamp(self.clock), "kernel_id": self.kernel_id,
                                "notebook_name": self.script.notebook, "event": event, "cell_index": cell_index,
                                "cell_num": cell_num, "cell_source": source, "cell_type": cell_type,
                                "session_id": self.session_id})
            return
        self.events.append({"ip_address": None, "time": _stamp(self.clock), "kernel_id": self.kernel_id,
                            "notebook_name": self.script.notebook, "event": event, "cell_index": cell_index,
                            "cell_num": cell_num, "cell_source": source, "cell_type": cell_type,
                            "session_id": self.session_id, "cell_output": output})

    def save_notebook(self) -> None:
        cells = [{"id": self.ids["template"], "cell_type": "code", "source": TEMPLATE_CELL, "execution_count": None}]
        self.order = ["template"]
        self.events.append({"ip_address": None, "time": _stamp(self.clock), "kernel_id": self.kernel_id,
                            "notebook_name": self.script.notebook, "event": "save_notebook",
                            "cell_source": json.dumps(cells, indent=2, ensure_ascii=False),
                            "session_id": self.session_id})

    def run(self, step: Step, outcome: Outcome) -> None:
        if step.cell not in self.ids or step.cell not in self.order:
            # A new cell: created below the selected one, typed into, then run.
            self._new_cell(step.cell)
            position = min(self.selected + 1, len(self.order))
            self.order.insert(position, step.cell)
            self._advance(1, 6)
            self._event("create", step.cell, "", num=self.selected)
            self.selected = position
        self._think()
        position = self.order.index(step.cell)
        self.selected = position
        duration = (0.05, 2.0)
        if step.interrupt:  # the developer waits a while for a run that never ends
            duration = (8.0, 40.0)
        outputs = [{"output_type": kind, "size": size} for kind, size in outcome.outputs]
        if outcome.ename is None:
            self._event("execute", step.cell, step.code, None)
            self._advance(*duration)
        else:
            # The extension logged no `execute` for a run that raised: only its finished event and the error.
            self._advance(*duration)
            if step.interrupt:
                self._event("kernel_interrupting", None, "", None)
                self._advance(0.01, 0.08)
        if self.rng.random() < 0.7:  # shift-enter moves the selection down; ctrl-enter leaves it
            self.selected = min(position + 1, len(self.order) - 1)
        self._event("finished_execute", step.cell, step.code, _compact(outputs))
        if outcome.ename is not None:
            self._event("error", step.cell,
                        _compact({"output_type": "error", "ename": outcome.ename, "evalue": outcome.evalue}))

    def restart(self) -> None:
        self._think()
        self._event("kernel_restarting", None, "", None)
        self._advance(2, 6)

    def delete(self, step: Step) -> None:
        self._think()
        position = self.order.index(step.cell)
        self.order.pop(position)
        self._event("delete", step.cell, step.code, None, num=None)
        self.selected = min(position, len(self.order) - 1)


def _check_outcome(script: Script, index: int, step: Step, outcome: Outcome) -> None:
    if outcome.ename != step.expect:
        got = "ran fine" if outcome.ename is None else f"raised {outcome.ename}: {outcome.evalue}"
        want = "to run fine" if step.expect is None else f"to raise {step.expect}"
        raise SampleError(f"{script.name}: step {index} (cell {step.cell!r}) was authored {want} but {got}\n"
                          f"--- code ---\n{step.code}")


def play(script: Script, workspace: Path, seed: int = SEED) -> tuple[str, list[dict]]:
    """Execute `script` in a kernel whose cwd is `workspace`; return its kernel id and JuNE events."""
    writer = LogWriter(script, random.Random(f"{seed}:{script.name}"))
    writer.save_notebook()
    runner = Runner(workspace)
    try:
        for index, step in enumerate(script.steps):
            if step.action == "restart":
                runner.restart()
                writer.restart()
            elif step.action == "delete":
                writer.delete(step)
            else:
                try:
                    outcome = runner.run(step.code, interrupt=step.interrupt)
                except TimeoutError as exc:
                    raise SampleError(f"{script.name}: step {index} (cell {step.cell!r}): {exc}") from exc
                _check_outcome(script, index, step, outcome)
                writer.run(step, outcome)
    finally:
        runner.close()
    return writer.kernel_id, writer.events


# --------------------------------------------------------------------------------------------------------------
# The authored trajectories. `expect=` states what the author meant to happen; generation stops if the kernel
# disagrees, so a change of workspace or library that alters an outcome is noticed instead of logged silently.

CHECK = f'from mining_extension import check_logging\ncheck_logging("{COLLECTOR_URL}")'
T1_PATH = "./data/task1/jetnet_logs/jetnet_logs.txt"


def task1_split() -> Script:
    """Task 1 by string splitting: slow start on the parsing, metrics one by one, a restart, then plots."""
    s = Script("task1-split", "task1.ipynb", "2023-05-08T09:12:41.318Z")
    s.run("template", CHECK)
    s.run("template")
    s.run("imports", "import pandas as pd\nimport numpy as np")
    s.run("read", 'PATH = "./data/task1/jetnet_logs/jetnet_log.txt"\nlines = open(PATH).readlines()\nlen(lines)',
          expect="FileNotFoundError")
    s.run("read", edit=("jetnet_log.txt", "jetnet_logs.txt"))
    s.run("read", edit=("len(lines)", "print(len(lines))\nprint(lines[0])"))
    s.run("read", edit=("print(lines[0])", "print(lines[0][:300])"))
    s.run("first", 'line = lines[0].strip()\nuser, rest = line.split(":")\nuser', expect="ValueError")
    s.run("first", edit=('split(":")', 'split(": ", 1)'))
    s.run("first", edit=(", 1)\nuser", ", 1)\nactions = rest.split(\" -> \")\nactions[:3], actions[-1]"))
    s.run("first", edit=("actions[:3], actions[-1]",
                         'name, ts = actions[0].split(" (")\nts = ts.rstrip(")")\nname, ts'))
    s.run("first", edit=('name, ts = actions[0].split(" (")\nts = ts.rstrip(")")\nname, ts', "actions[:12]"))
    s.run("imports", edit=("import numpy as np", "import numpy as np\nimport re"))
    s.run("first", edit=([('actions = rest.split(" -> ")', 'actions = re.split(r" -+> ", rest)'),
                          ("\nactions[:12]", '\nname, ts = actions[0].split(" (")\nts = ts.rstrip(")")\nname, ts')]))
    s.run("first", edit=(')")\nname, ts', ')")\npd.to_datetime(ts, format="%d/%m/%y %H:%M:%S")'), expect="ValueError")
    s.run("first", edit=('"%d/%m/%y %H:%M:%S"', '"%d/%m/%y | %H:%M:%S"'))
    s.run("parse", "rows = []\nfor line in lines:\n    user, rest = line.strip().split(\": \", 1)\n"
                   "    for action in re.split(r\" -+> \", rest):\n        name, ts = action.split(\" (\")\n"
                   "        rows.append((user, name, ts.rstrip(\")\")))\nlen(rows)", expect="ValueError")
    s.run("parse", edit=("len(rows)", "len(rows), rows[-1], action"), expect="ValueError")
    s.run("parse", edit=("        name, ts = action.split(\" (\")",
                         "        if \" (\" not in action:\n            print(\"skip\", user, action)\n"
                         "            continue\n        name, ts = action.split(\" (\")"))
    s.run("parse", edit=("rows[-1], action", "rows[0]"))
    s.run("parse", edit=("for line in lines:", "for session, line in enumerate(lines):"))
    s.run("parse", edit=("rows.append((user, name,", "rows.append((user, session, name,"))
    s.run("frame", 'df = pd.DataFrame(rows, columns=["user_id", "session", "action_name", "action_time"])\n'
                   "df.head()")
    s.run("frame", edit=("df.head()", 'df["action_time"] = pd.to_datetime(df["action_time"], '
                                      'format="%d/%m/%y | %H:%M:%S")\ndf.head()'), expect="ValueError")
    s.run("frame", edit=('format="%d/%m/%y | %H:%M:%S")', 'format="%d/%m/%y | %H:%M:%S", errors="coerce")'))
    s.run("peek", "df[df.action_time.isna()]")
    s.run("peek", "df.action_name.value_counts()")
    s.run("frame", edit=("\ndf.head()", '\ndf = df[df.action_name != "END"].dropna()\ndf.head()'))
    s.run("peek", "df.dtypes")
    s.run("peek", "df.shape")
    s.run("peek", "df.iloc[len(df)]", expect="IndexError")
    s.run("peek", "df.iloc[len(df) - 1]")
    s.run("sessions", 'first = df.groupby("session")["action_time"].min().sort_values()\nfirst.head()')
    s.run("sessions", edit=("first.head()", 'df["session_num"] = df["session"].map(first.rank())\n'
                                             'df.head()'))
    s.run("sessions", edit=("first.rank()", 'first.rank(method="first").astype(int) - 1'))
    s.run("sessions", edit=("df.head()", 'df = df.drop(columns="session")\n'
                                         'df = df[["user_id", "session_num", "action_time", "action_name"]]\n'
                                         'df.sort_values("action_time").head()'))
    s.run("sessions", expect="KeyError")  # re-run: the column it maps from was dropped by the first run
    s.run("frame")
    s.run("sessions")
    s.run("peek", "df.session_num.min(), df.session_num.max(), df.session_num.nunique()")
    s.run("m1", 'df.groupby("user_id").size().avg()', expect="AttributeError")
    s.run("m1", 'df.groupby("user_id").size().mean()')
    s.run("m1", 'per_user = df.groupby("user_id").size().mean()\n"mean actions per user: " + per_user',
          expect="TypeError")
    s.run("m1", edit=('"mean actions per user: " + per_user', 'print("mean actions per user:", per_user)'))
    s.run("m2", 'df["date"] = df.action_time.dt.date\n'
                'per_day = df.groupby(["user_id", "date"]).size().groupby("user_id").mean()\nper_day.head()')
    s.run("m2", edit=("per_day.head()", "print(per_day.mean())"))
    s.run("m3", "def has_triple(names):\n    names = list(names)\n"
                "    return any(names[i] == names[i + 1] == names[i + 2] for i in range(len(names)))\n\n"
                'triples = df.sort_values("action_time").groupby("session_num")["action_name"].apply(has_triple)\n'
                "triples.mean()", expect="IndexError")
    s.run("m3", edit=("range(len(names))", "range(len(names) - 2)"))
    s.run("m3")
    s.restart()
    s.run("m3", expect="NameError")  # the developer forgot that the restart wiped everything
    s.run("imports", edit=("import numpy as np", "import numpy as np\nimport matplotlib.pyplot as plt"))
    s.run("read")
    s.run("parse")
    s.run("frame")
    s.run("sessions")
    s.run("m1")
    s.run("m2")
    s.run("m3")
    s.run("m4", 'd = df.sort_values(["session_num", "action_time"])\n'
                'd["delta"] = d.groupby(["session_num", "action_name"])["action_time"].diff()\n'
                'd["delta"].quantile(0.95)')
    s.run("m4", edit=('d["delta"].quantile(0.95)', 'd["delta"].dropna().quantile(0.95)'))
    s.run("m4", edit=('d["delta"].dropna().quantile(0.95)',
                      'q95 = d["delta"].dropna().quantile(0.95)\nprint(q95, q95.total_seconds() / 3600, "h")'))
    s.run("m5", "from scipy import stats\n"
                'df["weekday"] = df.action_time.dt.dayofweek\n'
                'daily = df.groupby(["date", "weekday"]).size().reset_index(name="n")\n'
                'daily.groupby("weekday")["n"].mean()')
    s.run("m5", edit=('daily.groupby("weekday")["n"].mean()',
                      'stats.kruskal(*[g["n"] for _, g in daily.groupby("weekday")])'))
    s.run("m5b", 'weekend = daily["weekday"] >= 5\nstats.mannwhitneyu(daily.n[weekend], daily.n[~weekend])')
    s.run("m5b", edit=("stats.mannwhitneyu(daily.n[weekend], daily.n[~weekend])",
                       'print(daily.n[weekend].mean(), daily.n[~weekend].mean())\n'
                       'stats.mannwhitneyu(daily.n[weekend], daily.n[~weekend])'))
    s.run("p1", 'by_day = df.groupby(["date", "action_name"]).size().unstack(fill_value=0)\nby_day.plot()')
    s.run("p1", edit=("by_day.plot()", "by_day.plot(figsize=(12, 5))\nplt.title(\"actions per day\")"))
    s.run("p2", "df.action_name.value_counts().plot(kind=\"bar\"", expect="SyntaxError")
    s.run("p2", edit=('kind="bar"', 'kind="bar")'))
    s.run("p2", edit=('kind="bar")', 'kind="bar")\nplt.show()'))
    s.run("p3", 'nxt = d.groupby("session_num")["action_name"].shift(-1)\n'
                "pairs = pd.crosstab(d.action_nam, nxt)\npairs", expect="AttributeError")
    s.run("p3", edit=("d.action_nam,", "d.action_name,"))
    s.run("p3", edit=("nxt)\npairs", "nxt)\nplt.imshow(pairs)\nplt.colorbar()"))
    s.run("p3", edit=("plt.colorbar()", "plt.colorbar()\nplt.xticks(range(len(pairs.columns)), pairs.columns, "
                                        "rotation=90)\nplt.yticks(range(len(pairs.index)), pairs.index)\nplt.show()"))
    s.run("p4", 'counts = df.user_id.value_counts()\ntop = counts[counts >= counts.quantile(0.8)].index\nlen(top)')
    s.run("p4", edit=("len(top)", 'df[df.user_id.isin(top)].groupby("date").size().plot(figsize=(12, 4))\n'
                                  'plt.title("top 20% users")\nplt.show()'))
    s.run("m1")
    return s


def task1_regex() -> Script:
    """Task 1 with regular expressions: cleaning dirty actions, an endless loop interrupted, plots in subplots."""
    s = Script("task1-regex", "task1.ipynb", "2023-05-09T13:04:09.517Z")
    s.run("template")
    s.run("imp", "import re\nimport pandas as pd\nimport matplotlib.pyplot as plt")
    s.run("load", 'with open("data/task1/jetnet_logs/jetnet_logs.txt") as f:\n    raw = f.read().splitlines()\n'
                  "raw[:2]")
    s.run("load", edit=("raw[:2]", "len(raw), raw[1][:200]"))
    s.run("pat", 'pattern = re.complie(r"(\\w+) \\((\\d\\d/\\d\\d/\\d\\d) \\| (\\d\\d:\\d\\d:\\d\\d)\\)")\n'
                 "pattern.findall(raw[0])[:5]", expect="AttributeError")
    s.run("pat", edit=("re.complie", "re.compile"))
    s.run("pat", edit=("pattern.findall(raw[0])[:5]", 'pattern.findall(raw[0])[:5], re.match(r"@(\\w+):", raw[0])'))
    s.run("pat", edit=('re.match(r"@(\\w+):", raw[0])', 're.match(r"@(\\w+):", raw[0]).group(1)'))
    s.run("rec", "records = []\nfor i, line in enumerate(raw):\n"
                 '    user = re.match(r"@(\\w+):", line).group(1)\n'
                 "    for name, day, clock in pattern.findall(line):\n"
                 '        records.append({"user_id": user, "session_num": i, "action_name": name,\n'
                 '                        "action_time": day + " " + clock})\n'
                 "df = pd.DataFrame(records)\ndf.shape")
    s.run("rec", edit=("df.shape", "df.head()"))
    s.run("chk", "df.action_name.value_counts()")
    s.run("chk", "df.info()")
    s.run("clean", 'df = df[df.action_name != "END"]\ndf["action_name"] = df.action_name.str.capitalize()\n'
                   'df = df[df.action_name.str.match(r"Action_\\d+$")]\ndf.action_name.value_counts()')
    s.run("clean", edit=('df["action_name"] = df.action_name.str.capitalize()',
                         'df["action_name"] = df.action_name.str.capitalize()\n'
                         'df["action_time"] = pd.to_datetime(df.action_time, format="%d/%m/%y %H:%M:%S")'))
    s.run("rec")
    s.run("clean")
    s.run("clean", edit=("df.action_name.value_counts()", "df.dtypes"))
    s.run("order", 'first = df.groupby("session_num").action_time.min()\n'
                   'new_num = first.rank(method="first").astype(int) - 1\n'
                   'df["session_num"] = df.session_num.map(new_num)\n'
                   'df = df.sort_values(["session_num", "action_time"]).reset_index(drop=True)\ndf.head(10)')
    s.run("order", edit=("df.head(10)", 'df = df[["user_id", "session_num", "action_time", "action_name"]]\n'
                                       "df.head(10)"))
    s.run("m_user", "df.groupby('user_id').size().mean()")
    s.run("m_user", edit=("df.groupby('user_id').size().mean()",
                          "df.groupby('user_id').size().describe()"))
    s.run("m_day", "df.groupby(['user_id', df.action_time.dt.date]).size().groupby(level=0).mean().mean()")
    s.run("m_rep", "# longest run of the same action inside each session\nstreaks = {}\n"
                   "for num, g in df.groupby('session_num'):\n    names = g.action_name.tolist()\n"
                   "    best, cur, i = 1, 1, 1\n    while i < len(names):\n"
                   "        if names[i] == names[i - 1]:\n            cur += 1\n            best = max(best, cur)\n"
                   "        else:\n            cur = 1\n    streaks[num] = best\nlen(streaks)",
          expect="KeyboardInterrupt", interrupt=True)
    s.run("m_rep", edit=("            cur = 1\n", "            cur = 1\n        i += 1\n"))
    s.run("m_rep", edit=("len(streaks)", "streaks = pd.Series(streaks)\n(streaks >= 3).mean()"))
    s.run("m_q", "gap = df.groupby(['session_num', 'action_name']).action_time.diff()\n"
                 "gap.dt.total_seconds().quantile(0.95)")
    s.run("m_q", edit=("gap.dt.total_seconds().quantile(0.95)",
                       "gap.dt.total_seconds().quantile(0.95) / 60  # minutes"))
    s.run("m_wd", "from scipy.stats import f_oneway, ttest_ind\n"
                  "df['weekday'] = df.action_time.dt.weekday_name\ndf.weekday.value_counts()",
          expect="AttributeError")
    s.run("m_wd", edit=("df.action_time.dt.weekday_name", "df.action_time.dt.day_name()"))
    s.run("m_wd2", "per_day = df.groupby([df.action_time.dt.date, 'weekday']).size().reset_index(name='n')\n"
                   "f_oneway(*[g.n for _, g in per_day.groupby('weekday')])")
    s.run("m_wd2", edit=("f_oneway(*[g.n for _, g in per_day.groupby('weekday')])",
                         "weekend = per_day.weekday.isin(['Saturday', 'Sunday'])\n"
                         "print(f_oneway(*[g.n for _, g in per_day.groupby('weekday')]))\n"
                         "print(ttest_ind(per_day.n[weekend], per_day.n[~weekend]))"))
    s.run("scratch", "per_day.groupby('weekday').n.mean().sort_values()")
    s.run("scratch", "per_day.groupby('weekday').n.agg(['mean', 'count'])")
    s.delete("scratch")
    s.run("plots", "fig, ax = plt.subplots(1, 2, figsize=(14, 4))\n"
                   "df.groupby([df.action_time.dt.date, 'action_name']).size().unstack().plot(ax=ax[0])\n"
                   "df.action_name.value_counts().plot.bar(ax=ax[2])", expect="IndexError")
    s.run("plots", edit=("ax=ax[2]", "ax=ax[1]"))
    s.run("plots", edit=("ax=ax[1])", "ax=ax[1])\nax[0].set_title('actions by day')\n"
                                      "ax[1].set_title('action counts')"))
    s.run("heat", "nxt = df.groupby('session_num').action_name.shift(-1)\n"
                  "m = pd.crosstab(nxt, df.action_name)\nplt.matshow(m)\nplt.colorbar()")
    s.run("heat", edit=("plt.colorbar()", "plt.colorbar()\nplt.xticks(range(len(m)), m.columns, rotation=90)\n"
                                          "plt.yticks(range(len(m)), m.index)\nplt.show()"))
    s.run("top", "active = df.user_id.value_counts()\ntop = active.head(int(len(active) * 0.2)).index\n"
                 "df[df.user_id.isin(top)].groupby(df.action_time.dt.date).size().plot(figsize=(12, 4))")
    s.run("top", edit=("top = active.head(int(len(active) * 0.2)).index",
                       "top = active.head(max(1, round(len(active) * 0.2))).index"))
    s.restart()  # the plots were drawn over each other; start clean
    s.run("rec", expect="NameError")
    s.run("load")
    s.run("pat", expect="NameError")  # the imports went with the restart
    s.run("imp")
    s.run("pat")
    s.run("rec")
    s.run("clean")
    s.run("order")
    s.run("m_rep")  # out of order: back to the streaks after the plots
    s.run("own", "dur = df.groupby('session_num').action_time.agg(lambda t: t.max() - t.min())\n"
                 "plt.hist(dur.dt.total_seconds() / 3600, bins=30)")
    s.run("own", edit=("bins=30)", "bins=30)\nplt.xlabel('session length, h')\nplt.show()"))
    s.run("own", edit=("plt.show()", "plt.show()\ndur.median()"))
    return s


FEATURES = ('["cell_number", "execution_count", "linesofcomment", "linesofcode", "variable_count",\n'
            '       "function_count", "text/plain", "image/png", "text/html", "execute_result",\n'
            '       "display_data", "stream", "error"]')


def task2_forest() -> Script:
    """Task 2 with a random forest on the numeric features, a restart that loses everything, F1 at the end."""
    s = Script("task2-forest", "task2.ipynb", "2023-05-10T10:22:37.093Z")
    s.run("template", CHECK)
    s.run("imports", "import pandas as pd\nimport numpy as np")
    s.run("load", 'path = "data/task2/"\ntrain = pd.read_pickle(path + "train_features.pkl")\n'
                  'val = pd.read_pickle(path + "validation_features.pkl")\n'
                  'test = pd.read_pickle(path + "test_features.pkl")\nprint(train.shape, val.shape, test.shape)')
    s.run("look", "train.head()")
    s.run("look", "train.columns")
    s.run("look", "train.primary_label.value_counts()")
    s.run("look", "train.primary_label.value_counts(normalize=True)")
    s.run("look", 'test["primary_label"]', expect="KeyError")
    s.run("look", "test.columns")
    s.run("look", "train.isna().sum()")
    s.run("look", "train.describe()")
    s.run("look", "train.text[0]")
    s.run("look", "train.cell_type.unique()")
    s.run("feat", f"num = {FEATURES}\nX = train[num]\ny = train.primary_label\nX.shape")
    s.run("feat", edit=('"linesofcomment"', '"linesofcomments"'), expect="KeyError")
    s.run("feat", edit=('"linesofcomments"', '"linesofcomment"'))
    s.run("model", "from sklearn.ensemble import RandomForestClassifier\n"
                   "clf = RandomForestClassifier(n_estimators=100, random_state=0)\nclf.train(X, y)",
          expect="AttributeError")
    s.run("model", edit=("clf.train(X, y)", "clf.fit(X, y)"))
    s.run("score", "from sklearn.metric import f1_score\npred = clf.predict(val[num])\nf1_score(val.primary_label, pred)",
          expect="ModuleNotFoundError")
    s.run("score", edit=("sklearn.metric ", "sklearn.metrics "), expect="ValueError")
    s.run("score", edit=("f1_score(val.primary_label, pred)", 'f1_score(val.primary_label, pred, average="macro")'))
    s.run("score", edit=('average="macro")', 'average="macro"), f1_score(val.primary_label, pred, '
                                             'average="weighted")'))
    s.run("feat", edit=('num = ["cell_number"', 'num = ["cell_type", "cell_number"'))
    s.run("model", expect="ValueError")  # cell_type is text
    s.run("feat", edit=('num = ["cell_type", "cell_number"', 'num = ["cell_number"'))
    s.run("model")
    s.run("text", 'train["n_lines"] = train.text.apply(len)\ntrain[["n_lines", "linesofcode"]].head()')
    s.run("text", edit=("train.text.apply(len)", "train.text.str.len()"))
    s.run("kw", 'keywords = ["read_", "plot", "fit(", "predict", "def ", "import", "print", "score"]\n'
                "for frame in (train, val, test):\n    code = frame.text.str.join(\"\\n\")\n"
                "    for k in keywords:\n        frame[\"kw_\" + k] = code.str.contains(k, regex=False).astype(int)\n"
                "train.filter(like=\"kw_\").mean()")
    s.run("feat", edit=("\nX = train[num]", '\nnum = num + [c for c in train.columns if c.startswith("kw_")]\n'
                                            "X = train[num]"))
    s.run("model")
    s.run("score")
    s.restart()
    s.run("feat", expect="NameError")  # the restart wiped the frames
    s.run("load", expect="NameError")  # ... and pandas
    s.run("imports")
    s.run("load")
    s.run("kw")
    s.run("feat")
    s.run("model")
    s.run("score")
    s.run("imp", "imp = pd.Series(clf.feature_importances_, index=num).sort_values()\nimp.plot.barh(figsize=(6, 8))")
    s.run("imp", edit=("imp.plot.barh(figsize=(6, 8))", "imp.plot.barh(figsize=(6, 8))\nplt.title(\"importance\")"),
          expect="NameError")
    s.run("imports", edit=("import numpy as np", "import numpy as np\nimport matplotlib.pyplot as plt"))
    s.run("imp")
    s.run("model", edit=("n_estimators=100", "n_estimators=300, min_samples_leaf=2"))
    s.run("score")
    s.run("model", edit=("n_estimators=300, min_samples_leaf=2", "n_estimators=300, class_weight=\"balanced\""))
    s.run("score")
    s.run("report", "from sklearn.metrics import classification_report\n"
                    "print(classification_report(val.primary_label, pred))")
    s.run("cm", "from sklearn.metrics import ConfusionMatrixDisplay\n"
                "ConfusionMatrixDisplay.from_predictions(val.primary_label, pred, xticks_rotation=90)\nplt.show()")
    s.run("cm", edit=("xticks_rotation=90)", "xticks_rotation=90, normalize=\"true\",\n"
                                              "                                        values_format=\".2f\")"))
    s.run("sub", 'test["primary_label"] = clf.predict(test[num])\ntest.primary_label.value_counts()')
    s.run("sub", edit=("test.primary_label.value_counts()", "test[[\"filename\", \"cell_number\", \"primary_label\"]].head()"))
    return s


def task2_tfidf() -> Script:
    """Task 2 on the cell code: TF-IDF and a logistic regression, API slips, then numeric features added."""
    s = Script("task2-tfidf", "task2.ipynb", "2023-05-11T14:47:52.640Z")
    s.run("template")
    s.run("imports", "import pandas as pd\nfrom sklearn.feature_extraction.text import TfidfVectorizer\n"
                     "from sklearn.linear_model import LogisticRegression\nfrom sklearn.metrics import f1_score")
    s.run("load", 'train = pd.read_pickle("data/task2/train_feature.pkl")\ntrain.shape', expect="FileNotFoundError")
    s.run("load", edit=("train_feature.pkl", "train_features.pkl"))
    s.run("load", edit=("\ntrain.shape", '\nval = pd.read_pickle("data/task2/validation_features.pkl")\n'
                                         "train.shape, val.shape"))
    s.run("peek", "train.text.head()")
    s.run("peek", "train.text[3]")
    s.run("peek", "type(train.text[3])")
    s.run("peek", 'train[["text", "primary_label"]].head(10)')
    s.run("vec", "vec = TfidfVectorizer()\nX = vec.fit_transform(train.text)\nX.shape", expect="AttributeError")
    s.run("vec", edit=("X = vec.fit_transform(train.text)",
                       'train["code"] = train.text.apply(" ".join)\nX = vec.fit_transform(train.code)'))
    s.run("vec", edit=("X.shape", "X.shape, vec.get_feature_names()[:20]"), expect="AttributeError")
    s.run("vec", edit=("vec.get_feature_names()[:20]", "vec.get_feature_names_out()[:20]"))
    s.run("vec", edit=("vec = TfidfVectorizer()", 'vec = TfidfVectorizer(token_pattern=r"[A-Za-z_]+", min_df=2)'))
    s.run("fit", "clf = LogisticRegression()\nclf.fit(X, train.primary_label)")
    s.run("fit", edit=("LogisticRegression()", "LogisticRegression(max_iter=1000)"))
    s.run("eval", "Xv = vec.transform(val.code)\npred = clf.predict(Xv)\n"
                  'f1_score(val.primary_label, pred, average="macro")', expect="AttributeError")
    s.run("eval", edit=("Xv = vec.transform(val.code)",
                        'val["code"] = val.text.apply(" ".join)\nXv = vec.transform(val.code)'))
    s.run("eval", edit=('average="macro")', 'average="macro"), f1_score(val.primary_label, pred, average="micro")'))
    s.run("cls", "clf.classes_")
    s.run("cls", "clf.classes_[10]", expect="IndexError")
    s.run("cls", "clf.coef_.shape")
    s.run("words", "import numpy as np\nwords = vec.get_feature_names_out()\n"
                   "for label, row in zip(clf.classes_, clf.coef_):\n"
                   "    print(label, words[np.argsort(row)[-8:]])")
    s.run("words", edit=("[-8:]", "[-8:][::-1]"))
    s.run("fit", edit=("max_iter=1000)", "max_iter=1000, C=5)"))
    s.run("eval", edit=("Xv = vec.transform(val.code)", "Xv = vec.transform(val.code)[:, :100]"),
          expect="ValueError")
    s.run("eval", edit=("Xv = vec.transform(val.code)[:, :100]", "Xv = vec.transform(val.code)"))
    s.run("fit", edit=("max_iter=1000, C=5)", 'max_iter=1000, C=5, class_weight="balanced")'))
    s.run("eval")
    s.run("num", "from scipy.sparse import hstack\n"
                 'num = ["linesofcode", "linesofcomment", "variable_count", "function_count", "execute_result",\n'
                 '       "display_data", "stream", "error", "image/png"]\n'
                 "X2 = hstack([X, train[num]]).tocsr()\nX2.shape")
    s.run("num", edit=("hstack([X, train[num]])", "hstack([X, train[num].values])"))
    s.run("fit2", 'clf2 = LogisticRegression(max_iter=1000, C=5, class_weight="balanced")\n'
                  "clf2.fit(X2, train.primary_label)\n"
                  "pred2 = clf2.predict(hstack([Xv, val[num].values]).tocsr())\n"
                  'f1_score(val.primary_label, pred2, average="macro")')
    s.run("fit2", edit=("hstack([Xv, val[num].values]).tocsr()", "hstack([Xv, val[num].values]).tocsr("),
          expect="SyntaxError")
    s.run("fit2", edit=("hstack([Xv, val[num].values]).tocsr(", "hstack([Xv, val[num].values]).tocsr()"))
    s.restart()
    s.run("fit2", expect="NameError")
    s.run("imports")
    s.run("load")
    s.run("vec")
    s.run("num")
    s.run("fit")
    s.run("eval")
    s.run("fit2")
    s.run("scale", "from sklearn.preprocessing import MaxAbsScaler\nscaler = MaxAbsScaler()\n"
                   "X2s = scaler.fit_transform(X2)\nXv2s = scaler.transform(hstack([Xv, val[num].values]).tocsr())\n"
                   "clf2.fit(X2s, train.primary_label)\n"
                   'f1_score(val.primary_label, clf2.predict(Xv2s), average="macro")')
    s.run("scale", edit=("clf2.fit(X2s, train.primary_label)", "clf2.fit(X2s, train.primary_label)\n"
                                                               "pred2 = clf2.predict(Xv2s)"))
    s.run("scale", edit=("clf2.predict(Xv2s), average", "pred2, average"))
    s.run("plot", "import matplotlib.pyplot as plt\n"
                  "scores = f1_score(val.primary_label, pred2, average=None, labels=clf2.classes_)\n"
                  "plt.barh(clf2.classes_, scores)\nplt.xlabel(\"F1\")")
    s.run("plot", edit=('plt.xlabel("F1")', 'plt.xlabel("F1")\nplt.tight_layout()\nplt.show()'))
    s.run("eval")
    s.run("scale")
    return s


def task1_extract() -> Script:
    """Task 1 with pandas string methods (`read_csv` + `str.extractall`), then "restart and run all"."""
    s = Script("task1-extract", "task1.ipynb", "2023-05-12T07:55:18.882Z")
    s.run("template", CHECK)
    s.run("imports", "import numpy as np\nimport pandas as pd\nimport matplotlib.pyplot as plt")
    s.run("raw", 'raw = pd.read_csv("data/task1/jetnet_logs/jetnet_logs.txt", header=None)\nraw.head()')
    s.run("raw", edit=("raw.head()", 'raw.columns = ["line"]\nraw.shape'))
    s.run("users", 'raw["user_id"] = raw.line.str.extract(r"@User(\\d+)").astype(int)\nraw.user_id.nunique()')
    s.run("acts", 'acts = raw.line.str.extractall(r"(?P<action_name>Action_\\d+) \\((?P<day>[\\d/]+) \\| '
                  '(?P<clock>[\\d:]+)\\)")\nacts.head()')
    s.run("acts", edit=("acts.head()", "acts = acts.reset_index()\nacts.head()"))
    s.run("acts")
    s.run("raw")
    s.run("users")
    s.run("acts")
    s.run("acts", edit=("acts.head()", 'acts = acts.merge(raw[["user_id"]], left_on="level_0", right_index=True)\n'
                                       "acts.head()"))
    s.run("time", 'acts["action_time"] = pd.to_datetime(acts.day + " " + acts.clock, format="%d/%m/%Y %H:%M:%S")',
          expect="ValueError")
    s.run("time", edit=("%d/%m/%Y", "%d/%m/%y"), expect="ValueError")
    s.run("time", edit=('%H:%M:%S")', '%H:%M:%S", errors="coerce")\nacts.action_time.isna().sum()'))
    s.run("time", edit=("acts.action_time.isna().sum()", "acts = acts.dropna(subset=[\"action_time\"])\nlen(acts)"))
    s.run("sess", 'start = acts.groupby("level_0").action_time.transform("min")\n'
                  'acts["session_num"] = start.rank(method="dense").astype(int) - 1\n'
                  'df = acts[["user_id", "session_num", "action_time", "action_name"]]\ndf.head()')
    s.run("sess", edit=("df.head()", 'df = df.sort_values(["session_num", "action_time"]).reset_index(drop=True)\n'
                                     "df.head()"))
    s.run("m1", "round(df.groupby(\"user_id\").size().mean, 2)", expect="TypeError")
    s.run("m1", "round(df.groupby(\"user_id\").size().mean(), 2)")
    s.run("m2", 'daily = df.groupby(["user_id", df.action_time.dt.date]).size()\nround(daily.mean(), 2)')
    s.run("m2", edit=("round(daily.mean(), 2)", "round(daily.groupby(level=0).mean().mean(), 2)"))
    s.run("m3", "a, sn = df.action_name, df.session_num\n"
                "same3 = (a == a.shift(1)) & (a == a.shift(2)) & (sn == sn.shift(2))\n"
                "same3.groupby(sn).any().mean()")
    s.run("m4", 'delta = df.groupby(["session_num", "action_name"]).action_time.diff().dropna()\n'
                "delta.quantile(0.95)")
    s.run("own", "hours = df.groupby(\"session_num\").action_time.agg(lambda t: (t.max() - t.min()).total_seconds())"
                 " / 3600\nlong = [h for h in hours if h > 72]\nsum(long) / len(long)", expect="ZeroDivisionError")
    s.run("own", edit=("h > 72", "h > 12"))
    s.run("own", edit=("sum(long) / len(long)", "len(long) / len(hours), hours.median()"))
    s.run("plot1", 'per_day = df.pivot_table(index=df.action_time.dt.date, columns="action_name",\n'
                   '                         values="user_id", aggfunc="count")\nper_day.plot(figsize=(12, 5))')
    s.run("plot1", edit=("per_day.plot(figsize=(12, 5))", "per_day.plot(figsize=(12, 5), legend=False)\nplt.show()"))
    s.run("plot2", "counts = df.action_name.value_counts()\nplt.bar(counts.index, counts.values)\nplt.xticks(rotation=45)"
                   "\nplt.show()")
    s.restart()
    for cell in ("template", "imports", "raw", "users", "acts", "time", "sess", "m1", "m2", "m3", "m4", "own",
                 "plot1", "plot2"):
        s.run(cell)  # "Restart & Run All" to check the notebook is reproducible
    s.run("m3", edit=("same3.groupby(sn).any().mean()", "round(same3.groupby(sn).any().mean(), 4)"))
    s.run("m5", "from scipy import stats\n"
                "table = pd.crosstab(df.action_time.dt.dayofweek, df.action_name)\n"
                "stats.chi2_contingency(table).pvalu", expect="AttributeError")
    s.run("m5", edit=(".pvalu", ".pvalue"))
    s.run("m5", edit=("stats.chi2_contingency(table).pvalue",
                      "weekend = df.action_time.dt.dayofweek >= 5\n"
                      "daily = df.groupby([df.action_time.dt.date, weekend]).size().reset_index(name=\"n\")\n"
                      "daily.groupby(\"action_time\").n.mean()"), expect="ValueError")
    s.run("m5", edit=("df.groupby([df.action_time.dt.date, weekend])",
                      "df.groupby([df.action_time.dt.date.rename(\"day\"), weekend.rename(\"weekend\")])"),
          expect="KeyError")
    s.run("m5", edit=('daily.groupby("action_time").n.mean()',
                      'stats.mannwhitneyu(daily.n[daily.weekend], daily.n[~daily.weekend])'))
    return s


def task2_trees() -> Script:
    """Task 2 with a baseline and decision trees of growing depth, cross-validation and a depth plot."""
    s = Script("task2-trees", "task2.ipynb", "2023-05-12T16:31:05.214Z")
    s.run("template")
    s.run("imports", "import pandas as pd\nimport matplotlib.pyplot as plt\n"
                     "from sklearn.tree import DecisionTreeClassifier\nfrom sklearn.metrics import f1_score")
    s.run("load", 'data = {name: pd.read_pickle(f"data/task2/{name}_features.pkl")\n'
                  '        for name in ["train", "validation", "test"]}\n{k: v.shape for k, v in data.items()}')
    s.run("split", 'train, val = data["train"], data["val"]', expect="KeyError")
    s.run("split", edit=('data["val"]', 'data["validation"]'))
    s.run("split", edit=('data["validation"]', 'data["validation"]\ntrain.dtypes.value_counts()'))
    s.run("cols", 'num = train.select_dtypes("number").columns.tolist()\nnum')
    s.run("cols", edit=("\nnum", '\nlabels = ["helper_functions", "load_data", "data_exploration",\n'
                                 '          "data_preprocessing", "evaluation", "modelling", "prediction",\n'
                                 '          "result_visualization", "save_results", "comment_only"]\n'
                                 "num = [c for c in num if c not in labels]\nnum"))
    s.run("eda", "train.shape, val.shape")
    s.run("eda", "val.primary_label.value_counts()")
    s.run("eda", "train[num].corr()")
    s.run("eda", "plt.imshow(train[num].corr())\nplt.colorbar()")
    s.run("eda", edit=("plt.colorbar()", "plt.colorbar()\nplt.xticks(range(len(num)), num, rotation=90)\n"
                                         "plt.yticks(range(len(num)), num)\nplt.show()"))
    s.run("eda", 'train.groupby("primary_label").linesofcode.median().sort_values()')
    s.run("base", "from sklearn.dummy import DummyClassifier\n"
                  'dummy = DummyClassifier(strategy="most_frequent").fit(train[num], train.primary_label)\n'
                  'f1_score(val.primary_label, dummy.predict(val[num]), average="macro")')
    s.run("tree", "tree = DecisionTreeClassifier(max_depth=5, random_state=0).fit(train[num], train.primary_label)\n"
                  "tree.score(val[num])", expect="TypeError")
    s.run("tree", edit=("tree.score(val[num])", "tree.score(val[num], val.primary_label)"))
    s.run("tree", edit=("tree.score(val[num], val.primary_label)",
                        'f1_score(val.primary_label, tree.predict(val[num]), average="macro")'))
    s.run("depth", "depths = range(1, 16)\nscores = []\nfor d in depths:\n"
                   "    t = DecisionTreeClassifier(max_depth=d, random_state=0).fit(train[num], train.primary_label)\n"
                   '    scores.append(f1_score(val.primary_label, t.predict(val[num]), average="macro"))\n'
                   "scores[len(depths)]", expect="IndexError")
    s.run("depth", edit=("scores[len(depths)]", "max(scores), depths[scores.index(max(scores))]"))
    s.run("depth", edit=("random_state=0)", "min_samples_leaf=5, random_state=0)"))
    s.run("depth", edit=("f1_score(val.primary_label, t.predict(val[num])", "f1_scor(val.primary_label, t.predict(val[num])"),
          expect="NameError")
    s.run("depth", edit=("f1_scor(", "f1_score("))
    s.run("dplot", "plt.plot(depths, scores)\nplt.xlabel(\"max_depth\")")
    s.run("dplot", edit=('plt.xlabel("max_depth")', 'plt.xlabel("max_depth")\nplt.ylabel("macro F1")\nplt.show()'))
    s.run("cv", "from sklearn.model_selection import cross_val_score\n"
                "cross_val_score(DecisionTreeClassifier(max_depth=8, random_state=0), train[num],\n"
                '                train.primary_label, cv=5, scoring="f1_macro")')
    s.run("cv", edit=("max_depth=8", "max_depth=6"))
    s.run("cv", edit=("\ncross_val_score(", "\ncv_scores = cross_val_score("))
    s.run("cv", edit=('scoring="f1_macro")', 'scoring="f1_macro")\nprint(cv_scores.mean(), cv_scores.std())'))
    s.run("leak", 'train[num + ["primary_label"]].groupby("primary_label").mean().T')
    s.run("leak", 'train.groupby("primary_label")[["execute_result", "display_data", "image/png"]].mean()')
    s.run("tree", edit=("max_depth=5", "max_depth=6"))
    s.run("final", "best = DecisionTreeClassifier(max_depth=6, min_samples_leaf=5, random_state=0)\n"
                   "best.fit(pd.concat([train[num], val[num]]), pd.concat([train.primary_label, val.primary_label]))\n"
                   "pred = best.predict(data[\"test\"][num]\npd.Series(pred).value_counts()", expect="SyntaxError")
    s.run("final", edit=('data["test"][num]\n', 'data["test"][num])\n'))
    s.run("rf", "from sklearn.ensemble import RandomForestClassifier\n"
                "rf = RandomForestClassifier(n_estimators=50, random_state=0).fit(train[num], train.label)",
          expect="AttributeError")
    s.run("rf", edit=("train.label)", "train.primary_label)"))
    s.run("rf", edit=("train.primary_label)", "train.primary_label)\n"
                                              'f1_score(val.primary_label, rf.predict(val[num]), average="macro")'))
    s.run("rf", edit=("n_estimators=50,", "n_estimators=50, max_depth=8,"))
    s.run("depth")
    s.run("feat_imp", "pd.Series(best.feature_importances_, index=num).nlargest(8)")
    s.run("feat_imp", edit=("nlargest(8)", "nlargest(8).plot.bar()"))
    s.run("feat_imp", edit=("nlargest(8).plot.bar()", "nlargest(8).plot.bar()\nplt.show()"))
    return s


def scripts() -> list[Script]:
    """Every authored trajectory, in the order they are generated."""
    return [task1_split(), task1_regex(), task1_extract(), task2_forest(), task2_tfidf(), task2_trees()]


# --------------------------------------------------------------------------------------------------------------
# Counting (for the README table and the report), with the pairing rule of the real logs.


@dataclass
class Counts:
    """What one generated log holds: runs, errors by ename, restarts, interrupts and output kinds."""

    executions: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    interrupts: int = 0
    outputs: dict[str, int] = field(default_factory=dict)  # output kind → runs that produced one


def count_events(events: list[dict]) -> Counts:
    """Count runs the way the logs encode them: an `execute`, or a `finished_execute` directly followed by `error`."""
    counts = Counts()
    for i, ev in enumerate(events):
        kind = ev["event"]
        if kind == "execute":
            counts.executions += 1
        elif kind == "error":
            counts.executions += 1  # errored runs have no `execute` event
            ename = json.loads(ev["cell_source"])["ename"]
            counts.errors[ename] = counts.errors.get(ename, 0) + 1
        elif kind == "kernel_restarting":
            counts.restarts += 1
        elif kind == "kernel_interrupting":
            counts.interrupts += 1
        elif kind == "finished_execute":
            outputs = json.loads(ev["cell_output"])
            kinds = {o["output_type"] for o in outputs} or {"nothing"}
            if "error" in kinds:
                continue
            for k in kinds:
                counts.outputs[k] = counts.outputs.get(k, 0) + 1
    counts.errors = dict(sorted(counts.errors.items()))
    counts.outputs = dict(sorted(counts.outputs.items()))
    return counts


# --------------------------------------------------------------------------------------------------------------
# Generation.

README_HEAD = """\
# Sample trajectories (authored)

These JuNE-format event logs are **authored samples written for Themisto, not study data**: no participant
produced them. The Themisto authors wrote the cell sequences (with the edits, typos, tracebacks, re-runs,
out-of-order runs and kernel restarts of real development) in `data/make_sample.py`, and the script executed
them for real in a Jupyter kernel, inside a copy of the look-alike workspace made by
`themisto.ingest.workspace.write_workspace(seed=0, size="small")`, logging what actually happened. Outcomes (status,
`ename`/`evalue`, output types and sizes) are therefore real; timestamps and ids come from seeded generators.

The format is that of the JuNE logging extension's local `<kernel_id>.log` files (one event per line, see
`themisto/june_format.py`), so the same readers handle these and the real logs.

Regenerate (byte-identical on the pinned library versions) or verify; regenerate too whenever
`themisto/workspace.py` changes what seed 0 writes, since the logged outcomes come from those files:

```
python data/make_sample.py            # rewrites data/sample/
python data/make_sample.py --check    # regenerates into a temporary folder and compares
```

| file | notebook | trajectory | executions | errors | restarts |
| --- | --- | --- | ---: | ---: | ---: |
"""


def render_readme(rows: list[tuple[str, Script, Counts]]) -> str:
    lines = [README_HEAD.rstrip("\n")]
    for file_name, script, counts in rows:
        lines.append(f"| `{file_name}` | {script.notebook} | {script.name} | {counts.executions} | "
                     f"{sum(counts.errors.values())} | {counts.restarts} |")
    return "\n".join(lines) + "\n"


def _make_workspace(dest: Path) -> Path:
    from themisto.ingest.workspace import write_workspace

    return Path(write_workspace(dest, seed=WORKSPACE_SEED, size=WORKSPACE_SIZE).root)


def generate(out_dir: Path = DEFAULT_OUT, *, seed: int = SEED, progress: bool = False) -> dict[str, Counts]:
    """Execute every authored script and (re)write `out_dir` with one `<kernel_id>.log` each and the README.

    The files are written to a sibling folder first and swapped in at the end, so a failure leaves `out_dir`
    as it was. Returns the counts per file name.
    """
    from themisto.ingest.june_format import encode_log_line

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="themisto-sample-") as tmp:
        base = _make_workspace(Path(tmp) / "workspace")
        staged = Path(tmp) / "out"
        staged.mkdir()

        def one(script: Script) -> tuple[str, Script, Counts]:
            started = time.monotonic()
            run_dir = Path(tmp) / f"run-{script.name}"
            shutil.copytree(base, run_dir)
            kernel_id, events = play(script, run_dir, seed)
            shutil.rmtree(run_dir)
            file_name = f"{kernel_id}.log"
            with (staged / file_name).open("w", encoding="utf-8", newline="\n") as fh:
                for ev in events:
                    fh.write(encode_log_line(ev) + "\n")
            counts = count_events(events)
            if progress:
                print(f"{script.name}: {counts.executions} executions, errors {counts.errors}, "
                      f"{counts.restarts} restarts, {time.monotonic() - started:.1f} s", file=sys.stderr)
            return file_name, script, counts

        # Each script plays in its own kernel and workspace copy, seeded by its name alone, so they play side by
        # side (one per core) and the files are the ones a one-by-one run writes; rows keep the scripts' order.
        todo = scripts()
        with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
            rows = list(pool.map(one, todo))
        (staged / "README.md").write_text(render_readme(rows), encoding="utf-8", newline="\n")
        final = out_dir.parent / (out_dir.name + ".partial")
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(staged, final)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    final.replace(out_dir)
    return {file_name: counts for file_name, _, counts in rows}


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file in `folder`, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def main(argv: list[str] | None = None) -> int:
    if str(HERE.parent) not in sys.path:  # run as a script from a checkout where themisto is not installed
        sys.path.insert(0, str(HERE.parent))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to (re)write (default: data/sample)")
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary folder and compare with --out instead of writing it")
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory(prefix="themisto-sample-check-") as tmp:
            generate(Path(tmp) / "sample", progress=True)
            fresh, shipped = digests(Path(tmp) / "sample"), digests(args.out)
        if fresh != shipped:
            changed = sorted(set(fresh.items()) ^ set(shipped.items()))
            print(f"{args.out} differs from a fresh generation: {sorted({name for name, _ in changed})}",
                  file=sys.stderr)
            return 1
        print(f"{args.out}: identical to a fresh generation ({len(fresh)} files)")
        return 0
    for name, counts in generate(args.out, progress=True).items():
        print(f"{name}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
