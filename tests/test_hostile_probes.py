"""Hostile probes: a probe that changes the state, hangs, floods, forks, kills its parent, exits, or reads files that
are not its example's costs only its own answer. The kernel's state hash after every probe equals its hash before,
the next probe sees the state unchanged, and a run whose model writes such probes finishes with every example."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _isolation import isolation_unavailable
from _probe_release import KERNEL, NOTES

from themisto.gate import permit
from themisto.generation.backends.base import Sampling
from themisto.generation.example_spec import ExampleSpec
from themisto.generation.probe_protocol import STOPPED, ProbeSettings
from themisto.generation.probing import StateProbes, probe_limits
from themisto.generation.run_folder import Generation
from themisto.generation.runs import RunSettings, generate_run
from themisto.release.folder import open_release
from themisto.release.states import pre_step_states
from themisto.runtime.snapshot import take_snapshot
from themisto.vocabulary import PROBE_CONTEXT

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ProbeSettings(max_probes=2, output_chars=300, timeout_s=2.0, memory_bytes=512 * 2**20)
# Each check runs right after a hostile probe, in a fresh branch: the state it sees is the step's own.
CHECK = "print(words, total, sorted(scores), open('notes.txt').read(), end='')"
CHECKED = f"['a', 'b', 'c'] 45 ['a', 'b'] {NOTES}".rstrip("\n")  # a probe's output, as the model sees it


def _files_not_its_own(release: Path, secret: Path) -> str:
    """A probe that looks for what no example may read: the release (the answers, later cells), a host file, the
    project's checkout and its sample logs, the real logs beside it, and what an earlier probe planted."""
    paths = [str(release), str(next(release.glob("next_cell/*.parquet"))), str(secret), str(REPO / "data"),
             str(REPO.parent / "shared"), "planted.txt", "/tmp/planted.txt"]
    return "import os\nprint([os.path.exists(p) for p in %r], sorted(os.listdir('/tmp')) != [])" % paths


@pytest.fixture(scope="module")
def pre_step(probe_release, tmp_path_factory):
    """The live state before step 6 of the probe release (words has 'c'), in the probe replay's kernel, served by
    the state server, and a permit; yields (session, permit, release)."""
    from themisto.settings import settings as env_settings

    release, workspace = probe_release
    info = open_release(release)
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    try:
        with pre_step_states(info, KERNEL, [6], workspace, limits=probe_limits(info)) as walk:
            (state,) = list(walk)  # the walk ends after its one step; the kernel stays until the `with` ends
            yield state.session, permit(execute=True), release
    finally:
        mp.undo()
        env_settings.cache_clear()


def _probe(pre_step, code: str):
    """Run one hostile probe; check that the kernel's state hash is unchanged and that the next probe, whose branch
    was forked ahead of it once the hostile one had ended, sees the step's own state; return the hostile probe's
    record, its state check settled."""
    session, grant, _ = pre_step
    before = take_snapshot(session).state_hash
    probes = StateProbes(grant, session, SETTINGS)
    probe, lost = probes.unsafe_probe(code)
    assert not lost and session.alive
    assert take_snapshot(session).state_hash == before
    check, _ = probes.unsafe_probe(CHECK)
    probes.settle()
    assert (check.status, check.output, check.changed_state) == ("ok", CHECKED, False)
    assert take_snapshot(session).state_hash == before
    return probe


def test_a_probe_that_changes_the_state_changes_only_its_branch(pre_step):
    probe = _probe(pre_step, "words.append('z')\ndel total\nscores.clear()\nimport os\nos.remove('notes.txt')\n"
                             "open('planted.txt', 'w').write('x')\nopen('/tmp/planted.txt', 'w').write('x')\n"
                             "print(words)")
    assert probe.status == "ok" and probe.output == "['a', 'b', 'c', 'z']" and probe.changed_state is True


def test_a_probe_that_hangs_is_stopped_at_its_time(pre_step):
    probe = _probe(pre_step, "print('started')\nwhile True:\n    pass")
    # What it printed should come back before the note; at load average 15 it was once lost (the timer fired 2 s
    # late), an open question of the branch's output capture, so here only the stop and its note are required.
    stopped = STOPPED.format(timeout_s=2)
    assert probe.status == "timeout" and probe.output in ("started" + stopped, stopped)


