"""The `probe` context mode: each example's conversation, its probes run in branches of its exact pre-cell state.

The states are served by one kernel per trajectory (`themisto.release.states.pre_step_states`), replayed to in
trajectory order, never restored from stored values (below), in a kernel that sees none of the host's files but its own (`Limits(view="minimal")`: no release, run folder or log to
read the answer from). At each step with examples their conversations run to the end: the model replies; a reply
that asks for a probe (a fenced `probe` block, or a native `run_probe` call) gets the probe run in a fresh branch of
the live state (`StateProbes`, through `themisto.runtime.branch.ProbeBranches`: the branch forked ahead of the probe,
the answer back before the state check) and its bounded output back; until the model answers, has used every probe
allowed, or the next output would not fit the prompt budget (then it is asked for its answer). The only module of
generation that runs model-written code (`StateProbes.unsafe_probe`), behind the execution permit. Each generation
line carries the transcript (`themisto.generation.probe_protocol.Transcript`, the state checks settled at the end of
its step), so scoring never probes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from themisto.gate import ExecutionPermit
from themisto.generation.backends.base import Sampling
from themisto.generation.probe_protocol import (CUT, DIED, KERNEL_LOST, MAX_PROBE_CODE_CHARS, NO_PROBES_LEFT, NO_ROOM,
                                                NOT_RUN, STOPPED, TOOL_NAME, TOOL_SCHEMA, ProbeRun, ProbeSettings,
                                                Transcript, find_probe, tool_call_code)
from themisto.generation.prompts import Prompt, approx_tokens, messages_text
from themisto.generation.run_folder import Generation
from themisto.release.folder import ReleaseError, ReleaseInfo
from themisto.release.workspaces import ReleaseInputs, SourceFolders

# The branch's own output cap, in bytes, per character a probe may show: the model sees `output_chars` characters,
# the rest only needs counting (a flood is cut in the branch, not carried to the host).
_BYTES_PER_CHAR = 4


# ---------------------------------------------------------------------------------------------------------------
# One probe


def _shown(result, settings: ProbeSettings) -> tuple[str, bool]:
    """What the model is shown of a branch's result: its output text (streams, results, the error), cut to the
    allowed characters, and whether anything was cut."""
    from themisto.runtime.outputs import output_text

    text = output_text(result.outputs)
    if result.status == "timeout":
        text += STOPPED.format(timeout_s=settings.timeout_s)
    elif result.status == "kernel_died":
        text += DIED
    cut = len(text) > settings.output_chars
    if cut:
        text = text[:settings.output_chars] + CUT.format(more=len(text) - settings.output_chars)
    return text, cut or bool(result.truncated)


class StateProbes:
    """The probes of one served state, each in a fresh branch of it (`themisto.runtime.branch.ProbeBranches`: the
    next probe's branch forked ahead of it, each one's answer back before its state check): `unsafe_probe` runs
    one, `settle` fills in every record's state check (`changed_state`, `suspicious`); call it before the records
    are written, and before the kernel runs anything else."""

    def __init__(self, permit: ExecutionPermit, session, settings: ProbeSettings):
        permit.check()
        self.permit, self.session, self.settings = permit, session, settings
        self._runs: list[tuple[object, int, ProbeRun]] = []  # each probe's branches, its number there, its record
        self._branches = None

    def _open(self):
        from themisto.runtime.branch import ProbeBranches

        if self._branches is None:
            self._branches = ProbeBranches(self.session, timeout_s=self.settings.timeout_s,
                                           memory_bytes=self.settings.memory_bytes,
                                           output_bytes=max(64 * 1024, _BYTES_PER_CHAR * self.settings.output_chars))
        return self._branches

    def ahead(self) -> None:
        """Say the state is reached: the first probe's branch is forked before the model asks (best effort)."""
        from themisto.runtime.branch import BranchError

        try:
            self._open().ahead()
        except BranchError:
            pass  # the first probe forks its own branch, and says what is wrong

    def unsafe_probe(self, code: str, raw: str = "") -> tuple[ProbeRun, bool]:
        """Run one model-written probe in a fresh branch of the session's current state: its record (its state
        check filled in by `settle`), and whether the kernel was lost (the caller rebuilds the state). The
        kernel's own state never changes; a probe that hangs, floods, forks or kills costs only itself."""
        from themisto.runtime.branch import BranchError

        self.permit.check()
        if len(code) > MAX_PROBE_CODE_CHARS:
            return ProbeRun(code=code[:MAX_PROBE_CODE_CHARS], status="refused", raw=raw,
                            output=NOT_RUN.format(limit=MAX_PROBE_CODE_CHARS, length=len(code))), False
        began = time.perf_counter()
        branches = self._open()
        try:
            result = branches.run(code)
        except BranchError as error:
            self._fill(branches, branches.settle(lost=True))
            self._branches = None  # the kernel is rebuilt: its next probes start a new count
            return ProbeRun(code=code, status="kernel_died", raw=raw, wall_s=round(time.perf_counter() - began, 6),
                            output=KERNEL_LOST.format(error=str(error)[:200])), True
        text, cut = _shown(result, self.settings)
        run = ProbeRun(code=code, status=result.status, output=text, truncated=cut,
                       changed_state=result.changed_state, duration_s=round(float(result.duration_s), 6),
                       wall_s=round(time.perf_counter() - began, 6), suspicious=list(result.suspicious), raw=raw)
        self._runs.append((branches, result.index, run))
        return run, False

    def _fill(self, branches, results: dict) -> None:
        for owner, index, run in self._runs:
            if owner is branches and index in results:
                run.changed_state = results[index].changed_state
                run.suspicious = list(results[index].suspicious)

    def settle(self) -> None:
        """Fill in every probe's state check: what it changed of its own branch, what its monitor flagged."""
        from themisto.runtime.branch import BranchError

        branches = self._branches
        if branches is None:
            return
        try:
            results = branches.settle()
        except BranchError:
            results = branches.settle(lost=True)
        self._fill(branches, results)


