"""The probe mode as an Inspect tool: `run_probe(code)` runs in a fresh branch of the sample's exact pre-cell state,
behind the branch walls, with the probe budget, cut and time limit of `--probes/--probe-chars/--probe-timeout`.

Each sample's state is served by a kernel of its own (`ServedState`): a worker thread walks the sample's trajectory to
its step (`themisto.replay.states.walk_states`, restoring the state from the release's stored values where they
restore it, else replaying the prefix) in a kernel that sees none of the host's files, and runs each probe there
through generation's own door (`themisto.generation.probing.StateProbes.unsafe_probe`). The conversation
(`probe_solver`) lets the model call the tool up to the budget, then asks it for its answer without tools; Inspect
records every call and answer in the sample's transcript, and the Themisto transcript (the probes, their state
checks) goes to the sample's store, which `themisto score LOG.eval` puts on the generation line.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from pathlib import Path

from themisto.generation.probe_protocol import (NO_PROBES_LEFT, TOOL_NAME, TOOL_SCHEMA, ProbeRun, ProbeSettings,
                                                Transcript)

STORE_KEY = "themisto_probes"  # where the sample's Themisto transcript lies in its store


class ServedState:
    """One sample's pre-cell state, live in a worker thread for as long as its conversation lasts: `start` walks to
    it, `probe` runs one probe in a fresh branch of it, `close` ends the kernel (the probes' state checks settled)."""

    def __init__(self, permit, info, kernel_id: str, step: int, settings: ProbeSettings, workspace: Path):
        self.permit, self.info, self.kernel_id, self.step = permit, info, kernel_id, step
        self.settings, self.workspace = settings, workspace
        self.requests: queue.Queue = queue.Queue()
        self.ready = threading.Event()
        self.failure: str | None = None
        self.runs: list[ProbeRun] = []
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Walk to the state (blocking until it is reached or could not be)."""
        self._thread = threading.Thread(target=self._serve, name=f"themisto-probe-{self.kernel_id}", daemon=True)
        self._thread.start()
        self.ready.wait()

    def _restore(self, session, step: int) -> int:
        from themisto.replay.restore import RestoreError, restore_before
        from themisto.replay.states import recorded_replay_settings
        from themisto.scoring.execution import release_values
        from themisto.scoring.release_state import Release

        rows = self.info.trajectories_by_kernel()[self.kernel_id]
        release = Release(name=str(self.info.path), task_rows={}, trajectories={}, workspace=self.info.workspace,
                          replay=self.info.replay)
        try:
            done = restore_before(session, rows, step, release_values(release),
                                  cell_timeout_s=recorded_replay_settings(self.info.replay).cell_timeout_s)
        except RestoreError:
            return 0
        return done.step or 0

    def _serve(self) -> None:
        from themisto.generation.probing import probe_limits
        from themisto.replay.states import recorded_replay_settings, walk_states

        try:
            rows = self.info.trajectories_by_kernel().get(self.kernel_id)
            if rows is None:
                raise KeyError(f"the release has no trajectories rows for {self.kernel_id}")
            restore = self._restore if self.info.has("values", "test") or self.info.has("values", "train") else None
            walk_states(rows, [self.step], self.workspace, recorded_replay_settings(self.info.replay), self._at_step,
                        limits=probe_limits(self.info), restore=restore)
            if not self.ready.is_set():
                self.failure = f"the replay of {self.kernel_id} never reached step {self.step}"
        except Exception as error:  # the state could not be served: the conversation goes on without probes
            self.failure = f"the state could not be served: {type(error).__name__}: {str(error)[:300]}"
        finally:
            self.ready.set()
            while not self.requests.empty():  # a probe asked after the kernel ended
                item = self.requests.get_nowait()
                if item is not None:
                    item[1].set_result(None)

    def _at_step(self, state) -> None:
        from themisto.generation.probing import StateProbes

        probes = StateProbes(self.permit, state.session, self.settings)
        probes.ahead()
        self.ready.set()
        try:
            while (item := self.requests.get()) is not None:
                code, future = item
                try:
                    run, lost = probes.unsafe_probe(code)
                    if lost or not state.session.alive:
                        state.rebuild()
                    future.set_result(run)
                except BaseException as error:
                    future.set_exception(error)
                    raise
        finally:
            probes.settle()  # the probes' state checks, filled into their records

    async def probe(self, code: str) -> ProbeRun | None:
        """Run one probe (None when the state is gone)."""
        import anyio

        if self.failure is not None or self._thread is None or not self._thread.is_alive():
            return None
        future: Future = Future()
        self.requests.put((code, future))
        run = await anyio.to_thread.run_sync(future.result)
        if run is not None:
            self.runs.append(run)
        return run

    def close(self) -> None:
        if self._thread is not None:
            self.requests.put(None)
            self._thread.join()


def _probe_tool(served: ServedState, settings: ProbeSettings):
    """`run_probe(code)` for one conversation, described by the protocol's one tool schema."""
    from inspect_ai.tool import ToolDef

    async def run_probe(code: str) -> str:
        if len(served.runs) >= settings.max_probes:
            return NO_PROBES_LEFT
        run = await served.probe(code)
        if run is None:
            return f"(not run: {served.failure or 'the state is no longer served'})"
        return run.reply(len(served.runs), settings.max_probes - len(served.runs))

    function = TOOL_SCHEMA["function"]
    return ToolDef(run_probe, name=TOOL_NAME, description=function["description"],
                   parameters={"code": function["parameters"]["properties"]["code"]["description"]}).as_tool()


def probe_solver(info, settings: ProbeSettings, permit, workspace, slots: threading.BoundedSemaphore):
    """The probe mode's conversation: the model may call `run_probe` up to the budget, then answers without tools.
    `workspace()` gives the release's input folder (made once); `slots` bounds the kernels live at once."""
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
