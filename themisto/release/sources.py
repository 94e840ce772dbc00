"""A release built from several sources: the replay's workspace laid out for each, the replay's health applied to the
rows, and the build report's figures per source.

JuNE trajectories replay over look-alike inputs; IPython sessions over their own repository's files. When a build
holds trajectories that name their own workspace subfolder (`Trajectory.workspace`), the workspace is composed
(`themisto.replay.workspace_recipe.compose`): each repository's files under `ipython/<repository id>/`, the
look-alike inputs under `june/` for the JuNE trajectories. A build of JuNE logs alone lays out its workspace as
before, so its releases do not change.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

JUNE_TASKS = ("task1", "task2")


def replay_workspace(trajectories: list, folders: Mapping[str, Path | None], tmp: Path, *, given: Path | None,
                     seed: int, size: str, out: Path) -> tuple[Path | None, dict, list]:
    """(workspace folder, its recipe, the trajectories as they replay over it): a given folder, the look-alike
    inputs, or a composed workspace when some trajectory names its own subfolder."""
    from themisto.replay.workspace_recipe import JUNE_FOLDER, compose, given as given_recipe, look_alike

    own = [t for t in trajectories if t.workspace]
    tasks = sorted({t.task for t in trajectories if t.task in JUNE_TASKS}) or list(JUNE_TASKS)
    if not own:
        if given is not None:
            return given, given_recipe(given, output=out), trajectories
        from themisto.ingest.workspace import write_workspace

        folder = write_workspace(tmp / "ws", tasks, seed=seed, size=size).root
        return folder, look_alike(tasks, seed, size), trajectories
    if given is not None:
        raise ValueError("a workspace folder cannot be given for sources replayed in their own files (IPython "
                         "histories): leave it out")
    others = [t for t in trajectories if not t.workspace]
    recipe = compose(tmp / "ws", {t.workspace: folders.get(t.workspace) for t in own},
                     look_alike(tasks, seed, size) if others else None)
    moved = [t if t.workspace else replace(t, workspace=JUNE_FOLDER) for t in trajectories]
    return tmp / "ws", recipe, moved


def apply_health(rows: list[dict]) -> tuple[list[dict], dict]:
    """The rows with the replay's health applied (`themisto.replay.health`: steps past a cut dropped, each step's
    `replay_cause` set) and every text scrubbed (`themisto.release.scrub`); the health's counts, its cut of each
    trajectory it cut (`cut`: kernel -> {at, cause}), and the scrub's counts."""
    from themisto.release.scrub import Scrubber
    from themisto.release.tasks import group_by_kernel
    from themisto.replay.health import apply, judge

    health = judge(group_by_kernel(rows))
    scrubber = Scrubber()
    rows = [scrubber.row(row) for row in apply(rows, health)]
    return rows, {**health.counts(), "cut": dict(sorted(health.cut.items())),
                  "scrubbed": {"texts": scrubber.texts_changed,
                               "credentials": dict(sorted(scrubber.redactions.items())),
                               "kernel_env_paths": scrubber.host_paths}}


def why_nothing(source: Mapping[str, Any], trajectories: Sequence = ()) -> str:
    """Why a build has no trajectory row, in its build report's words: per corpus read, the sessions its checks
    left out and cut, by cause (`left_out`, `cut`); per trajectory replayed, where the checks cut it before replay
    (`provenance.cut`) and where replay health cut it to nothing (`health.cut`), by cause."""
    parts = []
    for corpus in source.get("corpora") or ():
        parts.append(f"a corpus of {corpus['repositories']} repositories gave {corpus['trajectories']} of its "
                     f"{corpus['sessions_long_enough']} sessions long enough; left_out: {_counts(corpus['left_out'])}; "
                     f"cut: {_counts(corpus['cut'])}")
    health = source.get("health") or {}
    if health.get("trajectories_cut"):
        parts.append(f"replay health: trajectories_cut: {_counts(health['trajectories_cut'])}")
    static = {t.id: (t.provenance or {}).get("cut") for t in trajectories}
    for kernel_id, cut in sorted((health.get("cut") or {}).items()):
        before = static.get(kernel_id)
        parts.append(f"trajectory {kernel_id}: " + (f"checks cut it at input {before['at']} ({before['cause']}), "
                                                    if before else "") +
                     f"replay health cut it at step {cut['at']} ({cut['cause']})")
    if trajectories and not health.get("cut"):
        parts.append(f"the replay gave no step of its {len(trajectories)} trajectories")
    return "; ".join(parts) or "the inputs gave no trajectory"


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) \
        or "none"


