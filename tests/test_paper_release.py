"""Reading rows shaped like the paper's published release into `trajectories` rows, and building tasks from them."""

from __future__ import annotations

import csv
import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from themisto.release.paper_rows import PaperReleaseError, paper_rows, read_paper_release
from themisto.release.check import check_release
from themisto.release.folder import schema_module
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings

# themisto_dataset.py lies at the repository root, which is not on sys.path under every test runner.
themisto_dataset = schema_module()

CODES = ["import pandas as pd", "df = pd.read_pickle('data/task2/train_features.pkl')", "df.shape", "df.head(3)",
         "y = df['primary_label']", "y.value_counts()", "X = df.drop(columns=['primary_label'])", "X.shape",
         "from sklearn.linear_model import LogisticRegression", "model = LogisticRegression(max_iter=200)",
         "model.fit(X.select_dtypes('number'), y)", "model.score(X.select_dtypes('number'), y)"]


def paper_like(kernel: str, n: int) -> list[dict]:
    """Rows with the paper's names: kernel_id, code, output, execution_time, memory, runtime variables, hash."""
    rows = []
    for i in range(n):
        variables = {"df": {"size": 1_204_000 + i, "repr": "      filename cell_type ..."},
                     "y": {"size": 48_000, "repr": "0    code\n1    markdown ..."}} if i >= 4 else {}
        rows.append({"kernel_id": kernel, "step": i, "code": CODES[i % len(CODES)],
                     "output": f"({5833 + i}, 32)" if i % 3 else "",
                     "execution_time": 0.01 * (i + 1), "memory": 90_000_000 + 512 * i,
                     "runtime_variables": json.dumps(variables), "hash": f"{kernel}-state-{i}"})
    return rows


def test_parquet_rows_in_the_papers_shape_become_trajectory_rows(tmp_path):
    records = paper_like("k-2", 12) + paper_like("k-1", 8)
    records.reverse()  # file order is not step order
    path = tmp_path / "themisto.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    rows = read_paper_release(path)
    assert [(r["kernel_id"], r["step"]) for r in rows] == [("k-1", i) for i in range(8)] + [("k-2", i) for i in range(12)]
    assert all(set(r) == set(themisto_dataset.TRAJECTORIES) for r in rows)
    row = rows[8 + 5]
    assert row["code"] == CODES[5] and row["output"] == "(5838, 32)"
    assert row["execution_time"] == pytest.approx(0.06) and row["memory_bytes"] == 90_000_000 + 512 * 5
    assert row["state_hash"] == "k-2-state-5" and row["status"] == "ok" and row["logged_status"] is None
    df = {v["name"]: v for v in row["variables"]}["df"]
    assert df["size"] == 1_204_005 and df["repr"].startswith("      filename") and df["shape"] is None


def test_alternate_names_missing_columns_and_nbformat_outputs(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [
        {"Kernel ID": "k", "cell_source": "print('hi')", "cell_output": [{"output_type": "stream", "text": ["hi\n"]}],
         "Execution Time": "15 ms", "Memory Usage": "1.5 MiB", "variables": [{"name": "a", "repr": 1, "size": 28}]},
        {"Kernel ID": "k", "cell_source": "1/0", "cell_output": [
            {"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": []}],
         "ename": "ZeroDivisionError"},
        {"Kernel ID": "k", "cell_source": "x = 2", "runtime variables": {"x": "2"}},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = read_paper_release(path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    first, second, third = rows
    assert first["output"] == "hi\n" and first["execution_time"] == pytest.approx(0.015)
    assert first["memory_bytes"] == int(1.5 * 2**20) and first["variables"][0]["repr"] == "1"
    assert second["status"] == "error" and second["output"] == "ZeroDivisionError: division by zero"
    assert third["variables"] == [dict.fromkeys(themisto_dataset.VARIABLE) | {"name": "x", "repr": "2"}]
    assert third["memory_bytes"] is None and third["state_hash"] is None and third["output"] == ""


def test_csv_copies_with_empty_cells(tmp_path):
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["kernel_id", "code", "output", "execution_time", "memory_bytes", "task"])
        writer.writeheader()
        writer.writerow({"kernel_id": "k", "code": "a = 1", "output": "", "execution_time": "0.5",
                         "memory_bytes": "", "task": ""})
    (row,) = read_paper_release(path)
    assert row["execution_time"] == 0.5 and row["memory_bytes"] is None and row["task"] is None


def test_bad_rows_are_named(tmp_path):
    with pytest.raises(PaperReleaseError, match="row 1: no kernel id"):
        paper_rows([{"kernel_id": "k", "code": "a"}, {"code": "b"}])
    with pytest.raises(PaperReleaseError, match="row 0: no code"):
        paper_rows([{"kernel_id": "k", "output": "x"}])
    with pytest.raises(PaperReleaseError, match="row 0: expected a number for memory_bytes"):
        paper_rows([{"kernel_id": "k", "code": "a", "memory": "lots"}])
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kernel_id": "k", "code": "a"}\n{not json\n')
    with pytest.raises(PaperReleaseError, match=r"bad.jsonl:2: not JSON"):
        read_paper_release(path)


def test_a_release_built_from_paper_rows_loads(tmp_path):
    rows = paper_rows(paper_like("k-a", 40) + paper_like("k-b", 30) + paper_like("k-c", 35))
    out = tmp_path / "rel"
    report = build_release(rows, out, TaskSettings(seed=0), source={"kind": "paper-release"})
    assert check_release(out).ok
    loaded = datasets.load_dataset(str(out), "output_prediction", split="test")
    assert loaded.num_rows == report.sizes["output_prediction"]["test"] > 0
    assert all(r["step"] >= 5 and r["target"] for r in loaded)
