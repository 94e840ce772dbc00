"""Output equivalence: each rule with a pair that must match and one that must not, on real pandas reprs, real
tracebacks, real images and the real outputs of the JuNE participant's final notebooks."""

import base64
import io
import json
import random
import re
import traceback

import numpy as np
import pandas as pd
import pytest

from themisto.scoring.equivalence import image_placeholder, outputs_equivalent
from themisto.scoring.frame_text import parse_table
from themisto.runtime.outputs import output_text, rich_outputs


def _same(pred, ref, rule):
    verdict = outputs_equivalent(pred, ref)
    assert outputs_equivalent(ref, pred).equal  # the rules are symmetric
    assert verdict.equal, verdict
    assert verdict.rule == rule, verdict
    return verdict


def _different(pred, ref, rule=None):
    verdict = outputs_equivalent(pred, ref)
    assert not outputs_equivalent(ref, pred).equal
    assert not verdict.equal, verdict
    assert verdict.reason
    if rule:
        assert verdict.rule == rule, verdict
    return verdict


def _repr(obj, **options):
    with pd.option_context(*[item for pair in options.items() for item in pair]):
        return repr(obj)


def test_exact_after_whitespace():
    _same("  total: 3  \r\n\n", "  total: 3", "exact")
    _different("a b", "a  b", "none")


@pytest.mark.parametrize("pred, ref", [
    ("0.30000000000000004", "0.3"),
    ("np.float64(1.5)", "1.5"),
    ("1e3", "1000.0"),
    ("[np.float64(0.1), np.int64(2), np.True_]", "[0.1, 2, True]"),
    ("mean  =  0.30000000000000004\nstd = 1e-12", "mean = 0.3\nstd = 0.0"),
    ("(5833, 32)", "(5833,   32)"),
])
def test_numbers_within_tolerance(pred, ref):
    _same(pred, ref, "numbers")


@pytest.mark.parametrize("pred, ref", [
    ("3", "4"),
    ("100000001", "100000000"),  # integers are counts: no tolerance
    ("0.31", "0.3"),
    ("x - 1", "x + 1"),
    ("mean = 0.3", "median = 0.3"),
    ("pandas 1.5.2", "pandas 1.5.20"),  # versions are not numbers
    ("9" * 5000, "9" * 4999 + "8"),  # beyond int()'s 4,300-digit limit
])
def test_numbers_that_differ(pred, ref):
    _different(pred, ref)


def test_tolerances_are_arguments():
    assert not outputs_equivalent("1.001", "1.0").equal
    assert outputs_equivalent("1.001", "1.0", rel_tol=1e-2).equal
    assert outputs_equivalent("1e-12", "0.0").equal
    assert not outputs_equivalent("1e-12", "0.0", abs_tol=0.0).equal


@pytest.fixture()
def frame():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"user_id": np.arange(100) * 7, "mean": rng.integers(0, 400, 100) / 4,
                       "when": pd.date_range("2019-09-20", periods=100, freq="h"), "name": ["New York", "LA"] * 50})
    df.loc[3, "mean"] = np.nan
    return df


def test_truncated_frames_compare_visible_cells(frame):
    ref = _repr(frame, **{"display.max_rows": 10})  # 5 head + 5 tail rows
    pred = _repr(frame, **{"display.max_rows": 8, "display.min_rows": 8, "display.precision": 3})  # 4 + 4
    assert "..." in ref and "[100 rows x 4 columns]" in pred
    verdict = _same(pred, ref, "table")
    assert verdict.reason.startswith("32 visible cell(s)")  # 8 common rows x 4 columns, NaN among them
    cols = _repr(frame, **{"display.max_columns": 2, "display.max_rows": 10})  # only the first and last column
    _same(cols, ref, "table")

    changed = frame.copy()
    changed.loc[98, "name"] = "Boston"
    _different(_repr(changed, **{"display.max_rows": 8, "display.min_rows": 8}), ref, "table")
    changed = frame.copy()
    changed.loc[3, "mean"] = 0.5  # NaN only equals NaN
    assert "cell ['3', 'mean']" in _different(_repr(changed, **{"display.max_rows": 10}), ref, "table").reason
    shorter = _repr(frame.iloc[:99], **{"display.max_rows": 8, "display.min_rows": 8})
    assert "shapes differ" in _different(shorter, ref, "table").reason


def test_small_frames_and_index_names(frame):
    small = frame.head(4).set_index("name")
    ref = repr(small)
    pred = ref.replace("  0.500000", "  0.5000000000001").replace("NaN", "nan")  # printed another way
    _same(pred, ref, "table")
    _different(repr(small.rename(columns={"mean": "avg"})), ref)


