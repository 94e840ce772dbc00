"""Themisto metric: the paper's text scores, and next-cell predictions executed in the exact pre-cell state."""

from pathlib import Path

import datasets
import evaluate

from themisto.scoring.records import ScoreSettings

_CITATION = """\
@misc{grotov2025themisto,
  title         = {Themisto: Jupyter-Based Runtime Benchmark},
  author        = {Grotov, Konstantin and Titov, Sergey},
  year          = {2025},
  eprint        = {2504.12365},
  archivePrefix = {arXiv},
  primaryClass  = {cs.SE},
  url           = {https://arxiv.org/abs/2504.12365}
}
"""

_DESCRIPTION = """\
Scores predictions for the two Themisto tasks, built from Jupyter development trajectories. `next_cell`: the code
of the cell the developer ran next; `output_prediction`: the output text of a given cell. Both get the paper's text
scores (exact match after whitespace normalisation, ROUGE-L over code-aware tokens, chrF; all 0-1); output
prediction also gets an equivalence verdict (numbers within tolerance, DataFrame reprs cell by cell, errors by name
and message, images by kind).

With execution switched on (HF_ALLOW_CODE_EVAL=1 and execute=True), each next-cell prediction runs in a forked
branch of a sandboxed kernel that holds exactly the state the developer's cell saw, rebuilt by replaying the
trajectory from the release. The developer's cell runs there twice: when its two runs differ the example is
flagged nondeterministic and left out of the functional scores. The sandbox is a best-effort guard, not a security
boundary.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: one prediction per example, a string or a list of strings (several samples, for pass@k).
    references: the reference per example (the release's `target`: next cell code, or output text).
    ids: the examples' ids (`<kernel_id>/<step>`, the release's `id` column); needed for execution.
    release: the release folder the examples come from (written by `themisto build`); needed for execution.
    workspace: the input files the release was replayed over, when the build used a given folder rather than
        regenerating its look-alike inputs from a seed.
    sources: folders holding the sources its sessions from public repositories replayed in (corpus folders), where
        they are no longer where its build read them; a trajectory whose files are in none is scored by text only.
    execute: run next-cell predictions (also needs the environment variable HF_ALLOW_CODE_EVAL=1).
    k: the k of pass@k (default [1]).
    timeout_s: seconds per prediction (default 30; raised for reference cells that took long in replay).
    memory_bytes: what one prediction may allocate beyond the kernel's current use (default 1 GiB).
    continuation_cells: how many logged cells after the target run after each prediction for continuation_match
        (default 3; 0 turns it off).
    return_records: also return one record per prediction and per example (outcomes and reasons).
Returns:
    exact_match, rouge_l, chrf: means over examples of the mean over each example's predictions (0-1).
    output_equivalent: (output_prediction) the share of predictions equivalent to the reference output.
    examples, predictions: how many were scored.
    With execution: exec_ok, output_match, state_match, functional_match, continuation_match (the headline;
    means over the scored examples), continuation_undefined_examples,
    pass@k for each k, scored_examples, nondeterministic_examples, reference_unfinished_examples,
    reference_diverged_examples, refused_examples, state_mismatch_examples, outcomes (predictions per outcome: ok,
    error, timeout, kernel_died, refused); notes; with return_records also `records` and `example_records`.
Examples:
    >>> import evaluate
    >>> themisto_metric = evaluate.load("metrics/themisto")  # the folder, from the repository root
    >>> results = themisto_metric.compute(predictions=["df.head()", "x = a + b"],
    ...                                   references=["df.head()", "x = a - b"])
    >>> results["exact_match"], round(results["rouge_l"], 3), results["examples"]
    (0.5, 0.9, 2)
    >>> results = themisto_metric.compute(predictions=[["df.head()", "df.tail()"]], references=["df.head()"])
    >>> results["exact_match"], results["predictions"]
    (0.5, 2)
    >>> outputs_metric = evaluate.load("metrics/themisto", "output_prediction")
    >>> results = outputs_metric.compute(predictions=["0.30000000000000004"], references=["0.3"])
    >>> results["exact_match"], results["output_equivalent"]
    (0.0, 1.0)
    >>> themisto_metric.compute(predictions=["x = 1"], references=["x = 1"], ids=["k/5"], release="release",
    ...                         execute=True)  # without HF_ALLOW_CODE_EVAL=1 # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    themisto.gate.ExecutionRefused: Executing model-written code is off: the environment variable HF_ALLOW_CODE_EVAL...
"""

@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Themisto(evaluate.Metric):
    """Themisto's scores; the config name is the task (`next_cell`, the default, or `output_prediction`)."""

    def _info(self):
        from themisto.vocabulary import TASKS

        if self.config_name == "default":
            self.config_name = "next_cell"
        if self.config_name not in TASKS:
            raise KeyError(f"unknown Themisto task {self.config_name!r}: use one of {', '.join(TASKS)}")
        one = datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")})
        several = datasets.Features({"predictions": datasets.List(datasets.Value("string")),
                                     "references": datasets.Value("string")})
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            # A string per example first: evaluate takes the first feature set an example fits.
            features=[one, several] if self.config_name == "next_cell" else one,
            reference_urls=["https://arxiv.org/abs/2504.12365"],
        )

    # The keyword options' defaults are the scorer's own (ScoreSettings), so the two cannot disagree.
    def _compute(self, predictions, references, ids=None, release=None, workspace=None, sources=(), execute=False,
                 k=ScoreSettings.k, timeout_s=ScoreSettings.timeout_s, memory_bytes=ScoreSettings.memory_bytes,
                 continuation_cells=ScoreSettings.continuation_cells, return_records=False):
        from dataclasses import asdict

        from themisto.gate import permit
        from themisto.release.folder import open_release
        from themisto.release.workspaces import SourceFolders
        from themisto.scoring.scorer import score

        if execute:
            permit(execute=True)  # refused before the release is read
        # The metric is where a release folder becomes its handle (read once per compute).
        release = open_release(release) if execute and release is not None else None
        settings = ScoreSettings(task=self.config_name, k=k, timeout_s=float(timeout_s),
                                 memory_bytes=int(memory_bytes), continuation_cells=int(continuation_cells))
        folders = SourceFolders(workspace=None if workspace is None else Path(workspace),
                                sources=tuple(Path(p) for p in ([sources] if isinstance(sources, str) else sources)))
        result = score(predictions, references, ids=ids, settings=settings, execute=execute, release=release,
                       workspace=folders)
        out = dict(result.scores)
        out["notes"] = list(result.notes)
        if return_records:
            out["records"] = [asdict(p) for p in result.predictions]
            out["example_records"] = [asdict(e) for e in result.examples]
        return out
