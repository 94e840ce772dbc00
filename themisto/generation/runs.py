"""`themisto generate`: render every (example, context mode) of a release's task, generate, and append records.

The run folder resumes: what generations.jsonl already holds is not generated again, and a folder written with
other settings or against another release is refused. run.json is written at the start and updated at the end.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from themisto.bounded import escaped_surrogates, not_unicode
from themisto.gate import permit as gate_permit
from themisto.generation.backends import BACKENDS, BackendError, Sampling, make_backend
from themisto.generation.baselines import baselines_for, probing_baselines_for
from themisto.generation.example_spec import ExampleSpec
from themisto.generation.probe_protocol import Transcript, without_probes
from themisto.generation.prompts import (
    PROMPT_TEMPLATES,
    Prompt,
    approx_tokens,
    extract_answer,
    render_prompt,
    template_sha256,
)
from themisto.generation.release_rows import load_task_rows, require_task
from themisto.generation.run_folder import (
    RUN_FILE,
    Generation,
    GenerationWriter,
    RunFolderError,
    check_same_run,
    read_generations,
    read_run_json,
)
from themisto.modes import ContextModeSpec, context_mode, context_modes
from themisto.release.folder import ReleaseInfo
from themisto.release.workspaces import SourceFolders
from themisto.resume import LOCK_FILE, hold_folder, write_json_atomic
from themisto.vocabulary import PROBE_CONTEXT

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES: tuple[str, ...] = ("themisto", "transformers", "torch", "tokenizers", "accelerate", "gguf", "openai",
                             "vllm", "datasets", "pyarrow")


@dataclass(frozen=True)
class RunSettings:
    """What one run folder is: its examples (`spec`: one task, its context modes, split, limit, prompt budget, the
    probe and delta modes' settings), and what a run alone has: backend and model, sampling, batch size, backend
    options."""

    spec: ExampleSpec
    backend: str
    model: str
    sampling: Sampling = field(default_factory=Sampling)
    batch_size: int = 8
    backend_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        task = self.spec.task  # a run folder is of one task
        if self.backend not in BACKENDS:
            raise BackendError(f"unknown backend {self.backend!r} (expected one of {', '.join(BACKENDS)})")
        known = (*baselines_for(task), *probing_baselines_for(task))
        if self.backend == "baseline" and self.model not in known:
            raise BackendError(f"baseline {self.model!r} does not apply to {task} (use one of {', '.join(known)})")
        if self.backend == "baseline" and self.probing and self.spec.probe.protocol != "text":
            raise BackendError("the baseline backend speaks only the text probe protocol (--probe-protocol text)")

    @property
    def modes(self) -> tuple[ContextModeSpec, ...]:
        """The run's context modes, in order."""
        return context_modes(self.spec.contexts)

    @property
    def probing(self) -> bool:
        """Whether the run has the `probe` mode, which runs model-written probes (the execution opt-in)."""
        return any(mode.is_probe for mode in self.modes)


@dataclass
class RunReport:
    """What one `generate` call did: records written now, found from before, and the run folder's totals."""

    folder: Path
    written: int
    resumed: int
    torn_line_dropped: bool
    counts: dict[str, int]
    seconds: float
    run: dict = field(repr=False, default_factory=dict)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a run depends on (read from metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def git_commit() -> str | None:
    """The project's commit, with `-dirty` when tracked files differ; None outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def run_header(settings: RunSettings, info: ReleaseInfo, described: dict) -> dict:
    """run.json as the contract lays it out, before any generation (finished and totals come at the end)."""
    spec = settings.spec
    header = {
        "format": 1, "task": spec.task, "contexts": list(spec.contexts), "backend": settings.backend,
        "backend_version": described.get("version"), "model": settings.model,
        "sampling": settings.sampling.to_dict(),
        "templates": {c: {"text": PROMPT_TEMPLATES[(spec.task, c)], "sha256": template_sha256(spec.task, c)}
                      for c in spec.contexts},
        "release": {"path": str(info.path), "content_hash": info.content_hash}, "split": spec.split,
        "limit": spec.limit, "max_prompt_tokens": spec.max_prompt_tokens,
        "backend_options": settings.backend_options, "packages": package_versions(), "git_commit": git_commit(),
        "started": _now(), "finished": None, "tokens_in": 0, "tokens_out": 0, "generations_per_s": None,
        "backend_info": described, "probe": spec.probe.record() if settings.probing else None,
        "delta": spec.delta.record() if any(mode.per_cell_delta for mode in settings.modes) else None,
    }
    for key in ("weights_sha256", "model_revision"):
        if key in described:
            header[key] = described[key]
    header.setdefault("model_revision", None)
    return header


def _record(prompt: Prompt, task: str, sample: int, generation: Generation, raw_is_answer: bool,
            probes: Transcript | None = None) -> Generation:
    """The backend's generation placed: its example, context and sample, the answer taken from its text, and a
    probe-mode line's transcript."""
    ok = generation.status == "ok"
    # A probe-mode answer is read from the final reply with any probe block taken out (it asked for no more).
    text = without_probes(generation.raw) if context_mode(prompt.context).is_probe else generation.raw
    prediction = (text if raw_is_answer else extract_answer(text, task)) if ok else ""
    record = replace(generation, id=prompt.id, task=task, context=prompt.context, sample=sample,
                     prediction=prediction, kept=prompt.kept.to_dict() if prompt.kept else None,
                     probes=probes.to_dict() if probes is not None else None)
    problem = not_unicode({"raw": record.raw, **record.to_dict()})  # named by the backend's own text first
    if problem is None:
        return record
    # A backend can return text no UTF-8 file holds (an API's JSON may carry a lone "\ud800"): the sample fails
    # with the reason, its text kept with the surrogate escaped, and the run goes on.
    return replace(record, status="failed", prediction="", raw=escaped_surrogates(record.raw),
                   reason=f"the backend's text is not Unicode: {problem} (UTF-8 cannot encode it; kept in `raw` "
                          "escaped)", probes=escaped_surrogates(record.probes))


def _budget(settings: RunSettings, backend) -> tuple[int | None, object]:
    """The prompt budget (given, else the model's context less the new tokens) and the token counter."""
    count = getattr(backend, "count_tokens", None)
    budget = settings.spec.max_prompt_tokens
    if budget is None and getattr(backend, "context_length", None):
        budget = backend.context_length - settings.sampling.max_new_tokens
    return budget, count or approx_tokens


def _check_folder(out: Path, header: dict) -> dict | None:
    """The folder's earlier run.json, if any; a folder of another run, or of something else, is refused."""
    existing = read_run_json(out, missing_ok=True) if out.exists() else None
    if existing is None and out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise RunFolderError(f"{out}: not empty and has no {RUN_FILE}; give a new or empty output folder")
    if existing is not None:
        check_same_run(existing, header, out)
    return existing


def _open_folder(out: Path, header: dict) -> tuple[dict, bool]:
    """The run.json to keep (the earlier one on resume, with its start time) and whether this is a resume."""
    existing = _check_folder(out, header)
    out.mkdir(parents=True, exist_ok=True)
    if existing is not None:
        header = {**header, "started": existing.get("started", header["started"])}
    write_json_atomic(out / RUN_FILE, header)
    return header, existing is not None


def backend_options(settings: RunSettings) -> dict:
    """The keyword options `make_backend` gets for a run's backend (also on each Ray engine)."""
    options = dict(settings.backend_options)
    if settings.backend in ("transformers", "vllm"):
        options.setdefault("batch_size", settings.batch_size)  # how many prompts share one forward pass
    return options


def generate_run(release: ReleaseInfo, out: str | Path, settings: RunSettings, *, backend=None,
                 progress: bool = True, execute_probes: bool = False,
                 workspace: SourceFolders | str | Path | None = None) -> RunReport:
    """Generate every missing (example, context, sample) of `settings` into the run folder `out`, held as its one
    writer (`themisto.resume.hold_folder`: another process writing it is refused with its pid), from `release` (the
    caller opened it: `themisto.release.folder.open_release`).

    The `probe` mode runs the model's probes in branches of each example's pre-cell state: it needs the execution
    opt-in (`execute_probes=True` and HF_ALLOW_CODE_EVAL=1, `themisto.gate`) and the release's workspace (`workspace`,
    else made again from the build's record)."""
    started = time.perf_counter()
    permit = gate_permit(execute=execute_probes) if settings.probing else None  # refused before anything runs
    # One writer per run folder: a second `generate` into it is refused here, before it reads or writes a line.
    with hold_folder(out, "run folder") as out, tempfile.TemporaryDirectory(prefix="themisto-probe-") as tmp:
        return _generate(release, out, settings, backend, progress, permit, workspace, Path(tmp), started)


def _generate(info: ReleaseInfo, out: Path, settings: RunSettings, backend, progress: bool, permit,
              workspace: str | Path | None, tmp: Path, started: float) -> RunReport:
    spec = settings.spec
    require_task(info, spec.task, spec.split)
    rows = load_task_rows(info, spec.task, spec.contexts, limit=spec.limit, split=spec.split)
    _check_folder(out, run_header(settings, info, {}))  # refuse a mismatched folder before loading a model
    if settings.probing:
        from themisto.generation.probing import probe_workspace

        workspace = probe_workspace(info, workspace, tmp)  # a given one that is not the build's: refused here
    if backend is None:
        backend = make_backend(settings.backend, settings.model, **backend_options(settings))
    if settings.probing and spec.probe.protocol == "native":
        problem = getattr(backend, "native_tools_problem", lambda: "it offers no tools")()
        if problem is not None:
            raise BackendError(f"--probe-protocol native: {settings.model} cannot take tool calls here ({problem}); "
                               "use --probe-protocol text")
    header, _ = _open_folder(out, run_header(settings, info, backend.describe()))
    existing = read_generations(out, header, repair=True)
    done = existing.records
    n = settings.sampling.n
    todo = [(row, context) for row in rows for context in spec.contexts
            if any((row["id"], context, s) not in done for s in range(n))]
    budget, count = _budget(settings, backend)
    raw_is_answer = getattr(backend, "raw_is_answer", False)
    written = 0
    from tqdm import tqdm

    bar = tqdm(total=len(rows) * len(spec.contexts), initial=len(rows) * len(spec.contexts) - len(todo),
               desc=f"generate {spec.task}", unit="prompt", disable=not progress)
    probing = [row for row, context in todo if context_mode(context).is_probe]
    todo = [(row, context) for row, context in todo if not context_mode(context).is_probe]
    with GenerationWriter(out) as writer, bar:
        for start in range(0, len(todo), settings.batch_size):
            chunk = todo[start:start + settings.batch_size]
            prompts = [render_prompt(row, spec.task, context, count_tokens=count if budget else None,
                                     max_prompt_tokens=budget, delta=spec.delta) for row, context in chunk]
            sent = [p for p in prompts if p.skipped_reason is None]
            results = dict(zip((id(p) for p in sent), backend.generate(sent, settings.sampling) if sent else []))
            for prompt in prompts:
                for sample, generation in enumerate(_samples(prompt, results.get(id(prompt)), n)):
                    if (prompt.id, prompt.context, sample) not in done:
                        writer.write(_record(prompt, spec.task, sample, generation, raw_is_answer))
                        written += 1
            bar.update(len(chunk))
        if probing:
            written += _probe_rows(permit, info, probing, settings, backend, budget, count, done, writer,
                                   raw_is_answer, workspace, bar)
    seconds = time.perf_counter() - started
    final = read_generations(out, header, repair=True).records
    header = _finish(out, header, final, written, seconds, backend)
    return RunReport(out, written, len(done), existing.torn_line, header["counts"], seconds, header)


def _probe_rows(permit, info: ReleaseInfo, rows: list[dict], settings: RunSettings, backend, budget: int | None,
                count, done: dict, writer: GenerationWriter, raw_is_answer: bool, workspace, bar) -> int:
    """The `probe` mode's records: each trajectory replayed once, each step's conversations run with their probes
    in branches of its state (`themisto.generation.probing`); a record is written as its example ends."""
    from themisto.generation.probing import Conversation, converse, serve_states, transcript

    task, n, probe = settings.spec.task, settings.sampling.n, settings.spec.probe
    first_budget = settings.spec.first_probe_budget(settings.sampling.max_new_tokens, count, budget)
    written: set[tuple[str, str, int]] = set()

    def write(prompt: Prompt, sample: int, generation: Generation, probes: Transcript | None) -> None:
        key = (prompt.id, PROBE_CONTEXT, sample)
        if key not in done and key not in written:  # a step cut short is failed whole: its lines written once
            writer.write(_record(prompt, task, sample, generation, raw_is_answer, probes))
            written.add(key)

    with closing(serve_states(permit, info, rows, probe, workspace)) as states:  # an error ends the kernels too
        for served in states:
            if served.failure is not None:
                for row in served.rows:
                    prompt = Prompt([], "", id=row["id"], context=PROBE_CONTEXT, task=task, row=row)
                    for sample in range(n):
                        write(prompt, sample, Generation("", "failed", served.failure),
                              Transcript(protocol=probe.protocol, allowed=probe.max_probes, used=0,
                                         stop="state_unavailable", turns=0))
                bar.update(len(served.rows))
                continue
            conversations = []
            for row in served.rows:
                first = render_prompt(row, task, PROBE_CONTEXT, count_tokens=count if budget else None,
                                      max_prompt_tokens=first_budget, probe=probe)
                if first.skipped_reason is not None:
                    for sample, generation in enumerate(_samples(first, None, n)):
                        write(first, sample, generation, None)
                    continue
                conversations += [Conversation(first, s, list(first.messages)) for s in range(n)
                                  if (first.id, PROBE_CONTEXT, s) not in done]
            converse(conversations, backend, settings.sampling, probe, budget, count, served.run_probe)
            served.settle()  # the probes' state checks, for the records
            for conversation in conversations:
                final = conversation.final or Generation("", "failed", "the conversation never got a final reply")
                final = replace(final, tokens_in=conversation.tokens_in, tokens_out=conversation.tokens_out)
                write(conversation.first, conversation.sample, final, transcript(conversation, probe))
            bar.update(len(served.rows))
    return len(written)


def _samples(prompt: Prompt, generated: list[Generation] | None, n: int) -> list[Generation]:
    """A prompt's n records: skipped ones with the budget's reason, and a short answer from a backend as failed."""
    if prompt.skipped_reason is not None:
        return [Generation("", "skipped", prompt.skipped_reason, prompt.tokens, None)] * n
    generated = list(generated or [])
    missing = Generation("", "failed", f"the backend returned {len(generated)} samples, expected {n}", None, None)
    return generated[:n] + [missing] * (n - len(generated))


def _finish(out: Path, header: dict, records: dict, written: int, seconds: float, backend) -> dict:
    counts = {"generations": len(records)}
    for record in records.values():
        counts[record.status] = counts.get(record.status, 0) + 1
    header = {**header, "finished": _now(), "backend_info": backend.describe(), "counts": counts,
              "tokens_in": sum(r.tokens_in or 0 for r in records.values()),
              "tokens_out": sum(r.tokens_out or 0 for r in records.values()),
              # This call's rate: a resumed run's earlier part ran at another time, perhaps on another machine.
              "generations_per_s": round(written / seconds, 3) if seconds > 0 and written else None}
    write_json_atomic(out / RUN_FILE, header)
    return header


__all__ = ["RunFolderError", "RunReport", "RunSettings", "backend_options", "generate_run",
           "git_commit", "package_versions"]
