"""The probe mode as an Inspect tool: `run_probe(code)` runs in a fresh branch of the sample's exact pre-cell state,
behind the branch walls, with the probe budget, cut and time limit of `--probes/--probe-chars/--probe-timeout`.

Each sample's state is served by a kernel of its own (`ServedState`), brought to the sample's step by the state
server (`themisto.release.states.pre_step_states`: restored from the release's stored values where they restore it,
else replayed to; a kernel per sample would otherwise replay every sample's prefix) in a kernel that sees none of the
host's files, and each probe runs there through generation's own door (`themisto.generation.probing.ServedProbes`).
The conversation (`probe_solver`) lets the model call the tool up to the budget, then asks it for its answer without
tools; Inspect records every call and answer in the sample's transcript, and the Themisto transcript (the probes,
their state checks) goes to the sample's store, which `themisto score LOG.eval` puts on the generation line.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack

from themisto.generation.probe_protocol import (NO_PROBES_LEFT, TOOL_NAME, TOOL_SCHEMA, ProbeRun, ProbeSettings,
                                                Transcript)

STORE_KEY = "themisto_probes"  # where the sample's Themisto transcript lies in its store


class ServedState:
    """One sample's pre-cell state, live in a kernel of its own for as long as its conversation lasts: `start` brings
    the kernel to it, `probe` runs one probe in a fresh branch of it, `close` settles the probes' state checks and
    ends the kernel. Each call blocks (the solver makes them from worker threads, one at a time: the kernel session
    takes calls from any thread)."""

    def __init__(self, permit, info, kernel_id: str, step: int, settings: ProbeSettings, workspace):
        self.permit, self.info, self.kernel_id, self.step = permit, info, kernel_id, step
        self.settings, self.workspace = settings, workspace
        self.failure: str | None = None
        self.runs: list[ProbeRun] = []
        self._kernel = ExitStack()
        self._door = None

    def start(self) -> None:
        """Bring a fresh kernel to the state; when it cannot be, `failure` says why (the conversation goes on
        without probes)."""
        from themisto.generation.probing import ServedProbes, probe_limits
        from themisto.release.states import pre_step_states

        try:
            walk = self._kernel.enter_context(pre_step_states(self.info, self.kernel_id, [self.step], self.workspace,
                                                              limits=probe_limits(self.info), restore=True))
            state = next(iter(walk), None)
            if state is None:
                self.failure = f"the replay of {self.kernel_id} never reached step {self.step}"
            else:
                self._door = ServedProbes(self.permit, state, self.settings)
        except Exception as error:  # noqa: BLE001 - whatever stopped the state, the conversation goes on without it
            self.failure = f"the state could not be served: {type(error).__name__}: {str(error)[:300]}"
        if self._door is None:
            self._kernel.close()

    def probe(self, code: str) -> ProbeRun | None:
        """Run one probe (None when the state is not served)."""
        if self._door is None:
            return None
        run = self._door.run(code, "")
        self.runs.append(run)
        return run

    def close(self) -> None:
        try:
            if self._door is not None:
                self._door.probes.settle()  # the probes' state checks, filled into their records
        finally:
            self._door = None
            self._kernel.close()


def _probe_tool(served: ServedState, settings: ProbeSettings):
    """`run_probe(code)` for one conversation, described by the protocol's one tool schema."""
    from inspect_ai.tool import ToolDef

    async def run_probe(code: str) -> str:
        if len(served.runs) >= settings.max_probes:
            return NO_PROBES_LEFT
        import anyio

        run = await anyio.to_thread.run_sync(served.probe, code)
        if run is None:
            return f"(not run: {served.failure or 'the state is no longer served'})"
        return run.reply(len(served.runs), settings.max_probes - len(served.runs))

    function = TOOL_SCHEMA["function"]
    return ToolDef(run_probe, name=TOOL_NAME, description=function["description"],
                   parameters={"code": function["parameters"]["properties"]["code"]["description"]}).as_tool()


def probe_solver(info, settings: ProbeSettings, permit, workspace, slots: threading.BoundedSemaphore):
    """The probe mode's conversation: the model may call `run_probe` up to the budget, then answers without tools.
    `workspace()` gives the release's input files (`themisto.release.workspaces.ReleaseInputs`, found once); `slots`
    bounds the kernels live at once."""
    from inspect_ai.model import ChatMessageTool, ChatMessageUser
    from inspect_ai.solver import solver
    from inspect_ai.util import store

    @solver(name="themisto_probe")
    def probe():
        async def solve(state, generate):
            import anyio

            metadata = state.metadata or {}
            if metadata.get("skipped"):
                return state
            await anyio.to_thread.run_sync(slots.acquire)
            served = ServedState(permit, info, metadata["kernel_id"], int(metadata["step"]), settings,
                                 await anyio.to_thread.run_sync(workspace))
            try:
                await anyio.to_thread.run_sync(served.start)
                state.tools = [_probe_tool(served, settings)] if served.failure is None else []
                stop, turns = "answered", 0
                while True:
                    before = len(state.messages)
                    state = await generate(state, tool_calls="single")
                    turns += 1
                    asked = any(isinstance(m, ChatMessageTool) for m in state.messages[before:])
                    if not asked:
                        break
                    if len(served.runs) >= settings.max_probes or turns > settings.max_probes:
                        stop = "max_probes"
                        state.tools = []
                        state.messages.append(ChatMessageUser(content=NO_PROBES_LEFT))
                        state = await generate(state, tool_calls="none")
                        turns += 1
                        break
            finally:
                await anyio.to_thread.run_sync(served.close)
                slots.release()
            if served.failure is not None:
                stop = "state_unavailable"
            record = Transcript(protocol=settings.protocol, allowed=settings.max_probes, used=len(served.runs),
                                stop=stop, turns=turns, probes=list(served.runs),
                                probe_s=round(sum(p.wall_s for p in served.runs), 6))
            store().set(STORE_KEY, record.to_dict())
            return state

        return solve

    return probe()
