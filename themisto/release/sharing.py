"""What a release may redistribute, and pointers for the rest: each trajectory's licence (SPDX id, detected at its
session's commit), the partition of a build into a content release and a pointer list, the Hub's gated-access
fields, and the check `themisto push` makes before a public upload.

May be redistributed: the authored sample (MIT, shipped with the project; known by its files' sha256) and sessions
of public repositories whose licence is one of the allowed SPDX ids (`themisto.ingest.licences.REDISTRIBUTABLE`, a
setting). Everything else (sessions of unlicensed repositories, and the JuNE logs while their status is unclear)
becomes a pointer (`themisto.ingest.pointers`): where it lies and what Themisto made of it, never its code or output.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from themisto.ingest.licences import NONE, REDISTRIBUTABLE, Licence, may_redistribute

SAMPLE = "authored-sample"  # the class of the shipped sample's trajectories
UNCLEAR = "status unclear"  # JuNE logs and other sources no licence covers
GATED_PROMPT = ("This dataset holds development sessions committed to public repositories by their developers. You "
                "may use it for research only; you agree to update to its latest version, from which sessions are "
                "removed when their developers ask, and not to try to identify any developer.")
GATED_FIELDS = {"I will use this dataset for research only": "checkbox",
                "I will update to the latest version, which honours removal requests": "checkbox",
                "I will not try to re-identify any developer or person in the data": "checkbox"}


@dataclass(frozen=True)
class Origin:
    """Where a corpus repository's sessions lie: its name, commit, licence, and per stored file (as a trajectory's
    provenance names it) the repository path and git blob id."""

    repo: str
    commit: str | None
    licence: Licence
    files: dict[str, tuple[str, str, str]]  # provenance path -> (repository path, blob, "commit" or "stored")


def corpus_origins(paths: Iterable[Path]) -> dict[str, Origin]:
    """Per repository id, the origin of every corpus among `paths` (read from each `repo.json`; the licence detected
    from the kept licence file where there is one, else the one recorded)."""
    from themisto.ingest.ipython_corpus import (is_corpus, read_repository, repository_folders, repository_record,
                                                session_files, stored_path)
    from themisto.ingest.pointers import git_blob_id

    out = {}
    for path in (Path(p) for p in paths):
        if not is_corpus(path):
            continue
        for folder in repository_folders(path):
            record, repo = repository_record(folder), read_repository(folder)
            listed = {e.get("stored"): e for key in ("histories", "logs") for e in record.get(key) or []
                      if isinstance(e, dict)}
            files = {}
            for kind, file in session_files(repo):
                entry = listed.get(f"{kind}/{file.name}") or {}
                path_in_repo = str(entry.get("path") or stored_path(file))
                blob, of = ((entry["blob"], "commit") if entry.get("blob")
                            else (git_blob_id(file.read_bytes()), "stored"))
                files[stored_path(file)] = (path_in_repo, blob, of)
            out[repo.id] = Origin(record["repo"], repo.commit, _licence(repo, record), files)
    return out


def _licence(repo, record: dict) -> Licence:
    from themisto.ingest.licences import identify_licence, recorded_licence

    recorded = recorded_licence(record.get("licence"))
    file = recorded.file and repo.files / recorded.file
    if file and file.is_file() and not file.is_symlink():
        return identify_licence(file.read_text(encoding="utf-8", errors="replace"), recorded.file)
    return recorded


def sample_hashes() -> frozenset[str]:
    """The sha256 of the shipped sample's logs (authored by the project, MIT)."""
    from themisto.release.folder import shipped

    return frozenset(hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(shipped("data/sample").glob("*.log")))


def licence_class(trajectory, origins: Mapping[str, Origin], samples: frozenset[str]) -> str:
    """What a trajectory's content is under: an SPDX id (or "none", "other") for a session of a public repository,
    SAMPLE for the authored sample, "<source>: status unclear" for the rest (the JuNE logs)."""
    if trajectory.source.startswith("ipython"):
        origin = origins.get((trajectory.provenance or {}).get("repository"))
        if origin is not None:
            return origin.licence.spdx
        return (trajectory.provenance or {}).get("licence") or NONE
    if trajectory.sources and all(s.sha256 in samples for s in trajectory.sources):
        return SAMPLE
    return f"{trajectory.source}: {UNCLEAR}"


