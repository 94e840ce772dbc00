"""The Inspect tasks `themisto/next_cell` and `themisto/output_prediction`, registered by the package's `inspect_ai`
entry point (pyproject.toml), so that after the install

    inspect eval themisto/next_cell -T release=out/sample -T context=variables --model PROVIDER/MODEL

runs with any model provider Inspect has. Parameters (`-T key=value`): `release` (a release folder or a Hub dataset
id), `context` (none / variables / full / trace / delta / probe), `split`, `limit` (rows spread over the split, as
`themisto generate --limit`), `max_prompt_tokens`, `execute` (next_cell: run each prediction in its exact pre-cell
state; needs HF_ALLOW_CODE_EVAL=1), `workspace` (a release replayed over a given input folder), `sources` (folders
holding the sources its sessions from public repositories replayed in, comma-separated, where they moved), and for
the probe mode `execute_probes` (the same opt-in as `themisto generate --execute-probes`), `probes`, `probe_chars`,
`probe_timeout`, and for the delta mode `delta_cells` (`themisto generate --delta-cells`). Beside them, one task per (task, context mode), e.g. `themisto/next_cell_variables`, named as the
release's eval.yaml names the text-track task of the same task and mode (`themisto.release.eval_yaml.task_id`),
which Inspect's Hub loader runs with built-in scorers. Importing this module also registers the stand-in model
provider `themisto-standin` (`themisto.harness.standin`), for trying the tasks with no model and no network.
"""

from __future__ import annotations

import inspect
import tempfile
import threading
import weakref
from pathlib import Path

from inspect_ai import Task, task

from themisto.harness import standin  # noqa: F401 - registers the stand-in model provider (`themisto-standin`)
from themisto.generation.delta import DeltaError, DeltaSettings
from themisto.generation.example_spec import DEFAULT_SPEC, ExampleSpec
from themisto.generation.probe_protocol import ProbeSettings, ProbeSettingsError
from themisto.harness.samples import INSPECT_OPTIONS, HarnessSettings, task_samples
from themisto.modes import context_mode
from themisto.release.eval_yaml import task_id
from themisto.release.workspaces import SourceFolders
from themisto.vocabulary import BASELINE_CONTEXT, CONTEXT_MODES, TASKS

THEMISTO_METADATA = "themisto"  # the task metadata key `themisto score LOG.eval` reads a run's settings from


def _plain_solver():
    """Inspect's `generate()`, except that a prompt skipped over the budget is not sent (a run folder's `skipped`)."""
    from inspect_ai.solver import solver

    @solver(name="themisto_generate")
    def themisto_generate():
        async def solve(state, generate):
            if (state.metadata or {}).get("skipped"):
                return state
            return await generate(state)

        return solve

    return themisto_generate()


def _once(make):
    """`make()` called the first time it is asked for, under a lock (a folder made once per task)."""
    lock, made = threading.Lock(), []

    def get():
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return get


def run_record(settings: HarnessSettings, info) -> dict:
    """What a run folder's run.json would say of this task's prompts: the release, templates, budget, probe rule."""
    from themisto.generation.prompts import PROMPT_TEMPLATES, template_sha256

    spec = settings.spec
    return {"task": spec.task, "context": spec.context, "split": spec.split, "limit": spec.limit,
            "max_prompt_tokens": spec.max_prompt_tokens, "execute": settings.execute,
            "release": {"path": str(info.path), "content_hash": info.content_hash},
            "templates": {spec.context: {"text": PROMPT_TEMPLATES[(spec.task, spec.context)],
                                         "sha256": template_sha256(spec.task, spec.context)}},
            "probe": spec.probe.record() if settings.probing else None,
            "delta": spec.delta.record() if context_mode(spec.context).per_cell_delta else None}


def themisto_task(settings: HarnessSettings, workspace: SourceFolders | None = None) -> Task:
    """The Inspect Task for `settings`: the release's samples, the solver of its context mode, Themisto's scorer."""
    from inspect_ai.dataset import MemoryDataset

    from themisto.gate import permit as gate_permit
    from themisto.harness.scorer import themisto_metrics, themisto_scorer

    if settings.execute:
        gate_permit(execute=True)  # refused before the release is read or a model called
    permit = gate_permit(execute=settings.execute_probes) if settings.probing else None
    info, samples = task_samples(settings)
    if settings.probing:
        from themisto.generation.probing import probe_workspace
        from themisto.harness.probe_tool import probe_solver
        from themisto.settings import usable_cores

        tmp = tempfile.TemporaryDirectory(prefix="themisto-inspect-probe-")
        folder = _once(lambda: probe_workspace(info, workspace, Path(tmp.name)))
        solver = probe_solver(info, settings.spec.probe, permit, folder, threading.BoundedSemaphore(usable_cores()))
        weakref.finalize(solver, tmp.cleanup)
    else:
        solver = _plain_solver()
    spec = settings.spec
    dataset = MemoryDataset(samples, name=f"{Path(info.path).name}/{spec.task}/{spec.split}")
    return Task(dataset=dataset, solver=solver,
                scorer=themisto_scorer(info, spec.task, spec.context, settings.execute, workspace),
                metrics=themisto_metrics(spec.task, settings.execute),
                metadata={THEMISTO_METADATA: run_record(settings, info)})