def test_a_flood_of_output_is_cut_to_what_the_model_may_see(pre_step):
    probe = _probe(pre_step, "print('x' * 50_000_000)")
    assert probe.status == "ok" and probe.truncated
    assert probe.output.startswith("x" * SETTINGS.output_chars) and len(probe.output) < SETTINGS.output_chars + 80


def test_a_fork_storm_hits_the_process_cap(pre_step):
    session = pre_step[0]
    if session.kernel_uid is None and os.geteuid() == 0:
        isolation_unavailable("the kernel runs as root, which the process cap does not bind")
    probe = _probe(pre_step, "import os, time\nfor _ in range(5000):\n    if os.fork() == 0:\n"
                             "        time.sleep(600)\n        os._exit(0)")
    assert probe.status in ("error", "timeout")


@pytest.mark.parametrize("code", ["import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('alive')",
                                  "import os\nos.kill(-1, 9)", "import os\nos._exit(3)"],
                         ids=["parent", "everyone", "exit"])
def test_a_probe_that_kills_reaches_nothing_but_itself(pre_step, code):
    probe = _probe(pre_step, code)
    assert probe.status in ("ok", "error", "kernel_died")


def test_a_probe_sees_none_of_the_files_that_are_not_its_example_s(pre_step, tmp_path):
    _, _, release = pre_step
    secret = tmp_path / "answers.txt"
    secret.write_text("the answers")
    probe = _probe(pre_step, _files_not_its_own(release, secret))
    # Only the kernel's own folder lies in its /tmp; nothing else of the host, nothing an earlier probe planted.
    assert probe.output == f"{[False] * 7} True"


def test_a_probe_too_long_is_not_run(pre_step):
    probe = _probe(pre_step, "x = 1\n" * 1000)
    assert probe.status == "refused" and "not run" in probe.output


# ---------------------------------------------------------------------------------------------------------------
# a whole run whose model writes them


class HostileModelStandIn:
    """A stand-in for a model that writes hostile probes (no model writes these on demand): each conversation's
    first reply asks for the next hostile probe in turn, its second for a check of the state, its last answers."""

    raw_is_answer = False

    def __init__(self, hostile: list[str]):
        self.hostile = hostile
        self.examples: list[str] = []

    def generate(self, prompts, sampling: Sampling) -> list[list[Generation]]:
        out = []
        for prompt in prompts:
            turn = sum(1 for m in prompt.messages if m["role"] == "assistant")
            if prompt.id not in self.examples:
                self.examples.append(prompt.id)
            code = self.hostile[self.examples.index(prompt.id) % len(self.hostile)] if turn == 0 else "print(words)"
            reply = f"```probe\n{code}\n```" if turn < 2 and prompt.probes_left else "```python\nprint('done')\n```"
            out.append([Generation(reply, "ok", None, 10, 5)])
        return out

    def describe(self) -> dict:
        return {"backend": "baseline", "version": None, "model": "hostile-stand-in", "model_revision": None}


def test_a_run_whose_model_writes_hostile_probes_finishes_every_example(probe_release, tmp_path, allow_execution):
    release, workspace = probe_release
    hostile = ["words.append('z')\ndel total", "while True:\n    pass", "print('x' * 50_000_000)",
               "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "import os\nos._exit(3)",
               _files_not_its_own(release, tmp_path / "nothing")]
    settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=(PROBE_CONTEXT,), probe=SETTINGS),
                           backend="baseline", model="previous-cell")
    generate_run(open_release(release), tmp_path / "run", settings, backend=HostileModelStandIn(hostile), progress=False,
                 execute_probes=True, workspace=workspace)
    lines = [json.loads(line) for line in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    rows = {r["id"]: r for r in open_release(release).rows("next_cell", "test")}
    assert sorted(r["id"] for r in lines) == sorted(rows)
    for record in lines:
        assert record["status"] == "ok" and record["prediction"] == "print('done')"
        first, check = record["probes"]["probes"]
        assert record["probes"]["stop"] == "max_probes" and first["status"] in ("ok", "error", "timeout",
                                                                                "kernel_died")
        # The second probe sees its example's own `words`, whatever the first one did.
        words = next(v["repr"] for v in rows[record["id"]]["variables_before"] if v["name"] == "words")
        assert (check["status"], check["output"]) == ("ok", words)
