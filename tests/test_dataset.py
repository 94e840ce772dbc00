"""The release: Parquet per config and split + card, loaded offline with `datasets`; reproducible; checked; pushed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from huggingface_hub import DatasetCard
from test_tasks import make_steps, rows_of

from themisto.cli import main
from themisto.generation.prompts import text_track_renderer
from themisto.release.card import CARD_TEMPLATE
from themisto.release.check import check_release
from themisto.release.folder import BUILD_FILE, ReleaseError, parquet_name, schema_module, split_card
from themisto.release.parquet import build_release
from themisto.release.push import push_release, upload_plan
from themisto.release.tasks import TaskSettings

# themisto_dataset.py lies at the repository root, which is not on sys.path under every test runner.
themisto_dataset = schema_module()


def sample_rows() -> list[dict]:
    trajectories = [make_steps(f"kernel-{i}", 30 + 7 * i, task=f"task{1 + i % 2}", restarts=(12,)) for i in range(5)]
    return rows_of(*trajectories, participants={"kernel-0": "p-a", "kernel-1": "p-a"})


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("rel") / "themisto-release"
    report = build_release(sample_rows(), out, TaskSettings(seed=1), source={"kind": "test-rows"},
                           prompts=text_track_renderer())
    return out, report


def test_every_config_loads_offline_with_the_declared_features(release):
    out, report = release
    for config in (*themisto_dataset.CONFIGS, *themisto_dataset.PROMPTS_CONFIGS):
        loaded = datasets.load_dataset(str(out), config)
        assert set(loaded) == {s for s, n in report.sizes[config].items() if n}
        for split, ds in loaded.items():
            assert ds.features == themisto_dataset.FEATURES[config]
            assert ds.num_rows == report.sizes[config][split] > 0
    next_cell = datasets.load_dataset(str(out), "next_cell", split="test")
    row = next_cell[0]
    assert row["id"] == f"{row['kernel_id']}/{row['step']}" and row["step"] >= 5
    assert len(row["history"]) == min(10, row["step"])
    steps = datasets.load_dataset(str(out), "trajectories", split="test")
    prev = steps.filter(lambda r: r["kernel_id"] == row["kernel_id"] and r["step"] == row["step"] - 1)[0]
    if not row["restarted_before"]:
        assert row["state_hash_before"] == prev["state_hash"] and row["variables_before"] == prev["variables"]


def test_no_trajectory_is_in_both_splits(release):
    out, _ = release
    by_split = {s: set(datasets.load_dataset(str(out), "trajectories", split=s)["kernel_id"]) for s in ("test", "train")}
    assert by_split["test"] and by_split["train"] and not by_split["test"] & by_split["train"]
    # kernel-0 and kernel-1 share a participant
    assert {"kernel-0", "kernel-1"} <= by_split["test"] or {"kernel-0", "kernel-1"} <= by_split["train"]
    for config in ("next_cell", "output_prediction"):
        for split in ("test", "train"):
            kernels = set(datasets.load_dataset(str(out), config, split=split)["kernel_id"])
            assert kernels <= by_split[split]


def test_two_builds_from_the_same_rows_are_byte_identical(tmp_path):
    hashes = []
    for name in ("a", "b"):
        report = build_release(sample_rows(), tmp_path / name, TaskSettings(seed=1), source={"kind": "test-rows"})
        hashes.append(report.files)
        for rel, digest in report.files.items():
            assert (tmp_path / name / rel).read_bytes() == (tmp_path / "a" / rel).read_bytes()
        assert (tmp_path / name / "README.md").read_text() == (tmp_path / "a" / "README.md").read_text()
    assert hashes[0] == hashes[1] and len(hashes[0]) == 6
    other = build_release(sample_rows(), tmp_path / "c", TaskSettings(seed=2), source={"kind": "test-rows"})
    assert other.content_sha256 != build_release(sample_rows(), tmp_path / "d", TaskSettings(seed=1),
                                                 source={"kind": "test-rows"}).content_sha256


def test_the_card_mirrors_the_features_and_documents_every_field():
    data, body = split_card(CARD_TEMPLATE.read_text(encoding="utf-8"))
    infos = {i["config_name"]: i for i in data["dataset_info"]}
    assert [c["config_name"] for c in data["configs"]] == list(themisto_dataset.CONFIGS)
    for config in themisto_dataset.CONFIGS:
        assert datasets.Features._from_yaml_list(infos[config]["features"]) == themisto_dataset.FEATURES[config]
        for name in themisto_dataset.field_names(config):
            assert f"`{name.split('.')[-1]}`" in body, f"{config}: field {name} is not documented in the card"
    for needed in ("2504.12365", "JuNE", "AUTHORED".lower(), "look-alike", "Limitations", "MIT", "unclear"):
        assert needed.lower() in body.lower()


def test_the_rendered_card_parses_as_a_dataset_card(release):
    out, report = release
    text = (out / "README.md").read_text(encoding="utf-8")
    card = DatasetCard(text)
    assert card.data.license == "other" and card.data.license_name  # not built from the shipped sample
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs

    configs = MetadataConfigs.from_dataset_card_data(card.data)
    assert set(configs) == {*themisto_dataset.CONFIGS, *themisto_dataset.PROMPTS_CONFIGS}
    infos = DatasetInfosDict.from_dataset_card_data(card.data)
    for config, splits in report.sizes.items():
        assert {s: i.num_examples for s, i in infos[config].splits.items()} == {s: n for s, n in splits.items() if n}
    assert report.content_sha256 in text and "{{" not in text
    assert f"| `output_prediction` | {report.sizes['output_prediction']['test']:,} |" in text
    recorded = json.loads((out / BUILD_FILE).read_text())
    assert recorded["content_sha256"] == report.content_sha256 and recorded["sizes"] == report.sizes


def test_check_passes_on_a_fresh_build_and_the_cli_reports_it(release, capsys):
    out, report = release
    assert check_release(out).ok
    assert main(["check", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] and printed["sizes"]["next_cell"]["test"] == report.sizes["next_cell"]["test"]


def _copy(release, tmp_path) -> Path:
    import shutil

    dest = tmp_path / "copy"
    shutil.copytree(release[0], dest)
    return dest


def test_check_reports_a_missing_split(release, tmp_path, capsys):
    folder = _copy(release, tmp_path)
    (folder / parquet_name("next_cell", "train")).unlink()
    assert main(["check", str(folder)]) == 1
    assert "next_cell/train: no file matches" in capsys.readouterr().out


def test_check_reports_a_missing_config(release, tmp_path, capsys):
    folder = _copy(release, tmp_path)
    data, body = split_card((folder / "README.md").read_text())
    data["configs"] = [c for c in data["configs"] if c["config_name"] != "output_prediction"]
    (folder / "README.md").write_text(f"---\n{yaml.safe_dump(data, sort_keys=False)}---\n{body}")
    assert main(["check", str(folder)]) == 1
    assert "config 'output_prediction' is missing" in capsys.readouterr().out


def test_check_reports_a_schema_mismatch(release, tmp_path, capsys):
    folder = _copy(release, tmp_path)
    path = folder / parquet_name("trajectories", "test")
    table = pq.read_table(path)
    index = table.schema.get_field_index("memory_bytes")
    table = table.set_column(index, "memory_bytes", pa.array([str(v) for v in table["memory_bytes"].to_pylist()]))
    table = table.drop_columns(["state_hash"])
    pq.write_table(table, path)
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "column 'memory_bytes' is string, declared int64" in out
    assert "column 'state_hash' is missing" in out
    assert "sha256 differs" in out


def test_a_step_that_lost_a_workspace_file_fails_the_build(tmp_path):
    rows = sample_rows()
    bad = next(r for r in rows if r["kernel_id"] == "kernel-2" and r["step"] == 1)
    bad.update(status="error", ename="FileNotFoundError",
               evalue="[Errno 2] No such file or directory: 'data/task1/jetnet_logs/jetnet_logs.txt'")
    with pytest.raises(ReleaseError, match=r"trajectory kernel-2 step 1: .*'data/task1/jetnet_logs/jetnet_logs.txt'"
                                           r" where the log recorded ok"):
        build_release(rows, tmp_path / "out", source={"kind": "test-rows"})
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []  # nothing half-written
    report = build_release(rows, tmp_path / "out", source={"kind": "test-rows"}, allow_missing_files=True)
    assert any("kernel-2 step 1" in n for n in report.notes)


def test_a_non_empty_folder_is_not_overwritten_unless_asked(release, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ReleaseError, match="not an empty folder"):
        build_release(sample_rows(), tmp_path, source={"kind": "test-rows"})
    assert (tmp_path / "keep.txt").read_text() == "mine"


class FakeHubApi_for_tests:
    """Records the calls a push makes instead of reaching the Hub."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def create_repo(self, **kwargs):
        self.calls.append(("create_repo", kwargs))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        return "commit-1"


