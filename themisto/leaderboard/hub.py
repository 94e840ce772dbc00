"""Send a validated submission to the Hub as pull requests, with huggingface_hub's own client.

`submit_to_hub` opens a PR on the submissions dataset repo (the run's settings and predictions, never scores) and,
when asked, a PR on the model repo adding `.eval_results/themisto.yaml`: one `EvalResultEntry` per task and context
mode, written with huggingface_hub's YAML helpers. Everything is built before the first request, so a refusal
uploads nothing; a transient Hub error (429, 5xx, a dropped connection) is retried once, then named.
`send_submission` is what `themisto submit --to` calls: the re-scoring the eval results need, then `submit_to_hub`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from themisto.errors import InputError
from themisto.leaderboard.submission import Submission, submission_bytes, submission_slug

if TYPE_CHECKING:
    from themisto.release.folder import ReleaseInfo

EVAL_RESULTS_PATH = ".eval_results/themisto.yaml"
# The Hub leaderboard holds one number per task; exact match is the one every entry has (execution is opt-in).
EVAL_RESULT_METRIC = "exact_match"
TRANSIENT_STATUS = (429, 500, 502, 503, 504)
SUBMISSIONS_FOLDER = "submissions"


class HubError(InputError):
    """No token, a refused request, or a Hub error that a retry did not cure; the message names which."""


def hub_token() -> str:
    """The user's Hugging Face token (HF_TOKEN or `hf auth login`); HubError says how to get one."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise HubError("no Hugging Face token: set HF_TOKEN=hf_... or run `hf auth login` (a token with write "
                       "access opens the pull requests); nothing was uploaded")
    return token


def _transient(exc: Exception) -> bool:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        return exc.response is not None and exc.response.status_code in TRANSIENT_STATUS
    return True  # a transport error: the connection dropped or timed out


def _status(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return f"HTTP {code}" if code else type(exc).__name__


def hub_call(what: str, call, *args, **kwargs):
    """Run one Hub request; retry it once after a transient error; HubError names the request and the error."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    retried = ""
    try:
        return call(*args, **kwargs)
    except (HfHubHTTPError, httpx2.TransportError) as exc:
        if not _transient(exc):
            raise HubError(f"{what}: the Hub answered {_status(exc)}: {_first_line(exc)}") from exc
        retried = " (after one retry)"
    try:
        return call(*args, **kwargs)
    except (HfHubHTTPError, httpx2.TransportError) as exc:
        raise HubError(f"{what}: the Hub answered {_status(exc)}{retried}: {_first_line(exc)}") from exc


def _first_line(exc: Exception) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def submission_files(submission: Submission) -> dict[str, bytes]:
    """The repo-relative files of a submission PR, under submissions/<task>/<model>/<predictions hash>/."""
    prefix = f"{SUBMISSIONS_FOLDER}/{submission_slug(submission)}"
    return {f"{prefix}/{name}": data for name, data in submission_bytes(submission).items()}


@dataclass(frozen=True)
class EvalResultsRequest:
    """Where the eval results go and what they point at: model repo, benchmark dataset id and revision."""

    model_repo: str
    dataset_id: str
    dataset_revision: str | None = None  # None: the dataset repo's current revision, asked from the Hub


def eval_result_entries(submission: Submission, results: dict, request: EvalResultsRequest, revision: str | None,
                        task_ids: list[str], source_url: str | None) -> list:
    """One EvalResultEntry per context mode of the submission's task (its task id the release's eval.yaml declares
    for that mode), valued by the re-scored exact match."""
    from huggingface_hub import EvalResultEntry

    from themisto.release.eval_yaml import task_id

    undeclared = [task_id(submission.task, c) for c in submission.contexts
                  if task_id(submission.task, c) not in task_ids]
    if undeclared:
        raise HubError(f"task {undeclared[0]!r} is not declared in the release's eval.yaml ({task_ids})")
    entries = []
    for context in submission.contexts:
        found = [s for s in results.get("scores", []) if s.get("context") == context and s.get("subset") == "all"
                 and s.get("metric") == EVAL_RESULT_METRIC and s.get("task") == submission.task]
        if not found:
            raise HubError(f"the re-scored results have no {EVAL_RESULT_METRIC} for context {context!r}")
        score = found[0]
        notes = (f"context mode: {context}; metric: {EVAL_RESULT_METRIC} (95% interval {score['low']:.4f}-"
                 f"{score['high']:.4f}, n={score['n']}); re-scored by themisto from the submitted predictions")
        entries.append(EvalResultEntry(dataset_id=request.dataset_id, task_id=task_id(submission.task, context),
                                       value=round(float(score["mean"]), 6), dataset_revision=revision,
                                       source_url=source_url, notes=notes))
    return entries


def eval_results_yaml(entries: list) -> str:
    """The `.eval_results/*.yaml` text, through huggingface_hub's own serializer."""
    import yaml
    from huggingface_hub import eval_result_entries_to_yaml

    return yaml.safe_dump(eval_result_entries_to_yaml(entries), sort_keys=False, allow_unicode=True)