@dataclass
class SharingPlan:
    """Which trajectories of a build a content release may hold (`shared`) and which become pointers, and why."""

    allowed: tuple[str, ...]
    classes: dict[str, str] = field(default_factory=dict)  # trajectory id -> licence class (`licence_class`)

    def may_share(self, trajectory_id: str) -> bool:
        cls = self.classes.get(trajectory_id, UNCLEAR)
        return cls == SAMPLE or may_redistribute(cls, self.allowed)

    def shared(self) -> set[str]:
        return {t for t in self.classes if self.may_share(t)}

    def summary(self) -> dict:
        """Counts only (a build report and a card show it): trajectories per class, shared and pointed."""
        by_class: dict[str, dict[str, int]] = {}
        for trajectory_id, cls in sorted(self.classes.items()):
            side = "shared" if self.may_share(trajectory_id) else "pointed"
            by_class.setdefault(cls, {"shared": 0, "pointed": 0})[side] += 1
        return {"allowed": list(self.allowed), "shared": len(self.shared()),
                "pointed": len(self.classes) - len(self.shared()), "by_licence": by_class,
                "sample_ids": sorted(t for t, cls in self.classes.items() if cls == SAMPLE)}

    def relabelled(self, rows: Sequence[dict]) -> list[dict]:
        """The rows with each public repository's session under its detected SPDX id (`provenance.licence`)."""
        out = []
        for row in rows:
            cls = self.classes.get(row["kernel_id"])
            if row.get("provenance") and (row.get("source") or "").startswith("ipython") and cls is not None:
                row = {**row, "provenance": {**row["provenance"], "licence": cls}}
            out.append(row)
        return out


def plan_sharing(trajectories: Iterable, origins: Mapping[str, Origin],
                 allowed: tuple[str, ...] = REDISTRIBUTABLE) -> SharingPlan:
    samples = sample_hashes()
    return SharingPlan(allowed, {t.id: licence_class(t, origins, samples) for t in trajectories})


def pointers_of(plan: SharingPlan, trajectories: Iterable, rows: Sequence[dict], split: Mapping,
                origins: Mapping[str, Origin]) -> list:
    """A pointer (`themisto.ingest.pointers.Pointer`) for each trajectory the plan does not share and the build kept:
    where its inputs lie, their hash, its licence, and what the build made of it (split, cuts, steps, causes)."""
    from themisto.ingest.pointers import Pointer
    from themisto.ingest.trajectory import inputs_sha256

    side = {kernel: group["split"] for group in split.get("groups", []) for kernel in group["trajectories"]}
    steps: dict[str, int] = {}
    causes: dict[str, dict[str, int]] = {}
    for row in rows:
        steps[row["kernel_id"]] = steps.get(row["kernel_id"], 0) + 1
        if row.get("replay_cause"):
            mine = causes.setdefault(row["kernel_id"], {})
            mine[row["replay_cause"]] = mine.get(row["replay_cause"], 0) + 1
    out = []
    for t in trajectories:
        if plan.may_share(t.id) or t.id not in steps:
            continue
        provenance = t.provenance or {}
        common = dict(id=t.id, source=t.source, inputs=provenance.get("inputs") or len(t.executions),
                      licence=plan.classes.get(t.id), split=side.get(t.id), steps=steps[t.id],
                      cut=provenance.get("cut"), replay_causes=dict(sorted(causes.get(t.id, {}).items())))
        origin = origins.get(provenance.get("repository"))
        if origin is not None:
            path, blob, of = origin.files.get(provenance.get("path"), (provenance.get("path"), None, None))
            out.append(Pointer(**common, inputs_sha256=provenance["inputs_sha256"], repository=origin.repo,
                               commit=origin.commit, path=path, session=provenance.get("session"), blob=blob,
                               blob_of=of))
        else:
            first = t.sources[0] if t.sources else None
            out.append(Pointer(**common, inputs_sha256=inputs_sha256([e.code for e in t.executions]),
                               file=first.file if first else None, file_sha256=first.sha256 if first else None))
    return out


