"""Read the paper's own release (the published Themisto data) into `trajectories` rows.

The published rows carry `kernel_id, code, output, execution time, memory, runtime variables (name -> size,
repr), hash`; column names vary between copies, so each field is looked up under a few alternate names and a
missing column becomes null. With network, a user can feed the Hub copy in directly:

    rows = paper_rows(datasets.load_dataset("konstantgr/themisto", split="train"))

and then build tasks and a release from them (`themisto build --paper FILE` does it for a local file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from themisto.errors import InputError
from themisto.release.tasks import variable_row
from themisto.runtime.outputs import mask_volatile

# Our field -> the names it may have in the published data (compared after lower-casing and turning spaces
# and hyphens into underscores).
ALIASES: dict[str, tuple[str, ...]] = {
    "kernel_id": ("kernel_id", "kernel", "trajectory_id", "trajectory", "session_id"),
    "step": ("step", "execution_index", "execution_order", "order", "index", "action_id"),
    "cell_id": ("cell_id", "cell_index"),
    "notebook": ("notebook", "notebook_name"),
    "task": ("task",),
    "participant": ("participant", "user_id", "user"),
    "code": ("code", "cell_source", "source", "cell_code", "content"),
    "output": ("output", "cell_output", "outputs", "output_text"),
    "status": ("status", "execution_status"),
    "ename": ("ename", "error_name"),
    "evalue": ("evalue", "error_value"),
    "execution_time": ("execution_time", "exec_time", "time_taken", "duration", "runtime", "elapsed"),
    "memory_bytes": ("memory_bytes", "memory", "memory_usage", "memory_used", "mem", "ram"),
    "variables": ("variables", "runtime_variables", "runtime_vars", "vars", "variables_info"),
    "state_hash": ("state_hash", "hash", "runtime_hash", "memory_hash"),
}
# Byte units for memory, second units for time; a bare number is taken as bytes or seconds.
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "s": 1, "ms": 1e-3}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


class PaperReleaseError(InputError):
    """A published row cannot be read; the message names the row (file:line or index) and the field."""


def _norm(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def _lookup(record: Mapping, field: str) -> Any:
    normalised = {_norm(k): v for k, v in record.items()}
    for alias in ALIASES[field]:
        if alias in normalised:
            return normalised[alias]
    return None


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _optional(value: Any) -> str | None:
    """A text field, None where it is missing or empty (CSV writes missing values as "")."""
    return None if value is None or value == "" else str(value)


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def output_text(value: Any) -> str:
    """The output as one text: a string as is, nbformat outputs as streams, text/plain and errors joined."""
    value = _maybe_json(value)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    items = value if isinstance(value, list) else [value]
    parts = []
    for item in items:
        if not isinstance(item, Mapping):
            parts.append(str(item))
        elif "text" in item:
            parts.append(_text(item["text"]))
        elif isinstance(item.get("data"), Mapping) and "text/plain" in item["data"]:
            parts.append(_text(item["data"]["text/plain"]))
        elif "ename" in item:
            traceback = item.get("traceback")
            parts.append("\n".join(traceback) if traceback else f"{item['ename']}: {item.get('evalue', '')}")
    return "".join(parts)


def variables_of(value: Any) -> list[dict]:
    """Variables as release rows from `{name: {size, repr, ...}}`, `{name: repr}` or a list of `{name, ...}`."""
    value = _maybe_json(value)
    if value is None or value == "":
        return []
    if isinstance(value, Mapping):
        items = []
        for name, info in value.items():
            info = _maybe_json(info)
            items.append({**info, "name": name} if isinstance(info, Mapping) else {"name": name, "repr": info})
    elif isinstance(value, list):
        items = [dict(v) for v in value]
    else:
        raise ValueError(f"expected variables as a mapping or a list, got {type(value).__name__}")
    rows = []
    for info in items:
        if "name" not in info:
            raise ValueError("a variable has no name")
        if info.get("repr") is not None and not isinstance(info["repr"], str):
            info["repr"] = repr(info["repr"])
        rows.append(variable_row(info))
    return rows


def quantity(value: Any, what: str) -> float | None:
    """A number from a number or a string like "12.5", "120 MiB", "0.3s" or "15 ms"."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"expected a number for {what}, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    match = _QUANTITY.match(str(value))
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in _UNITS):
        raise ValueError(f"expected a number for {what}, got {value!r}")
    return float(match.group(1)) * _UNITS.get(unit, 1)


