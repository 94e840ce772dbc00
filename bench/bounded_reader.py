"""What the bounded reader's depth and item check costs beside `json.loads`, on 1 MiB lines of several shapes.

Each shape is one JSON line of about 1 MiB: a prediction of code (one long string), a string full of escaped quotes
and brackets, a flat list of numbers, many small objects, and two hostile lines the check refuses (an array nested
500,000 deep, and one nested 65 deep inside a large list). Prints the median of --rounds timings per shape (ms)
and the check's cost as a share of `json.loads` where the line parses; never asserts on time.

    python bench/bounded_reader.py [--rounds R]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, median, report  # noqa: E402

MIB = 1 << 20


def shapes() -> dict[str, str]:
    code = "df['a'] = df[['b', 'c']].apply(lambda r: {'k': [r.b, r.c]}, axis=1)\n"
    return {
        "prediction_of_code": json.dumps({"id": "k/1", "prediction": code * (MIB // len(code))}),
        "escaped_string": json.dumps({"id": "k/1", "prediction": 'a"b[\\{' * (MIB // 8)}),
        "flat_numbers": json.dumps(list(range(MIB // 7))),
        "small_objects": json.dumps([{"a": [1, 2], "b": "x"} for _ in range(MIB // 25)]),
        "hostile_deep": "[" * (MIB // 2) + "]" * (MIB // 2),
        "hostile_65_in_list": json.dumps([list(range(50))] * (MIB // 200))[:-1] + "," + "[" * 65 + "]" * 65 + "]",
    }


def timed(function, text: str, rounds: int) -> tuple[float, str]:
    times, outcome = [], ""
    for _ in range(rounds):
        start = time.perf_counter()
        try:
            function(text)
            outcome = "ok"
        except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
            outcome = type(exc).__name__
        times.append(1000 * (time.perf_counter() - start))
    return median(times), outcome


def main() -> None:
    from themisto.bounded import Bounds, check_json_text

    parser = arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bounds = Bounds()
    rows = []
    for name, text in shapes().items():
        check_ms, check_outcome = timed(lambda t: check_json_text(t, bounds, path="line", line=1), text, args.rounds)
        loads_ms, loads_outcome = timed(json.loads, text, args.rounds)
        rows.append({"shape": name, "mib": round(len(text) / MIB, 2), "check_ms": round(check_ms, 2),
                     "check": check_outcome, "loads_ms": round(loads_ms, 2), "loads": loads_outcome,
                     "check_share": round(check_ms / loads_ms, 2) if loads_outcome == "ok" else None})
    report("bounded_reader", {"rows": rows}, rows,
           [("shape", "shape"), ("mib", "MiB"), ("check_ms", "check ms"), ("check", "check"),
            ("loads_ms", "json.loads ms"), ("loads", "json.loads"), ("check_share", "check/loads")], args=args)


if __name__ == "__main__":
    main()