def test_layouts_pandas_prints(frame):
    # A date column only 1 blank after the index, a label of several words over short cells, and short labels
    # printed left of their cells (pandas pads all labels to the longest before aligning them).
    dates = frame[["when", "mean"]].rename(columns={"mean": "average per day"})
    _same(_repr(dates, **{"display.max_rows": 8, "display.min_rows": 8}), _repr(dates, **{"display.max_rows": 10}),
          "table")
    table = parse_table(repr(dates.head(3)))
    assert table.cells[("2", 1, "when", 1)] == "2019-09-20 02:00:00"
    assert table.cells[("2", 1, "average per day", 1)] == "51.0"
    for columns in (12, 1200):
        wide = pd.DataFrame(np.arange(3 * columns).reshape(3, columns) / 7)
        text = _repr(wide, **{"display.max_columns": None, "display.width": 100000})
        header, first = text.split("\n")[:2]
        shift = len(str(columns - 1)) - 1
        assert header.index(" 0 ") + 1 + shift == first.index("0.000000") + 7  # label "0" ends left of its cells
        table = parse_table(text)
        last = 3 * columns - 1
        assert table.shape == (3, columns) and table.cells[("2", 1, str(columns - 1), 1)] == f"{last / 7:.6f}"
        assert "cell ['0', '0']" in _different(text.replace("0.000000", "0.000001", 1), text, "table").reason


def test_series(frame):
    series = frame["mean"].rename("x")
    ref = _repr(series, **{"display.max_rows": 10})
    assert ref.endswith("Name: x, Length: 100, dtype: float64")
    _same(_repr(series, **{"display.max_rows": 6, "display.min_rows": 6}), ref, "table")
    _different(_repr(series.rename("y"), **{"display.max_rows": 6, "display.min_rows": 6}), ref, "table")
    small = pd.Series([1, 2, 3], name="x")
    assert repr(small).endswith("Name: x, dtype: int64")
    _same("0   1\n1   2\n2   3\nName: x, dtype: int64", repr(small), "numbers")
    _different(repr(small.astype(float)), repr(small))  # the dtype line differs
    assert parse_table(repr(small)).shape == (3, 1)


def test_malformed_tables_fall_back_to_string_rules():
    odd = ["[3 rows x 2 columns]", "\n\n[3 rows x 2 columns]", "a\n\n[1 rows x 1 columns]", "dtype: int64",
           "   ...\n ..  ...\n\n[9 rows x 9 columns]", "x\n\\\n\\", "  a\n0  1  2  3\n\n[1 rows x 1 columns]"]
    for text in odd:
        assert outputs_equivalent(text, text).equal
        assert outputs_equivalent(text, text.replace("9", "8")).equal == ("9" not in text)
    _same("   a\n0  1.0\n1  2.00000000001\nb  3\n\n[2 rows x 1 columns]",
          "   a\n0  1.0\n1  2.0\nb  3\n\n[2 rows x 1 columns]", "numbers")


def _raise(code):
    try:
        exec(code, {})
    except Exception as exc:  # noqa: BLE001 - any error is the fixture
        return "".join(traceback.format_exception(exc))
    raise AssertionError(f"{code!r} did not raise")


def test_errors_by_name_and_message():
    python_tb = _raise("{}['a']")
    assert python_tb.startswith("Traceback (most recent call last):")
    _same("KeyError: 'a'", python_tb, "error")
    _different("KeyError: 'b'", python_tb, "error")
    _different("ValueError: 'a'", python_tb, "error")
    _different("'a'", python_tb, "error")
    _different("printed first\nKeyError: 'a'", python_tb, "error")
    _same("printed first\n" + python_tb, "printed first\nKeyError: 'a'\n" + "-" * 75 + "\nCell In[4], line 1", "error")
    _same("TypeError: cannot pickle <lock object at 0x7f3a2b1c90>", "TypeError: cannot pickle <lock object at "
          "0x7f00dd>", "error")
    _same("FileNotFoundError: [Errno 2] No such file or directory: '/tmp/ws-1a2b/data/logs.csv'",
          "FileNotFoundError: [Errno 2] No such file or directory: 'D:\\nup\\data\\logs.csv'", "error")
    _different("FileNotFoundError: [Errno 2] No such file or directory: '/tmp/ws/data/a.csv'",
               "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/ws/data/b.csv'", "error")
    _same("pandas.errors.ParserError: Error tokenizing data", "ParserError: Error tokenizing data", "error")
    _same("SyntaxError: invalid syntax (2218459243.py, line 2)\n  Cell In[7], line 2\n    x =\n       ^",
          "SyntaxError: invalid syntax (1049311137.py, line 1)", "error")
    # A line printed by an `except` is not the cell's error: the text after it still counts.
    _different("ValueError: bad row\nrows kept: 10", "ValueError: bad row\nrows kept: 12", "numbers")
    _different(python_tb + "more", "KeyError: 'a'", "error")


@pytest.mark.slow
def test_error_from_a_real_kernel():
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        msg_id = client.execute("d = {}\nprint('before')\nd['a']")
        outputs = []
        while True:
            msg = client.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                break
            if kind == "stream":
                outputs.append({"output_type": "stream", "name": content["name"], "text": content["text"]})
            elif kind == "error":
                outputs.append({"output_type": "error", **content})
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    text = output_text(outputs)
    assert "Traceback" in text and "Cell In[" in text
    _same(text, "before\nKeyError: 'a'", "error")
    _same(text, "before\n" + _raise("{}['a']"), "error")
    _different(text, "before\nKeyError: 'b'", "error")
    _different(text, "KeyError: 'a'", "error")


