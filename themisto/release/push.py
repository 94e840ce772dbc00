"""Upload a checked release folder to a Hub dataset repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from themisto.release.check import check_release
from themisto.release.folder import BUILD_FILE, CARD_FILE, EVAL_FILE, ReleaseError, open_release
from themisto.release.sharing import public_push_problem


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
    """The files a push would upload (card, build report, Parquet), after `check_release` found no problem; to a
    public repository only a release every trajectory of which may be redistributed (`sharing.public_push_problem`:
    the refusal names the licences), to a private one any."""
    folder = Path(folder)
    if "/" not in repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ReleaseError(f"repo id {repo_id!r} must look like 'owner/name'")
    checked = check_release(folder)
    if not checked.ok:
        raise ReleaseError(f"{folder}: not pushed, the release has problems: " + "; ".join(checked.problems))
    release = open_release(folder)
    if not private:
        problem = public_push_problem(release)
        if problem is not None:
            raise ReleaseError(problem)
    files = {name: (folder / name).stat().st_size for name in (CARD_FILE, BUILD_FILE, EVAL_FILE)
             if (folder / name).is_file()}
    files.update({rel: (folder / rel).stat().st_size for rel in sorted(release.files)})
    message = commit_message or f"Themisto release {release.content_hash[:12]}"
    return UploadPlan(repo_id, folder, files, private, revision, message)


def push_release(plan: UploadPlan, api=None, *, token: str | None = None):
    """Create the dataset repository if needed and upload the planned files; returns the Hub's commit info.

    With the real Hub (no `api` given) the card is first validated by the Hub's own YAML check (online).
    """
    if api is None:
        from huggingface_hub import DatasetCard, HfApi

        DatasetCard.load(plan.folder / CARD_FILE).validate(repo_type="dataset")
        api = HfApi(token=token)
    api.create_repo(repo_id=plan.repo_id, repo_type="dataset", private=plan.private, exist_ok=True)
    return api.upload_folder(repo_id=plan.repo_id, repo_type="dataset", folder_path=str(plan.folder),
                             allow_patterns=sorted(plan.files), revision=plan.revision,
                             commit_message=plan.commit_message)
