"""Upload a checked release folder to a Hub dataset repository.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from themisto.release.check import check_release
from themisto.release.parquet import BUILD_FILE, README, ReleaseError


@dataclass
class UploadPlan:
    """What a push sends: the repository, and the release-relative files with their sizes."""

    repo_id: str
    folder: Path
    files: dict[str, int]
    private: bool
    revision: str | None
    commit_message: str


def upload_plan(folder: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
                commit_message: str | None = None) -> UploadPlan:
    """The files a push would upload (card, build report, Parquet), after `check_release` found no problem."""
    folder = Path(folder)
    if "/" not in repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ReleaseError(f"repo id {repo_id!r} must look like 'owner/name'")
    checked = check_release(folder)
    if not checked.ok:
        raise ReleaseError(f"{folder}: not pushed, the release has problems: " + "; ".join(checked.problems))
    files = {README: (folder / README).stat().st_size}
    if (folder / BUILD_FILE).is_file():
        files[BUILD_FILE] = (folder / BUILD_FILE).stat().st_size
    from themisto.release.eval_yaml import EVAL_FILE

    if (folder / EVAL_FILE).is_file():
        files[EVAL_FILE] = (folder / EVAL_FILE).stat().st_size
    for path in sorted(folder.rglob("*.parquet")):
        files[path.relative_to(folder).as_posix()] = path.stat().st_size
    report = json.loads((folder / BUILD_FILE).read_text(encoding="utf-8")) if BUILD_FILE in files else {}
    message = commit_message or f"Themisto release {report.get('content_sha256', '')[:12]}".strip()
    return UploadPlan(repo_id, folder, files, private, revision, message)


def push_release(plan: UploadPlan, api=None, *, token: str | None = None):
    """Create the dataset repository if needed and upload the planned files; returns the Hub's commit info.

    With the real Hub (no `api` given) the card is first validated by the Hub's own YAML check (online).
    """
    if api is None:
        from huggingface_hub import DatasetCard, HfApi

        DatasetCard.load(plan.folder / README).validate(repo_type="dataset")
        api = HfApi(token=token)
    api.create_repo(repo_id=plan.repo_id, repo_type="dataset", private=plan.private, exist_ok=True)
    return api.upload_folder(repo_id=plan.repo_id, repo_type="dataset", folder_path=str(plan.folder),
                             allow_patterns=sorted(plan.files), revision=plan.revision,
                             commit_message=plan.commit_message)
