"""Themisto's scorer as an Inspect scorer: each sample's answer taken from the model's reply as `themisto generate`
takes it, then scored by `themisto.scoring.scorer.score`, the one door `themisto score` goes through.

Text scores are the metric's. With `execute` the same door runs the prediction in the exact pre-cell state (the
execution opt-in, the sandbox, the branch walls: nothing of it is re-implemented here). Inspect scores sample by
sample, in no fixed order; each sample's state is served by restoring it from the release's stored values where they
restore it (`ScoreSettings.restore`, checked against the state hash), else by replaying its prefix, in a kernel of its
own. A sample whose state could not be served (the scorer's `refused`, or an example the reference runs leave
undefined) gets NaN for the execution metrics: Inspect counts it unscored, not wrong.

Every metric is reported with its mean and Themisto's 95 % interval (`themisto.scoring.intervals`: a cluster
bootstrap over trajectories, a block bootstrap where there are too few), beside Inspect's clustered stderr.
"""

from __future__ import annotations

import math
import tempfile
import threading
import weakref
from pathlib import Path

from themisto.generation.probe_protocol import without_probes
from themisto.generation.prompts import extract_answer
from themisto.scoring.run_scores import EXECUTION_METRICS, metrics_for
from themisto.modes import context_mode

CLUSTER_KEY = "kernel_id"  # the sample metadata the intervals resample on: the trajectory


def answer_of(completion: str, task: str, context: str) -> str:
    """The prediction in a reply, as a run folder's line records it (a probe-mode reply without its probe blocks)."""
    text = without_probes(completion) if context_mode(context).is_probe else completion
    return extract_answer(text, task)


def _interval_metric():
    from inspect_ai.scorer import SampleScore, metric

    @metric(name="ci95")
    def ci95():
        """Themisto's 95 % interval of the mean, resampling whole trajectories (`themisto.scoring.intervals`)."""
        def compute(scores) -> dict:
            from themisto.scoring.intervals import mean_interval, plan_resamples

            values = [float(s.score.value) for s in scores]
            metadata = [s.sample_metadata or {} for s in scores]
            plan = plan_resamples([m.get(CLUSTER_KEY, "?") for m in metadata],
                                  [(m.get(CLUSTER_KEY, "?"), m.get("step", 0)) for m in metadata])
            interval = mean_interval(values, plan)
            # Too few trajectories (or examples) for an interval: the plan gives none, and Inspect shows none.
            return {k: v for k, v in (("low", interval.low), ("high", interval.high)) if v is not None}

        # Inspect reads the annotation to pass SampleScores (with each sample's metadata: its trajectory), and this
        # module's `from __future__ import annotations` would leave it a string it cannot resolve here.
        compute.__annotations__ = {"scores": list[SampleScore], "return": dict}
        return compute

    return ci95


def themisto_metrics(task: str, execute: bool) -> dict:
    """Inspect's metrics for each of Themisto's scores: mean, Themisto's interval, Inspect's clustered stderr."""
    from inspect_ai.scorer import mean, stderr

    ci95 = _interval_metric()
    return {name: [mean(), ci95(), stderr(cluster=CLUSTER_KEY)] for name in metrics_for(task, execute)}


class ScorerDoor:
    """The scorer's door for one task: the task's release (its handle, opened once by the task), its workspace made
    once (under a lock), and at most one execution per core at a time (each in a kernel of its own)."""

    def __init__(self, release, task: str, workspace, execute: bool) -> None:
        from themisto.settings import usable_cores

        self.task, self.execute, self.given = task, execute, workspace
        self.release = release
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(usable_cores())
        self.inputs = None

    def workspace_folder(self):
        """The release's input files found once (`themisto.release.workspaces.ReleaseInputs`)."""
        from themisto.scoring.release_state import release_inputs

        with self.lock:
            if self.inputs is None:
                tmp = tempfile.TemporaryDirectory(prefix="themisto-inspect-")
                weakref.finalize(self, tmp.cleanup)
                self.inputs = release_inputs(self.release, self.given, Path(tmp.name))
            return self.inputs

    def score(self, sample_id: str, prediction: str, target: str):
        """The example's record and its prediction's (`themisto.scoring.records`), scored by the scorer's door."""
        from themisto.scoring.records import ScoreSettings
        from themisto.scoring.scorer import score

        settings = ScoreSettings(task=self.task, restore=True)
        if not self.execute:
            result = score([prediction], [target], ids=[sample_id], settings=settings)
        else:
            workspace = self.workspace_folder()
            with self.slots:
                result = score([prediction], [target], ids=[sample_id], settings=settings, execute=True,
                               release=self.release, workspace=workspace, workers=1, progress=lambda _: None)
        return result.examples[0], result.predictions[0]


def score_value(example, record, task: str, execute: bool) -> dict:
    """A sample's value for each metric; an execution metric is NaN (unscored) where the example was not scored."""
    value = {}
    for name in metrics_for(task, execute):
        if name in EXECUTION_METRICS:
            judged = getattr(record, name) if example.status == "scored" else None
            value[name] = math.nan if judged is None else float(bool(judged))
        else:
            value[name] = float(getattr(record, name))
    return value


def themisto_scorer(release, task: str, context: str, execute: bool, workspace=None):
    """The Inspect scorer of one task over its release (the task's `ReleaseInfo`; its metrics set by the task:
    `themisto_metrics`); `workspace`: where its input files are (`themisto.release.workspaces.SourceFolders`)."""
    from inspect_ai.scorer import Score, scorer

    door = ScorerDoor(release, task, workspace, execute)

    @scorer(metrics=[], name="themisto")
    def themisto():
        async def score(state, target) -> Score:
            import anyio

            skipped = (state.metadata or {}).get("skipped")
            if skipped:  # as a run folder scores a skipped generation: 0 on every metric
                return Score(value={name: 0.0 for name in metrics_for(task, execute)}, answer="",
                             explanation=f"skipped: {skipped}", metadata={"generation": "skipped"})
            failed = state.output is None or state.output.error is not None  # e.g. a content refusal
            prediction = "" if failed else answer_of(state.output.completion, task, context)
            example, record = await anyio.to_thread.run_sync(door.score, str(state.sample_id), prediction,
                                                              target.text)
            metadata = {"example_status": example.status, "outcome": record.outcome, "reason": record.reason or
                        example.reason, "kernel_id": example.kernel_id, "step": example.step,
                        "generation": "failed" if failed else "ok"}
            return Score(value=score_value(example, record, task, execute), answer=prediction,
                         explanation=record.reason or example.reason or None, metadata=metadata)

        return score

    return themisto()
