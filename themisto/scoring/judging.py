"""Judging a candidate against the reference in the same state: outputs, state deltas, and the example's verdict.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from themisto.scoring.records import REASON_CHARS, ExampleRecord, PredictionRecord, ScoreSettings, pass_at_k
from themisto.scoring.text_scores import clip as clip_text
from themisto.vocabulary import UNFINISHED_STATUSES


def compared_output(outputs: list[dict]) -> str:
    """The text two runs' outputs are compared by: output_text plus a placeholder for each image, object addresses
    masked.

    >>> compared_output([{"output_type": "execute_result", "metadata": {},
    ...                   "data": {"text/plain": "<Colorbar at 0x7f18c81afad0>", "image/png": "iVBORw0KGgo="}}])
    '<Colorbar at 0x…>\\n<image/png 8 bytes>'
    """
    from themisto.runtime.outputs import mask_volatile, output_text, rich_outputs
    from themisto.scoring.equivalence import image_placeholder

    text = mask_volatile(output_text(outputs))
    images = [image_placeholder(r["mime"], r["bytes"]) for r in rich_outputs(outputs) if "bytes" in r]
    return "\n".join([text, *images]) if images else text


def clip(text: str) -> str:
    """A reason on one line, at most REASON_CHARS long."""
    return clip_text(" ".join(str(text).split()), REASON_CHARS)


def _delta(result) -> dict[str, dict[str, str]]:
    return result.delta()  # themisto.runtime.agent.delta.namespace_delta's shape


def reference_problem(first, second, recorded: dict, settings: ScoreSettings) -> tuple[str, str] | None:
    """(example status, reason) when the two reference runs cannot define a functional answer, else None.

    `recorded` is the release's row of the step: a reference that ends otherwise in its branch than in the release's
    replay (it needs more memory or time than a branch gets) defines no answer either.
    """
    from themisto.scoring.equivalence import outputs_equivalent

    if first.status != second.status:
        return "nondeterministic", f"the reference ended {first.status} in one run and {second.status} in the other"
    if first.status in UNFINISHED_STATUSES:
        return "reference_unfinished", (f"the reference cell ended {first.status} in its branch "
                                        f"({clip(first.evalue or '')})")
    if first.status != recorded.get("status") or (first.status == "error" and first.ename != recorded.get("ename")):
        got = first.status if first.status == "ok" else f"{first.status} ({first.ename}: {clip(first.evalue or '')})"
        return "reference_diverged", (f"the reference ended {got} in its branch where the release's replay recorded "
                                      f"{recorded.get('status')} {recorded.get('ename') or ''}".rstrip())
    verdict = outputs_equivalent(compared_output(second.outputs), compared_output(first.outputs),
                                 rel_tol=settings.rel_tol, abs_tol=settings.abs_tol)
    if not verdict.equal:
        return "nondeterministic", f"the reference printed different outputs in two runs ({clip(verdict.reason)})"
    a, b = _delta(first), _delta(second)
    if a != b:
        names = sorted({n for kind in a for n in set(a[kind].items()) ^ set(b[kind].items())})
        return "nondeterministic", ("the reference left different values in two runs: "
                                    + ", ".join(n for n, _ in names[:5]))
    return None


def _state_difference(reference, candidate) -> str | None:
    """Why the candidate's namespace change differs from the reference's, or None when it matches.

    Every name the reference added or changed must end with the same content hash, every name it deleted must be
    deleted; the candidate may add names of its own, but not change or delete names the reference left alone.
    """
    after = {**candidate.changed, **candidate.added}
    for name, digest in {**reference.changed, **reference.added}.items():
        if name not in after:
            what = "added" if name in reference.added else "changed"
            return f"`{name}` was {what} by the reference, not by the prediction"
        if after[name] != digest:
            return f"`{name}` holds a different value than after the reference"
    missing = sorted(set(reference.deleted) - set(candidate.deleted))
    if missing:
        return f"`{missing[0]}` was deleted by the reference, not by the prediction"
    left_alone = (set(candidate.changed) | set(candidate.deleted)) - set(reference.changed) - set(reference.deleted)
    if left_alone:
        name = min(left_alone)
        return f"`{name}` was {'deleted' if name in candidate.deleted else 'changed'} by the prediction only"
    return None


def judge(record: PredictionRecord, reference, candidate, settings: ScoreSettings) -> PredictionRecord:
    """The record with its outcome and execution scores, from its branch result against the reference's."""
    from themisto.scoring.equivalence import outputs_equivalent

    ran = replace(record, outcome=candidate.status, duration_s=round(float(candidate.duration_s), 6),
                  continuation_s=continuation_time(candidate),
                  suspicious=list(getattr(candidate, "suspicious", None) or []))
    if candidate.status in UNFINISHED_STATUSES:
        what = "ran past its time limit" if candidate.status == "timeout" else "its branch process died"
        return replace(ran, exec_ok=False, output_match=False, state_match=False, functional_match=False,
                       reason=f"{what} ({clip(candidate.evalue)})" if candidate.evalue else what)
    # the developer's cell raised: reproducing the same exception is not an execution failure
    exec_ok = candidate.status == "ok" or (reference.status != "ok" and candidate.ename == reference.ename)
    verdict = outputs_equivalent(compared_output(candidate.outputs), compared_output(reference.outputs),
                                 rel_tol=settings.rel_tol, abs_tol=settings.abs_tol)
    state = _state_difference(reference, candidate)
    reasons = []
    if candidate.status == "error":
        reasons.append(f"{candidate.ename}: {candidate.evalue}")
    if not verdict.equal:
        reasons.append(f"output differs: {verdict.reason}")
    if state is not None:
        reasons.append(f"state differs: {state}")
    return replace(ran, exec_ok=exec_ok, output_match=verdict.equal, state_match=state is None,
                   functional_match=verdict.equal and state is None, reason=clip("; ".join(reasons)))


def refused(record: PredictionRecord | ExampleRecord, reason: str) -> PredictionRecord | ExampleRecord:
    """The record refused for `reason`: an example's status, a prediction's outcome."""
    if isinstance(record, ExampleRecord):
        return replace(record, status="refused", reason=clip(reason))
    return replace(record, outcome="refused", reason=clip(reason))


def unjudged(record: PredictionRecord) -> PredictionRecord:
    """The record of a prediction whose example defines no functional answer: no execution score (a refusal
    stays as it is)."""
    if record.outcome == "refused":
        return record
    return replace(record, exec_ok=None, output_match=None, state_match=None, functional_match=None,
                   continuation_match=None)


def finish_example(example: ExampleRecord, records: list[PredictionRecord],
                   settings: ScoreSettings) -> tuple[ExampleRecord, list[PredictionRecord]]:
    """A scored example with its pass@k, and its records, where a prediction refused for its own sake (too long)
    counts as a failure."""
    records = [replace(r, exec_ok=False, output_match=False, state_match=False, functional_match=False)
               if r.outcome == "refused" else r for r in records]
    correct = sum(1 for r in records if r.functional_match)
    return replace(example, status="scored", correct=correct,
                   pass_at_k={f"pass@{k}": pass_at_k(len(records), correct, k)
                              for k in settings.k if k <= len(records)}), records


def continuation_time(result: Any) -> float:
    """The own run time of the continuation cells a branch ran after its candidate (0 when none)."""
    return round(sum(float(cell.get("duration_s") or 0.0) for cell in result.continuation), 6)
