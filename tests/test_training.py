"""Fine-tuning data and training: sft-export (verified targets, generation's own prompts, bad input), then TRL
fine-tuning of the tiny local model, generation through the transformers backend and scoring with intervals."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from test_tasks import make_steps, rows_of

from themisto.cli import main
from themisto.generation.backends.hf import TransformersBackend
from themisto.generation.prompts import extract_answer, messages_text
from themisto.generation.example_spec import ExampleSpec
from themisto.generation.runs import RunSettings, generate_run
from themisto.generation.backends import Sampling
from themisto.release.folder import BUILD_FILE
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings
from themisto.runtime.agent import OUTPUT_CAP_MARKER
from themisto.training.export import ExportSettings, export_sft, fenced
from themisto.training.finetune import FinetuneError, FinetuneSettings, checkpoints_folder, finetune
from themisto.training.verify import VerificationError, Verifier
from themisto.vocabulary import STATIC_CONTEXT_MODES
from themisto.release.folder import open_release

REPO = Path(__file__).resolve().parents[1]
DIVERGED_STEP = 12  # replay raised NameError where the developer's run was ok
RESTART_STEP = 20  # a logged restart
CAPPED_STEP = 24  # the kernel's output cap cut this step's output


def _kernel(kernel_id: str, task: str) -> list:
    steps = make_steps(kernel_id, 30, task=task, restarts=(RESTART_STEP,))
    # Outputs that name their trajectory: otherwise the four trajectories would give the same prompts, and the export
    # keeps one copy of each.
    steps = [replace(s, output=f"{s.output}<{kernel_id}>") if s.output else s for s in steps]
    steps[DIVERGED_STEP] = replace(steps[DIVERGED_STEP], status="error", ename="NameError",
                                   evalue="name 'x' is not defined", output_types=["error"])
    capped = steps[CAPPED_STEP]
    marker = OUTPUT_CAP_MARKER.format(total=2_000_000, cap=1_000_000)
    steps[CAPPED_STEP] = replace(capped, output=capped.output + marker)
    return steps


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """Four replayed trajectories (two participants per split), each with a diverged step and a capped output."""
    trajectories = [_kernel(f"kernel-{i}", f"task{1 + i % 2}") for i in range(4)]
    out = tmp_path_factory.mktemp("training") / "release"
    build_release(rows_of(*trajectories), out, TaskSettings(seed=5, output_sample_size=None),
                  source={"kind": "test-rows"})
    return out


@pytest.fixture(scope="module")
def exported(release, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "train"
    assert main(["sft-export", "--release", str(release), "-o", str(out)]) == 0
    return out


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _release_rows(release: Path, config: str, split: str) -> list[dict]:
    import datasets

    return list(datasets.load_dataset(str(release), config, split=split))


def _expected_reason(row: dict, task: str) -> str | None:
    if row["step"] == DIVERGED_STEP:
        return "status_differs"
    if row["step"] == CAPPED_STEP and task == "output_prediction":
        return "output_capped"
    if any(cell["step"] == DIVERGED_STEP for cell in row["history"]):
        return "history_diverged"
    return None


# ---------------------------------------------------------------------------------------------------------------
# export


def test_export_keeps_verified_targets_in_every_context_and_counts_why_others_are_dropped(release, exported):
    examples = _lines(exported / "examples.jsonl")
    manifest = json.loads((exported / "manifest.json").read_text())
    build = json.loads((release / BUILD_FILE).read_text())
    assert manifest["release"]["content_hash"] == build["content_sha256"] and manifest["split"] == "train"
    for task in ("next_cell", "output_prediction"):
        rows = _release_rows(release, task, "train")
        expected = Counter(_expected_reason(r, task) for r in rows)
        dropped = {reason: n for reason, n in manifest["dropped"][task].items() if n}
        assert dropped == {reason: n for reason, n in expected.items() if reason}
        kept = {r["id"]: r for r in rows if _expected_reason(r, task) is None}
        mine = [e for e in examples if e["task"] == task]
        assert Counter(e["context"] for e in mine) == {c: len(kept) for c in ("none", "variables", "full")}
        assert manifest["counts"]["by_task_context"][task] == {c: len(kept) for c in ("none", "variables", "full")}
        for example in mine:
            # The completion is the answer generation extracts back: the reference itself.
            answer = extract_answer(example["completion"][0]["content"], task)
            target = kept[example["id"]]["target"]
            assert answer == (target.strip() if task == "next_cell" else target.strip("\n"))
            assert [m["role"] for m in example["prompt"]] == ["system", "user"]
    assert {a["name"] for a in manifest["augmentation"]} == {"all_eligible_steps", "context_mix_all"}
    assert len(manifest["dropped_examples"]) == sum(sum(d.values()) for d in manifest["dropped"].values())
    import datasets

    loaded = datasets.load_from_disk(str(exported / "dataset"))
    assert loaded.to_list() == examples


def test_fences_longer_than_any_backtick_run_in_the_target():
    text = "print('''\n```\nnot the end\n```\n''')"
    block = fenced(text, "python")
    assert block.startswith("````python\n") and extract_answer(block, "next_cell") == text


def test_verifier_treats_an_interrupt_as_reproduced_and_checks_the_history_the_prompt_shows():
    def row(step, status="ok", logged="ok", **extra):
        return {"kernel_id": "k", "step": step, "status": status, "logged_status": logged, "ename": None,
                "logged_ename": None, "output_types": [], "logged_output_types": [], "output": "", **extra}

    def task_row(step, history):
        return {"id": f"k/{step}", "kernel_id": "k", "step": step, "history": [{"step": h} for h in history]}

    rows = [row(0), row(1, "timeout", "error", logged_ename="KeyboardInterrupt"), row(2),
            row(3, "error", "ok", ename="NameError"), row(4), row(5, output_types=["stream"], output="x\n"),
            row(6, logged="unknown")]
    verifier = Verifier(rows)
    assert verifier.problem(task_row(2, [0, 1]), "next_cell") is None
    assert verifier.problem(task_row(3, [1, 2]), "next_cell") == "status_differs"
    assert verifier.problem(task_row(4, [2, 3]), "next_cell") == "history_diverged"
    assert verifier.problem(task_row(5, [4]), "next_cell") is None
    assert verifier.problem(task_row(5, [4]), "output_prediction") == "output_types_differ"
    assert verifier.problem(task_row(6, [5]), "next_cell") == "outcome_not_logged"
    with pytest.raises(VerificationError, match="k/9: step 9 is not in"):
        verifier.problem(task_row(9, []), "next_cell")


def test_mix_one_renders_each_verified_row_once_in_a_seeded_context(release, tmp_path):
    report = export_sft(open_release(release), tmp_path / "one", ExportSettings(mix="one", seed=1, tasks=("next_cell",)))
    examples = _lines(tmp_path / "one" / "examples.jsonl")
    assert len({e["id"] for e in examples}) == len(examples) == report.examples
    assert len({e["context"] for e in examples}) > 1
    assert report.manifest["augmentation"][-1]["name"] == "context_mix_one"


def test_export_refuses_bad_input_in_one_line_and_writes_nothing(release, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["sft-export", "--release", str(release), "--split", "validation", "-o", str(out)]) == 2
    assert "--split validation: expected one of test, train, all" in capsys.readouterr().err  # no split of any
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["sft-export", "--release", str(release), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not an empty folder (pass --overwrite" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # A release whose rows carry no snapshot cannot fill the variables mode; `none` still exports.
    bare = [replace(s, variables=[], state_hash=None) for s in make_steps("kernel-bare", 24)]
    bare += [replace(s, variables=[], state_hash=None) for s in make_steps("kernel-bare-2", 24)]
    no_state = tmp_path / "no-state"
    build_release(rows_of(bare), no_state, TaskSettings(seed=5), source={"kind": "test-rows"})
    split = "train" if (no_state / "next_cell" / "train-00000-of-00001.parquet").exists() else "test"
    args = ["sft-export", "--release", str(no_state), "--split", split, "--task", "next_cell"]
    assert main([*args, "--context", "variables", "-o", str(tmp_path / "v")]) == 2
    assert "needs runtime snapshots" in capsys.readouterr().err
    assert main([*args, "--context", "none", "-o", str(tmp_path / "n")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n", "no-state", "out"]  # no temporary folder left


def test_export_prompts_are_byte_identical_to_what_generate_sends(release, tiny_model_dir, tmp_path):
    """The messages a real run hands its backend (captured at the backend) equal the exported prompts byte for
    byte, for every task and context mode, and so does the text the backend's chat template makes of them."""

    class RecordingBackend(TransformersBackend):
        def generate(self, prompts, sampling):
            sent.extend(prompts)
            return super().generate(prompts, sampling)

    export = tmp_path / "test-export"
    export_sft(open_release(release), export, ExportSettings(split="test", verify=False, contexts=STATIC_CONTEXT_MODES))
    exported = {(e["id"], e["task"], e["context"]): e["prompt"] for e in _lines(export / "examples.jsonl")}
    backend = RecordingBackend(str(tiny_model_dir), device="cpu")
    for task in ("next_cell", "output_prediction"):
        sent: list = []
        settings = RunSettings(ExampleSpec(tasks=(task,), contexts=STATIC_CONTEXT_MODES, limit=3),
                               backend="transformers", model=str(tiny_model_dir), sampling=Sampling(max_new_tokens=2))
        generate_run(open_release(release), tmp_path / f"run-{task}", settings, backend=backend, progress=False)
        assert len(sent) == 3 * len(STATIC_CONTEXT_MODES) and "trace" in STATIC_CONTEXT_MODES
        assert all("State after it: {" in p.messages[1]["content"] for p in sent if p.context == "trace")
        for prompt in sent:
            mine = exported[(prompt.id, task, prompt.context)]
            assert json.dumps(mine, ensure_ascii=False).encode() == json.dumps(prompt.messages,
                                                                               ensure_ascii=False).encode()
            assert backend._text(mine) == backend._text(prompt.messages)