def sources_table(sources: Mapping[str, Any]) -> str:
    """The card's table of a build's sources (`per_source`), and what may be redistributed where some hold
    sessions of public repositories."""
    if not sources:
        return "One source (see above)."
    lines = ["| source | trajectories | steps | developers | test developers | licences (trajectories) |",
             "| --- | --- | --- | --- | --- | --- |"]
    unlicensed = 0
    for source, entry in sources.items():
        if source == "corpora":
            continue
        licences = entry.get("licences")
        unlicensed += (licences or {}).get("none", 0)
        shown = ", ".join(f"{k} {v}" for k, v in licences.items()) if licences else "see the licence section"
        lines.append(f"| `{source}` | {entry['trajectories']:,} | {entry['steps']:,} | {entry['developers']} | "
                     f"{entry['test_developers']} | {shown} |")
    if any(s.startswith("ipython") for s in sources):
        lines += ["", f"Sessions from public repositories keep their repository's licence (`provenance.licence`). "
                      f"{unlicensed} trajectories come from repositories without a licence file: nothing of them may be "
                      "redistributed, so a release holding them is for local research only; build with "
                      "`--content-release` for one that may be shared, and `--pointers` for the rest (see below)."]
    return "\n".join(lines)


def per_source(rows: Sequence[Mapping], split_of: Mapping[str, str], task_rows: Mapping[str, Mapping[str, list]],
               corpora: Sequence[Mapping] = ()) -> dict[str, Any]:
    """Per source: trajectories, steps, developers (all, and in test), rows of each task per split, the steps the
    environment failed by cause; and the corpus readers' reports under "corpora"."""
    out: dict[str, Any] = {}
    for row in rows:
        source = row.get("source") or "unknown"
        entry = out.setdefault(source, {"trajectories": set(), "steps": 0, "developers": set(),
                                        "test_developers": set(), "replay_causes": {}})
        entry["trajectories"].add(row["kernel_id"])
        entry["steps"] += 1
        developer = row.get("participant") or f"trajectory:{row['kernel_id']}"
        entry["developers"].add(developer)
        if split_of.get(row["kernel_id"]) == "test":
            entry["test_developers"].add(developer)
        cause = row.get("replay_cause")
        if cause:
            entry["replay_causes"][cause] = entry["replay_causes"].get(cause, 0) + 1
        if row.get("provenance") is not None:
            licence = row["provenance"].get("licence") or "none"
            entry.setdefault("licences", {}).setdefault(licence, set()).add(row["kernel_id"])
    kernels_source = {row["kernel_id"]: row.get("source") or "unknown" for row in rows}
    for entry in out.values():
        entry["rows"] = {}
    for task, splits in task_rows.items():
        for split, task_list in splits.items():
            for task_row in task_list:
                entry = out.get(kernels_source.get(task_row.get("kernel_id"), "unknown"))
                if entry is not None:
                    counts = entry["rows"].setdefault(task, {})
                    counts[split] = counts.get(split, 0) + 1
    summary = {source: {"trajectories": len(e["trajectories"]), "steps": e["steps"],
                        "developers": len(e["developers"]), "test_developers": len(e["test_developers"]),
                        "rows": e["rows"], "replay_causes": dict(sorted(e["replay_causes"].items())),
                        **({"licences": {k: len(v) for k, v in sorted(e["licences"].items())}}
                           if "licences" in e else {})}
               for source, e in sorted(out.items())}
    if corpora:
        summary["corpora"] = list(corpora)
    return summary