@dataclass
class SubmitResult:
    """What `submit_to_hub` did: the PR URLs and the files each PR added."""

    submission_pr: str
    submission_files: list[str]
    eval_results_pr: str | None = None
    eval_results_yaml: str | None = None
    notes: list[str] = field(default_factory=list)


def _open_pr(api, what: str, repo_id: str, repo_type: str, files: dict[str, bytes], message: str) -> str:
    from huggingface_hub import CommitOperationAdd

    # Operations are built per attempt: huggingface_hub refuses to reuse a CommitOperationAdd once committed.
    def commit():
        operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=data) for path, data in files.items()]
        return api.create_commit(repo_id=repo_id, repo_type=repo_type, operations=operations,
                                 commit_message=message, create_pr=True)

    info = hub_call(what, commit)
    if not info.pr_url:
        raise HubError(f"{what}: the Hub made no pull request")
    return info.pr_url


def submit_to_hub(submission: Submission, repo_id: str, *, eval_results: EvalResultsRequest | None = None,
                  results: dict | None = None, task_ids: list[str] | None = None, api=None) -> SubmitResult:
    """Open the submission PR on `repo_id` (a dataset repo) and, with `eval_results`, the model repo's PR."""
    from huggingface_hub import HfApi

    api = api or HfApi(token=hub_token())
    files = submission_files(submission)
    revision = None
    if eval_results is not None:
        if results is None or task_ids is None:
            raise ValueError("eval results need the re-scored results and the release's declared task ids")
        revision = eval_results.dataset_revision or hub_call(
            f"reading {eval_results.dataset_id}'s revision", api.dataset_info, eval_results.dataset_id).sha
        # Built (and checked) before the first upload, so a refusal uploads nothing.
        eval_result_entries(submission, results, eval_results, revision, task_ids, source_url=None)
    message = f"Themisto submission: {submission.model} ({submission.task}, {', '.join(submission.contexts)})"
    pr = _open_pr(api, f"opening the submission PR on {repo_id}", repo_id, "dataset", files, message)
    result = SubmitResult(pr, sorted(files))
    if eval_results is not None:
        entries = eval_result_entries(submission, results, eval_results, revision, task_ids, source_url=pr)
        text = eval_results_yaml(entries)
        result.eval_results_yaml = text
        result.eval_results_pr = _open_pr(
            api, f"opening the eval-results PR on {eval_results.model_repo} (the submission PR {pr} is open)",
            eval_results.model_repo, "model", {EVAL_RESULTS_PATH: text.encode()},
            f"Themisto eval results ({submission.task}): {', '.join(submission.contexts)}")
    return result


def send_submission(submission: Submission, release: ReleaseInfo, repo_id: str, *,
                    eval_results: EvalResultsRequest | None = None, execute: bool = False,
                    workspace=None) -> SubmitResult:
    """`themisto submit --to`: with `eval_results`, re-score the submission on `release` as the
    board does (`execute`: next_cell predictions run, over the input files `workspace` finds) and read the task ids
    its eval.yaml declares; then open the PRs
    (`submit_to_hub`). Without a token it refuses before any scoring."""
    from themisto.leaderboard.board import rescore
    from themisto.release.eval_yaml import declared_task_ids

    hub_token()
    results = task_ids = None
    if eval_results is not None:
        task_ids = declared_task_ids(release.path)
        results, _ = rescore(submission, release, execute=execute, workspace=workspace)
    return submit_to_hub(submission, repo_id, eval_results=eval_results, results=results, task_ids=task_ids)


def push_space(space_dir, repo_id: str, *, api=None) -> str:
    """Create the static Space `repo_id` if needed and commit BOARD/space/ to it; returns the commit URL."""
    from pathlib import Path

    from huggingface_hub import CommitOperationAdd, HfApi

    space_dir = Path(space_dir)
    files = {p.relative_to(space_dir).as_posix(): p.read_bytes() for p in sorted(space_dir.rglob("*")) if p.is_file()}
    if "index.html" not in files or "README.md" not in files:
        raise HubError(f"{space_dir}: no index.html and README.md (run `themisto leaderboard` first)")
    api = api or HfApi(token=hub_token())
    hub_call(f"creating the Space {repo_id}", api.create_repo, repo_id=repo_id, repo_type="space",
             space_sdk="static", exist_ok=True)

    def commit():
        operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=data) for path, data in files.items()]
        return api.create_commit(repo_id=repo_id, repo_type="space", operations=operations,
                                 commit_message="Themisto leaderboard")

    return hub_call(f"uploading the leaderboard to the Space {repo_id}", commit).commit_url