# ---------------------------------------------------------------------------------------------------------------
# fine-tuning


def _settings(exported: Path, model: Path, out: Path, **overrides) -> FinetuneSettings:
    options = dict(data=str(exported), base_model=str(model), output=str(out), max_steps=3, batch_size=2,
                   max_length=1536, save_steps=2, device="cpu", learning_rate=1e-3)
    return FinetuneSettings(**{**options, **overrides})


@pytest.mark.slow
def test_export_finetune_generate_score_end_to_end(release, exported, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "tuned"
    result = finetune(_settings(exported, tiny_model_dir, out))
    assert result.steps == 3 and len(result.losses) == 3 and all(math.isfinite(x) for x in result.losses)
    assert not checkpoints_folder(out).exists()
    record = json.loads((out / "themisto_training.json").read_text())
    manifest = json.loads((exported / "manifest.json").read_text())
    assert json.loads((out / "export_manifest.json").read_text()) == manifest
    assert record["export"]["release"] == manifest["release"] and record["precision"] == "fp32"
    assert record["examples"]["trained_on"] + record["examples"]["over_max_length"] == manifest["counts"]["examples"]
    run = tmp_path / "run"
    assert main(["generate", "--release", str(release), "--task", "next_cell", "--backend", "transformers",
                 "--model", str(out), "--device", "cpu", "--limit", "4", "--max-new-tokens", "8", "--json",
                 "-o", str(run)]) == 0
    generations = _lines(run / "generations.jsonl")
    assert len(generations) == 12 and all(g["status"] == "ok" for g in generations)
    assert json.loads((run / "run.json").read_text())["model"] == str(out)
    assert main(["score", str(run), "--json"]) == 0
    results = json.loads((run / "results.json").read_text())
    scores = {(s["context"], s["metric"]): s for s in results["scores"] if s["subset"] == "all"}
    for context in ("none", "variables", "full"):
        for metric in ("exact_match", "rouge_l", "chrf"):
            score = scores[(context, metric)]
            assert score["n"] == 4 and score["low"] <= score["mean"] <= score["high"]
    assert results["interval"]["method"] in ("cluster_bootstrap", "block_bootstrap")


class _Interrupt(Exception):
    """Stops training from a callback, as a killed job would, after the step-2 checkpoint."""


@pytest.mark.slow
def test_interrupted_training_resumes_from_its_last_checkpoint(exported, tiny_model_dir, tmp_path):
    from transformers import TrainerCallback

    class StopAtStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise _Interrupt

    out = tmp_path / "tuned"
    settings = _settings(exported, tiny_model_dir, out, max_steps=3, limit=6, batch_size=1)
    with pytest.raises(_Interrupt):
        finetune(settings, callbacks=(StopAtStep3(),))
    assert not out.exists() and (checkpoints_folder(out) / "checkpoint-2").is_dir()
    with pytest.raises(FinetuneError, match="other settings"):
        finetune(replace(settings, learning_rate=5e-4))
    result = finetune(settings)
    assert result.resumed_from.endswith("checkpoint-2") and result.steps == 3
    assert result.record["resumed_from"] == "checkpoint-2" and len(result.losses) == 3


@pytest.mark.slow
def test_lora_adapter_only_then_merge_gives_a_folder_the_backend_loads(exported, tiny_model_dir, tmp_path, capsys):
    adapter = tmp_path / "adapter"
    result = finetune(_settings(exported, tiny_model_dir, adapter, method="lora", adapter_only=True, max_steps=1,
                                limit=4))
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").exists()
    assert result.record["merge_command"] == f"python eval/finetune.py merge {adapter} -o {adapter}-merged"
    script = _finetune_script()
    assert script.main(["merge", str(adapter), "-o", str(tmp_path / "merged")]) == 0
    backend = TransformersBackend(str(tmp_path / "merged"), device="cpu")
    from themisto.generation.prompts import render_prompt

    prompt = render_prompt(_release_rows_for(exported)[0], "next_cell", "none")
    [[generation]] = backend.generate([prompt], Sampling(max_new_tokens=4))
    assert generation.status == "ok" and generation.tokens_out >= 1


def _release_rows_for(exported: Path) -> list[dict]:
    manifest = json.loads((exported / "manifest.json").read_text())
    return [r for r in _release_rows(Path(manifest["release"]["path"]), "next_cell", "test")]


def _finetune_script():
    spec = importlib.util.spec_from_file_location("finetune_script", REPO / "eval" / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_base_model_without_chat_template_trains_in_the_plain_text_format(exported, tiny_model_dir, tmp_path,
                                                                           capsys):
    base = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, base)
    (base / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    script = _finetune_script()
    args = ["train", "--data", str(exported), "--model", str(base), "--max-steps", "1", "--limit", "4",
            "--device", "cpu", "--max-length", "1536"]
    assert script.main([*args, "-o", str(tmp_path / "chat")]) == 2
    err = capsys.readouterr().err
    assert "has no chat template" in err and "--format text" in err and not (tmp_path / "chat").exists()
    assert script.main([*args, "--format", "text", "-o", str(tmp_path / "text")]) == 0
    backend = TransformersBackend(str(tmp_path / "text"), device="cpu")
    assert not backend.has_chat_template
    example = _lines(exported / "examples.jsonl")[0]
    from themisto.training.finetune import plain_text_example

    # Trained on exactly the text the backend sends a model without a template.
    assert plain_text_example(example)["prompt"] == backend._text(example["prompt"])
    assert plain_text_example(example)["prompt"] == messages_text(example["prompt"]) + "\n"


def test_finetune_json_prints_exactly_one_json_object_on_stdout(exported, tiny_model_dir, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("finetune_script", REPO / "eval" / "finetune.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    capsys.readouterr()
    assert script.main(["train", "--data", str(exported), "--model", str(tiny_model_dir), "-o", str(tmp_path / "tuned"),
                        "--max-steps", "1", "--device", "cpu", "--json"]) == 0
    out = capsys.readouterr()
    record = json.loads(out.out)  # the whole of stdout: the trainer's logs went to stderr
    assert record["steps"] == 1 and "'loss'" in out.err


def test_export_counts_the_prompt_budget_with_the_models_tokenizer_as_generation_does(release, tiny_model_dir,
                                                                                       tmp_path):
    from themisto.generation.backends.hf import load_tokenizer, prompt_token_counter

    out = tmp_path / "counted"
    assert main(["sft-export", "--release", str(release), "--count-with", str(tiny_model_dir),
                 "--max-prompt-tokens", "300", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["prompt_tokens_counted_with"] == f"tokenizer of {tiny_model_dir}"
    count = prompt_token_counter(load_tokenizer(str(tiny_model_dir)))
    examples = _lines(out / "examples.jsonl")
    tokens = [count(messages_text(e["prompt"])) for e in examples]
    assert examples and max(tokens) <= 300
    # the estimate (UTF-8 bytes / 3) cuts otherwise: the same budget keeps other prompts whole
    estimated = tmp_path / "estimated"
    assert main(["sft-export", "--release", str(release), "--max-prompt-tokens", "300", "-o", str(estimated)]) == 0
    assert json.loads((estimated / "manifest.json").read_text())["prompt_tokens_counted_with"] == "estimate"
    assert [e["prompt"] for e in _lines(estimated / "examples.jsonl")] != [e["prompt"] for e in examples]