def _row(record: Mapping, where: str) -> tuple[str, float, dict]:
    kernel_id = _lookup(record, "kernel_id") or _lookup(record, "notebook")
    if kernel_id is None or str(kernel_id) == "":
        raise PaperReleaseError(f"{where}: no kernel id (looked for {', '.join(ALIASES['kernel_id'])}, notebook)")
    code = _lookup(record, "code")
    if code is None:
        raise PaperReleaseError(f"{where}: no code (looked for {', '.join(ALIASES['code'])})")
    try:
        order = quantity(_lookup(record, "step"), "step")
        seconds = quantity(_lookup(record, "execution_time"), "execution_time")
        memory = quantity(_lookup(record, "memory_bytes"), "memory_bytes")
        variables = variables_of(_lookup(record, "variables"))
    except (ValueError, TypeError) as exc:
        raise PaperReleaseError(f"{where}: {exc}") from exc
    ename = _optional(_lookup(record, "ename"))
    status = _optional(_lookup(record, "status")) or ("error" if ename else "ok")
    output = mask_volatile(output_text(_lookup(record, "output")))  # as in our own rows
    row = {
        "kernel_id": str(kernel_id),
        "step": 0,  # renumbered per trajectory below
        "cell_id": str(_lookup(record, "cell_id") or ""),
        "notebook": str(_lookup(record, "notebook") or ""),
        "task": _optional(_lookup(record, "task")),
        "participant": _optional(_lookup(record, "participant")),
        "source": "paper-release",
        "provenance": None,
        "code": _text(code),
        "replayed_code": _text(code),
        "restarted_before": False,  # the published rows do not say; replay from the start is what they hold
        "status": status,
        "ename": ename,
        "evalue": _optional(_lookup(record, "evalue")),
        "output": output,
        "output_types": [],
        "execution_time": 0.0 if seconds is None else seconds,
        "memory_bytes": None if memory is None else int(memory),
        "state_hash": _optional(_lookup(record, "state_hash")),
        "variables": variables,
        "snapshot_failures": [],
        "kernel_restarted": False,
        "rebuilt_steps": 0,
        "stored_values": None,
        "logged_status": None,
        "logged_ename": None,
        "logged_evalue": None,
        "logged_output_types": [],
        "code_state": "as_logged",  # the published code, as the paper's release holds it
        "replay_cause": None,  # not replayed here: what its own replay met is not in its rows
        "rebuild": None,  # the published rows name no workspace or environment: their states cannot be rebuilt
    }
    return row["kernel_id"], order, row


def paper_rows(records: Iterable[Mapping], *, origin: str = "row") -> list[dict]:
    """`trajectories` rows from published records, numbered 0.. per kernel in `step` order (else file order)."""
    kernels: dict[str, list[tuple[float, int, dict]]] = {}
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise PaperReleaseError(f"{origin} {i}: expected a record (mapping), got {type(record).__name__}")
        kernel_id, order, row = _row(record, f"{origin} {i}")
        kernels.setdefault(kernel_id, []).append((i if order is None else order, i, row))
    rows = []
    for kernel_id in sorted(kernels):
        for step, (_, _, row) in enumerate(sorted(kernels[kernel_id], key=lambda t: (t[0], t[1]))):
            row["step"] = step
            rows.append(row)
    return rows


def read_records(path: str | Path) -> list[dict]:
    """Records of a .parquet, .jsonl, .json (a list) or .csv file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix == ".jsonl":
        records = []
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise PaperReleaseError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        return records
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise PaperReleaseError(f"{path}: expected a JSON list of records")
        return data
    if suffix == ".csv":
        import csv

        with path.open(encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh))
    raise PaperReleaseError(f"{path}: expected a .parquet, .jsonl, .json or .csv file")


def read_paper_release(path: str | Path) -> list[dict]:
    """`trajectories` rows of a local copy of the published data; errors name the file and row."""
    path = Path(path)
    return paper_rows(read_records(path), origin=f"{path} row")