# ---------------------------------------------------------------------------------------------------------------
# One conversation


@dataclass
class Conversation:
    """One (example, sample)'s conversation: its first prompt, the messages so far, the probes run, the model calls
    made and their token counts, and once it ended, why and the final reply."""

    first: Prompt
    sample: int
    messages: list[dict]
    probes: list[ProbeRun] = field(default_factory=list)
    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    stop: str | None = None
    final: Generation | None = None
    last_call: bool = False  # the model was told to answer: this reply is the answer whatever it holds


def reserve_tokens(settings: ProbeSettings, max_new_tokens: int, count: Callable[[str], int]) -> int:
    """The prompt room a conversation's probes may take at most: each probe's request and its longest reply."""
    longest = ProbeRun(code="", status="ok", output="x" * settings.output_chars, truncated=True).reply(1, 1)
    return settings.max_probes * (max_new_tokens + count(longest))


def _turn_prompt(conversation: Conversation, settings: ProbeSettings) -> Prompt:
    left = 0 if conversation.last_call else settings.max_probes - len(conversation.probes)
    tools = [TOOL_SCHEMA] if settings.protocol == "native" and left > 0 else None
    return replace(conversation.first, messages=list(conversation.messages), probes_left=left, tools=tools,
                   turn=f"s{conversation.sample}t{conversation.turns}")


def _asked(generation: Generation, settings: ProbeSettings) -> tuple[str | None, dict | None]:
    """The probe a reply asks for (its code) and, for a native call, the call."""
    if settings.protocol == "native":
        for call in generation.tool_calls:
            if call.get("name") == TOOL_NAME:
                return tool_call_code(call.get("arguments")) or "", call
        return None, None
    return find_probe(generation.raw), None