def _make(config: str, release: str, context: str, split: str, limit: int | None, max_prompt_tokens: int | None,
          execute: bool, workspace: str | None, execute_probes: bool, probes: int, probe_chars: int,
          probe_timeout: float, delta_cells: int | None, sources: str | list | None) -> Task:
    """The task of `config` for its `-T` parameters (the task functions' own, with their defaults)."""
    try:
        probe = ProbeSettings(max_probes=int(probes), output_chars=int(probe_chars), timeout_s=float(probe_timeout),
                              protocol="native")
        delta = DeltaSettings(cells=None if delta_cells is None else int(delta_cells))
    except (ProbeSettingsError, DeltaError) as refused:  # named as Inspect's -T parameters name them
        raise INSPECT_OPTIONS.error(f"{INSPECT_OPTIONS.option(refused.field, refused.value)}: {refused.why}") from None
    spec = ExampleSpec(tasks=(config,), contexts=(context,), split=split, limit=None if limit is None else int(limit),
                       max_prompt_tokens=None if max_prompt_tokens is None else int(max_prompt_tokens),
                       probe=probe, delta=delta, spelling=INSPECT_OPTIONS)
    settings = HarnessSettings(spec=spec, release=str(release), execute=bool(execute),
                               execute_probes=bool(execute_probes))
    return themisto_task(settings, _source_folders(workspace, sources))


def _source_folders(workspace: str | None, sources: str | list | None) -> SourceFolders:
    """`-T workspace=DIR -T sources=DIR1,DIR2` (or a list) as SourceFolders; a folder that is not there is refused."""
    named = sources.split(",") if isinstance(sources, str) else list(sources or [])
    folders = tuple(Path(str(p).strip()) for p in named if str(p).strip())
    missing = [str(p) for p in folders if not p.is_dir()]
    if missing:
        raise INSPECT_OPTIONS.error(f"-T sources={missing[0]}: no such folder")
    return SourceFolders(workspace=None if workspace is None else Path(workspace), sources=folders)


# The keyword defaults below are the example spec's (DEFAULT_SPEC), each `-T` name mapped to its field by
# SPEC_PARAMETERS; the one mode an Inspect task runs in is the baseline's unless given.
@task
def next_cell(release: str, context: str = BASELINE_CONTEXT, split: str = DEFAULT_SPEC.split,
              limit: int | None = DEFAULT_SPEC.limit, max_prompt_tokens: int | None = DEFAULT_SPEC.max_prompt_tokens,
              execute: bool = False, workspace: str | None = None, execute_probes: bool = False,
              probes: int = DEFAULT_SPEC.probe.max_probes, probe_chars: int = DEFAULT_SPEC.probe.output_chars,
              probe_timeout: float = DEFAULT_SPEC.probe.timeout_s,
              delta_cells: int | None = DEFAULT_SPEC.delta.cells, sources: str | None = None) -> Task:
    """Next-cell prediction: write the code of the cell the developer runs next."""
    return _make("next_cell", release, context, split, limit, max_prompt_tokens, execute, workspace, execute_probes,
                 probes, probe_chars, probe_timeout, delta_cells, sources)


@task
def output_prediction(release: str, context: str = BASELINE_CONTEXT, split: str = DEFAULT_SPEC.split,
                      limit: int | None = DEFAULT_SPEC.limit,
                      max_prompt_tokens: int | None = DEFAULT_SPEC.max_prompt_tokens, workspace: str | None = None,
                      execute_probes: bool = False, probes: int = DEFAULT_SPEC.probe.max_probes,
                      probe_chars: int = DEFAULT_SPEC.probe.output_chars,
                      probe_timeout: float = DEFAULT_SPEC.probe.timeout_s,
                      delta_cells: int | None = DEFAULT_SPEC.delta.cells, sources: str | None = None) -> Task:
    """Cell-output prediction: predict what a given cell prints."""
    return _make("output_prediction", release, context, split, limit, max_prompt_tokens, False, workspace,
                 execute_probes, probes, probe_chars, probe_timeout, delta_cells, sources)


def _mode_task(config: str, context: str):
    """The task of one (config, context mode), named as the release's eval.yaml declares it (`task_id`): the full
    task's parameters and defaults but `context`."""
    name = task_id(config, context)
    full = inspect.unwrap({"next_cell": next_cell, "output_prediction": output_prediction}[config])
    signature = inspect.signature(full)

    def mode_task(release: str, **params) -> Task:
        if "context" in params:
            raise ValueError(f"{name} runs in context mode {context}; use themisto/{config} -T context=...")
        return full(release, context=context, **params)

    mode_task.__name__ = mode_task.__qualname__ = name
    mode_task.__doc__ = f"{config} in context mode {context} (the full task of the text-track task {name})."
    # Inspect reads a task's parameters from its signature (the log's task arguments, their defaults).
    mode_task.__signature__ = signature.replace(parameters=[p for p in signature.parameters.values()
                                                            if p.name != "context"])
    return task(name=name)(mode_task)


# One registered task per (task, context mode), named as eval.yaml names the text-track task of each static mode.
for _config in TASKS:
    for _context in CONTEXT_MODES:
        globals()[task_id(_config, _context)] = _mode_task(_config, _context)