def gated_fields() -> dict:
    """The Hub's gated-access fields a card of sessions from public repositories carries."""
    return {"extra_gated_prompt": GATED_PROMPT, "extra_gated_fields": dict(GATED_FIELDS)}


def public_push_problem(release) -> str | None:
    """Why a release may not be pushed to a public repository (its trajectories' licence classes outside what the
    build allowed, counted), or None: every trajectory may be redistributed."""
    sharing = release.build.source.get("sharing") or {}
    allowed = tuple(sharing.get("allowed") or REDISTRIBUTABLE)
    sample = release.build.source.get("kind") == "shipped-sample"
    shared_samples = set(sharing.get("sample_ids") or [])
    refused: dict[str, set[str]] = {}
    for split in release.splits("trajectories"):
        for row in release.rows("trajectories", split, columns=["kernel_id", "source", "provenance"]):
            source = row["source"] or "unknown"
            if source.startswith("ipython"):
                cls = (row["provenance"] or {}).get("licence") or NONE
                if may_redistribute(cls, allowed):
                    continue
            elif sample or row["kernel_id"] in shared_samples:
                continue
            else:
                cls = f"{source}: {UNCLEAR}"
            refused.setdefault(cls, set()).add(row["kernel_id"])
    if not refused:
        return None
    named = "; ".join(f"{len(ids)} trajectories under {cls}" for cls, ids in sorted(refused.items()))
    return (f"{release.path}: may not be pushed to a public repository: it holds content that may not be "
            f"redistributed ({named}; allowed: {', '.join(allowed)}). Push the content release a build writes with "
            f"--content-release (its pointer list covers the rest), or push with --private")


def sharing_section(report) -> str:
    """The card's words on which release this is, what it may redistribute, its pointers, how to rebuild and how
    removals are asked for and applied."""
    sharing, source = report.source.get("sharing"), report.source
    allowed = ", ".join((sharing or {}).get("allowed") or REDISTRIBUTABLE)
    lines = []
    if source.get("release") == "content":
        lines.append(f"This is the **content release** of its build: it holds only what may be redistributed, the "
                     f"authored sample and sessions of public repositories under one of: {allowed}.")
    elif source.get("kind") == "shipped-sample":
        lines.append("This release holds the authored sample only (MIT): it may be redistributed.")
    else:
        lines.append("This is the **full release** of its build, for local research: it may hold trajectories that "
                     "may not be redistributed (the table below). `themisto push` refuses it for a public repository.")
    if sharing and sharing.get("by_licence"):
        lines += ["", "| licence of the build's trajectories | in the content release | pointed at |",
                  "| --- | ---: | ---: |"]
        lines += [f"| {cls} | {n['shared']} | {n['pointed']} |" for cls, n in sharing["by_licence"].items()]
    lines += ["", "What may not be redistributed is kept as a **pointer list** (`themisto build --pointers FILE`, a "
              "JSON-lines file written beside the releases, never inside one and never committed): per trajectory the "
              "repository, commit, history file, session, the file's git blob id and the hash of the session's "
              "inputs, with the split, cuts and replay causes Themisto gave it; no code, no output. To rebuild: "
              "`themisto collect POINTERS --base-url https://github.com -o CORPUS` fetches each repository at its "
              "commit and checks that every pointed session reads back with the same id and inputs hash; "
              "`themisto build CORPUS ...` then builds those trajectories again."]
    removals = source.get("removals") or {}
    lines += ["", "**Removal.** A developer who wants their repository's sessions out of this dataset asks the "
              "maintainers of this dataset (its repository's discussions), naming the repository or the owner; the "
              "entry goes on the opt-out list that `themisto collect` and `themisto build --removals` apply, and the "
              "next release leaves those sessions out. Update to the latest version so that removals reach you."]
    removed = sum(corpus.get("removed", 0) for corpus in source.get("corpora") or [])
    if removed:
        lines += ["", f"This build left out the sessions of {removed} repositories on the opt-out list."]
    if removals.get("by_date"):
        lines += ["", "| removal asked on | repositories | owners |", "| --- | ---: | ---: |"]
        lines += [f"| {date} | {n['repositories']} | {n['owners']} |" for date, n in removals["by_date"].items()]
    else:
        lines += ["", "No removal has been asked for so far."]
    return "\n".join(lines)