def _append_probe(conversation: Conversation, generation: Generation, call: dict | None, probe: ProbeRun,
                  left: int) -> None:
    reply = probe.reply(len(conversation.probes), left)
    if call is None:
        conversation.messages += [{"role": "assistant", "content": generation.raw}, {"role": "user", "content": reply}]
        return
    conversation.messages += [
        {"role": "assistant", "content": generation.raw,
         "tool_calls": [{"id": call["id"], "type": "function",
                         "function": {"name": TOOL_NAME, "arguments": call.get("arguments") or "{}"}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": reply}]
    if not left:
        conversation.messages.append({"role": "user", "content": NO_PROBES_LEFT})


def converse(conversations: list[Conversation], backend, sampling: Sampling, settings: ProbeSettings,
             budget: int | None, count: Callable[[str], int] | None,
             run_probe: Callable[[str, str], ProbeRun]) -> None:
    """Run every conversation to its end, the turns of all of them batched together: each model call, then each
    probe asked for (`run_probe(code, raw)`), until each has answered or been made to."""
    one = replace(sampling, n=1)
    count = count or approx_tokens
    while True:
        active = [c for c in conversations if c.stop is None or c.last_call and c.final is None]
        if not active:
            return
        prompts = [_turn_prompt(c, settings) for c in active]
        for conversation, prompt, samples in zip(active, prompts, backend.generate(prompts, one)):
            generation = samples[0] if samples else Generation("", "failed", "the backend returned no sample")
            conversation.turns += 1
            conversation.tokens_in += generation.tokens_in or 0
            conversation.tokens_out += generation.tokens_out or 0
            if generation.status != "ok":
                conversation.stop, conversation.final = "backend_failed", generation
                continue
            may_ask = not conversation.last_call and len(conversation.probes) < settings.max_probes
            code, call = _asked(generation, settings) if may_ask else (None, None)
            if code is None:
                conversation.stop = conversation.stop or "answered"
                conversation.final = generation
                continue
            if budget is not None:  # the next turn must fit with this probe's longest reply
                longest = ProbeRun(code=code, status="ok", output="x" * settings.output_chars).reply(1, 1)
                room = count(messages_text([*prompt.messages, {"content": generation.raw}, {"content": longest}]))
                if room > budget:
                    conversation.messages += [{"role": "assistant", "content": generation.raw},
                                              {"role": "user", "content": NO_ROOM}]
                    conversation.stop, conversation.last_call = "budget", True
                    continue
            probe = run_probe(code, generation.raw)
            conversation.probes.append(probe)
            left = settings.max_probes - len(conversation.probes)
            _append_probe(conversation, generation, call, probe, left)
            if not left:
                conversation.stop, conversation.last_call = "max_probes", True


def transcript(conversation: Conversation, settings: ProbeSettings) -> Transcript:
    return Transcript(protocol=settings.protocol, allowed=settings.max_probes, used=len(conversation.probes),
                      stop=conversation.stop or "answered", turns=conversation.turns, probes=list(conversation.probes),
                      probe_s=round(sum(p.wall_s for p in conversation.probes), 6))


# ---------------------------------------------------------------------------------------------------------------
# The states, served in trajectory order


def probe_limits(info: ReleaseInfo):
    """The kernel limits of a probe replay: the release replay's, with the minimal view of the host's files, and
    limits in wall seconds (a probe is model-written code: a limit in CPU seconds would let it wait longer)."""
    from themisto.release.states import recorded_replay_settings
    from themisto.replay.replay import kernel_limits

    return replace(kernel_limits(recorded_replay_settings(info.replay)), view="minimal", cell_clock="wall")


@dataclass(frozen=True)
class ServedStep:
    """The examples (task rows) of one step and what their probes need: a function that runs one probe in a fresh
    branch of the step's live state, and one that fills in the state checks of the probes run (`StateProbes.settle`:
    before their records are written). A step whose state could not be served has no `run_probe`, and `failure`
    says why."""

    kernel_id: str
    step: int
    rows: list[dict]
    run_probe: Callable[[str, str], ProbeRun] | None = None
    settle: Callable[[], None] = lambda: None
    failure: str | None = None


def probe_workspace(info: ReleaseInfo, workspace: SourceFolders | str | Path | None, tmp: Path) -> ReleaseInputs:
    """The input files the release's trajectories were replayed over, found again (`themisto.release.workspaces`):
    look-alike inputs made under `tmp`, a given `workspace` (checked against its hash), the repositories' files where
    the build noted them or `workspace.sources` names them; a RecipeError or ReleaseError, the input's refusal, when
    the release as a whole cannot say."""
    from themisto.release.workspaces import open_inputs

    return open_inputs(info, workspace, tmp)


class ServedProbes:
    """One served step's probe door: each probe through `StateProbes.unsafe_probe`; after a probe that took the
    kernel down, the state rebuilt, and once it cannot be (StateLost), every later probe refused unrun."""

    def __init__(self, permit: ExecutionPermit, state, settings: ProbeSettings):
        self.state, self.lost = state, None
        self.probes = StateProbes(permit, state.session, settings)
        self.probes.ahead()

    def run(self, code: str, raw: str) -> ProbeRun:
        from themisto.runtime.rebuild import StateLost

        if self.lost is not None:
            return ProbeRun(code=code, status="kernel_died", raw=raw, output=KERNEL_LOST.format(error=self.lost))
        probe, lost = self.probes.unsafe_probe(code, raw)
        if lost or not self.state.session.alive:
            try:
                self.state.rebuild()
            except StateLost as error:
                self.lost = f"the state could not be rebuilt: {str(error)[:160]}"
        return probe


def serve_states(permit: ExecutionPermit, info: ReleaseInfo, rows: list[dict], settings: ProbeSettings,
                 workspace: ReleaseInputs) -> Iterator[ServedStep]:
    """Each step of `rows` that has examples, in trajectory order, with its live pre-step state behind its
    `run_probe`: one kernel per trajectory over a copy of its input files (`probe_workspace`), brought to each state by
    the state server (`themisto.release.states.pre_step_states`) by replay alone. A trajectory whose state could not be served yields its examples not yet served in one
    ServedStep with the `failure` (they get no probes), and so does one whose state was lost for good after a
    probe (the step where it was lost keeps its conversations, their later probes refused)."""
    from themisto.release.states import pre_step_states
    from themisto.release.workspaces import SourcesUnavailable
    from themisto.runtime.branch import BranchError
    from themisto.runtime.rebuild import StateLost
    from themisto.runtime.sandbox import KernelStartError
    from themisto.runtime.snapshot import AgentError

    permit.check()
    by_kernel: dict[str, dict[int, list[dict]]] = {}
    for row in rows:
        by_kernel.setdefault(row["kernel_id"], {}).setdefault(int(row["step"]), []).append(row)
    limits = probe_limits(info)
    for kernel_id, steps in sorted(by_kernel.items()):
        seen: set[int] = set()
        failure = None
        try:
            # No restore: what a probe reads is just what a restore cannot give back (the files the skipped cells
            # wrote, random generators, module settings), and whether a gap is restored depends on how long the last
            # restore took here, so the same run on another host would show its model other outputs.
            with pre_step_states(info, kernel_id, steps, workspace, limits=limits) as walk:
                for state in walk:
                    door = ServedProbes(permit, state, settings)
                    try:
                        yield ServedStep(kernel_id, state.step, steps[state.step], door.run, door.probes.settle)
                    finally:
                        door.probes.settle()  # nothing of a probe's branch outlives the step's state
                    seen.add(state.step)  # only once every example of the step got its line
                    if door.lost is not None:
                        failure = f"the state could not be served: {door.lost}"
                        break
        except SourcesUnavailable as error:
            failure = f"the state could not be served: {str(error)[:300]}"
        except (KernelStartError, AgentError, BranchError, StateLost, OSError, ReleaseError) as error:
            failure = f"the state could not be served: {type(error).__name__}: {str(error)[:300]}"
        unseen = [row for step, step_rows in sorted(steps.items()) if step not in seen for row in step_rows]
        if unseen:
            yield ServedStep(kernel_id, -1, unseen,
                             failure=failure or f"the replay of {kernel_id} never reached the example's step")