def _png_outputs():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots()
    axes.plot([1, 2, 3])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    data = base64.b64encode(buffer.getvalue()).decode()
    return [{"output_type": "display_data", "metadata": {},
             "data": {"text/plain": "<Figure size 640x480 with 1 Axes>", "image/png": data}}]


def test_images_by_mime():
    outputs = _png_outputs()
    (rich,) = rich_outputs(outputs)
    placeholder = image_placeholder(rich["mime"], rich["bytes"])
    assert re.fullmatch(r"<image/png \d{4,} bytes>", placeholder)
    _same(placeholder, "<image/png 12 bytes>", "image")
    _same(output_text(outputs) + "\n" + placeholder, "<Figure size 1500x600 with 1 Axes>\n<image/png 9 bytes>",
          "image")
    _different(placeholder, "<image/jpeg 12 bytes>", "image")
    _different(placeholder, "[1, 2, 3]", "image")
    _different("<Figure size 640x480 with 2 Axes>", "<Figure size 640x480 with 1 Axes>", "image")
    _different("Text(0, 0.5, 'per day')\n<Figure size 640x480 with 1 Axes>",
               "Text(0, 0.5, 'per hour')\n<Figure size 640x480 with 1 Axes>", "image")


@pytest.mark.parametrize("odd", [None, b"KeyError: 'a'", 3.0, "", "\x00", "...", "\\", "[0 rows x 0 columns]"])
def test_odd_input_never_raises(odd):
    # Odd input never matches a real output, in either order; a non-string never matches even itself.
    for pred, ref in ((odd, "0.3"), ("0.3", odd)):
        assert outputs_equivalent(pred, ref).equal is False
    same = outputs_equivalent(odd, odd)
    assert (same.equal, same.rule) == ((True, "exact") if isinstance(odd, str) else (False, "invalid"))


def _real_outputs(june_dir):
    texts = []
    for name in ("participant-final-task1.ipynb", "participant-final-task2.ipynb"):
        notebook = json.loads((june_dir / name).read_text(encoding="utf-8"))
        for cell in notebook["cells"]:
            if cell["cell_type"] == "code" and cell.get("outputs"):
                texts.append(output_text(cell["outputs"]))
    return texts


def test_real_tables_parse(june_dir):
    tables = [t for t in map(parse_table, _real_outputs(june_dir)) if t is not None]
    # Task 1: three truncated frames and one frame wrapped in two blocks; task 2: three Series.
    assert sorted((t.kind, t.shape) for t in tables) == [
        ("DataFrame", (10, 7)), ("DataFrame", (143, 1)), ("DataFrame", (1974979, 4)), ("DataFrame", (2053710, 4)),
        ("Series", (10, 1)), ("Series", (10, 1)), ("Series", (1927, 1))]
    wrapped = next(t for t in tables if t.shape == (10, 7))
    assert wrapped.cells[("957130", 1, "action_time", 1)] == "2019-09-20 13:44:16"
    assert wrapped.cells[("754337", 1, "new_session_num", 1)] == "4"


def test_real_outputs_one_digit_changed(june_dir):
    rng = random.Random(3)
    checked = 0
    for text in _real_outputs(june_dir):
        assert outputs_equivalent(text, text).equal
        # The leading digit of a number, so that the change is far beyond the tolerance.
        digits = [m.start() for m in re.finditer(r"(?<![\d.])[1-8]", text)]
        if not digits or "Traceback" in text:
            continue  # line numbers inside tracebacks are normalised away on purpose
        for position in rng.sample(digits, min(5, len(digits))):
            changed = text[:position] + str(int(text[position]) + 1) + text[position + 1:]
            if any(m.start(1) <= position < m.end(1) for m in re.finditer(r"<Figure size ([\d.x]+) with", text)):
                assert outputs_equivalent(changed, text).equal  # a figure's size is not compared
            else:
                assert not outputs_equivalent(changed, text).equal, (text[position - 30:position + 30])
            checked += 1
    assert checked > 50


def test_fuzz_never_raises_and_is_symmetric(june_dir):
    fragments = ["0", "1.5", "-2", "1e3", "NaN", "...", "..", " ", "  ", "\n", "\n\n", "\\", "a", "x y", "é", "\t",
                 "[3 rows x 2 columns]", "dtype: int64", "Name: x, Length: 9, dtype: float64", "KeyError: 'a'",
                 "Traceback (most recent call last):", "-" * 75, "<image/png 5 bytes>", "<Figure size 6x4 with 1 Axes>",
                 "np.float64(", ")"]
    real = _real_outputs(june_dir)
    rng = random.Random(11)
    for _ in range(400):
        texts = ["".join(rng.choices(fragments, k=rng.randint(0, 12))) for _ in range(2)]
        if rng.random() < 0.3:
            source = rng.choice(real)
            cut = rng.randrange(len(source))
            texts = [source[:cut] + texts[0] + source[cut:], source]
        forward, backward = outputs_equivalent(*texts), outputs_equivalent(*reversed(texts))
        assert forward.equal == backward.equal, (texts, forward, backward)
        assert outputs_equivalent(texts[0], texts[0]).equal