def test_push_creates_the_dataset_repo_and_uploads_the_checked_files(release):
    out, report = release
    plan = upload_plan(out, "someone/themisto-sample", private=True)
    assert set(plan.files) == {"README.md", "eval.yaml", BUILD_FILE, *report.files}
    assert plan.commit_message.endswith(report.content_sha256[:12])
    api = FakeHubApi_for_tests()
    assert push_release(plan, api) == "commit-1"
    (name1, create), (name2, upload) = api.calls
    assert name1 == "create_repo" and create == {"repo_id": "someone/themisto-sample", "repo_type": "dataset",
                                                 "private": True, "exist_ok": True}
    assert name2 == "upload_folder" and upload["repo_type"] == "dataset" and upload["folder_path"] == str(out)
    assert sorted(upload["allow_patterns"]) == sorted(plan.files)


def test_push_refuses_a_broken_release_and_a_bad_repo_id(release, tmp_path):
    with pytest.raises(ReleaseError, match="owner/name"):
        upload_plan(release[0], "no-owner")
    folder = _copy(release, tmp_path)
    (folder / parquet_name("trajectories", "test")).unlink()
    with pytest.raises(ReleaseError, match="not pushed"):
        upload_plan(folder, "someone/x")


def test_cli_push_dry_run_lists_the_plan(release, capsys):
    assert main(["push", str(release[0]), "--repo-id", "someone/x", "--dry-run", "--json", "--private"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["dry_run"] and printed["repo_id"] == "someone/x" and "README.md" in printed["files"]
    # Rows of no known licence may not go to a public repository, not even in a dry run.
    assert main(["push", str(release[0]), "--repo-id", "someone/x", "--dry-run"]) == 2
    assert "under unknown: status unclear" in capsys.readouterr().err


def test_cli_build_from_an_existing_replay(tmp_path, capsys):
    steps = [s for i in range(4) for s in make_steps(f"kernel-{i}", 25)]
    steps_file = tmp_path / "steps.jsonl"
    steps_file.write_text("".join(json.dumps(s.to_dict()) + "\n" for s in steps))
    out = tmp_path / "rel"
    assert main(["build", "--steps", str(steps_file), "-o", str(out), "--split-seed", "4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["source"]["kind"] == "replayed-steps" and printed["settings"]["seed"] == 4
    assert printed["sizes"]["trajectories"]["test"] + printed["sizes"]["trajectories"]["train"] == 100
    assert main(["check", str(out)]) == 0
    assert main(["build", "--steps", str(steps_file), "-o", str(out)]) == 2  # exists: not overwritten
    assert "not an empty folder" in capsys.readouterr().err
    assert re.search(r"license: other", (out / "README.md").read_text())


@pytest.mark.slow
def test_cli_build_replays_a_notebook_in_a_real_kernel_and_the_release_loads(tmp_path, capsys):
    import nbformat

    cells = ["import math", "values = [math.sqrt(i) for i in range(10)]", "len(values)", "total = sum(values)",
             "print(round(total, 3))", "squares = {i: i * i for i in range(6)}", "print(squares)",
             "values[:3]", "def mean(xs):\n    return sum(xs) / len(xs)", "print(mean(values))", "1 / 0",
             "print(sorted(squares.values(), reverse=True))"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code, execution_count=i + 1)
                                               for i, code in enumerate(cells)])
    path = tmp_path / "analysis.ipynb"
    nbformat.write(notebook, path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    out = tmp_path / "rel"
    assert main(["build", str(path), "--workspace", str(workspace), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"]["kind"] == "notebooks" and report["sizes"]["trajectories"] == {"test": 12, "train": 0}
    assert any("train` is empty" in note for note in report["notes"])
    assert (tmp_path / "rel.steps.jsonl").exists()  # the replay is kept beside the release, for resuming
    steps = datasets.load_dataset(str(out), "trajectories", split="test")
    by_step = {r["step"]: r for r in steps}
    assert by_step[4]["output"].strip() == f"{round(sum(i ** 0.5 for i in range(10)), 3)}"
    assert by_step[10]["status"] == "error" and by_step[10]["ename"] == "ZeroDivisionError"
    assert {"values", "total"} <= {v["name"] for v in by_step[4]["variables"]}
    assert by_step[4]["memory_bytes"] > 0 and by_step[3]["state_hash"] != by_step[2]["state_hash"]
    assert by_step[4]["state_hash"] == by_step[3]["state_hash"]  # print() changes no variable
    outputs = datasets.load_dataset(str(out), "output_prediction", split="test")
    row = next(r for r in outputs if r["step"] == 6)
    assert row["target"].strip() == "{0: 0, 1: 1, 2: 4, 3: 9, 4: 16, 5: 25}"
    assert {"squares", "values", "total"} <= {v["name"] for v in row["variables_before"]}
    assert main(["check", str(out)]) == 0


def test_size_category_follows_the_hub_buckets():
    from themisto.release.card import size_category

    assert [size_category(n) for n in (0, 999, 1000, 54_321, 2_000_000)] == [
        "n<1K", "n<1K", "1K<n<10K", "10K<n<100K", "1M<n<10M"]


def test_check_reports_a_trajectory_in_both_splits(release, tmp_path, capsys):
    folder = _copy(release, tmp_path)
    test_rows = pq.read_table(folder / parquet_name("trajectories", "test"))
    train_path = folder / parquet_name("trajectories", "train")
    train_rows = pq.read_table(train_path)
    leaked = test_rows.slice(0, 1)
    pq.write_table(pa.concat_tables([train_rows, leaked]), train_path)
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"trajectories ['{leaked['kernel_id'][0]}'] are in both `test` and `train`" in out
    assert f"trajectories/train: {train_rows.num_rows + 1} rows, the card says {train_rows.num_rows}" in out
