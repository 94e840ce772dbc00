"""An Inspect log (`.eval`) of a Themisto task read as a run folder, so `themisto score LOG.eval --release R` re-scores
it as every submission is (the log's own scores are never read: each prediction is taken again from the model's
raw reply, as `themisto generate` takes it).

A log is someone else's file, like any submission: it is a zip archive read here member by member within bounds
(the file, the members, each member's bytes decompressed) and each member parsed by the project's bounded JSON reader
(`themisto.bounded`); past a bound, or not a log of a Themisto task, is a RunFolderError naming the log and the
member. The run folder is written whole beside the log (`LOG.run/`, or where asked) through the run folder's own
writers, then read back through its one reader, which checks every line as it checks a submission's.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from themisto.bounded import Bounds, BoundError, loads_json
from themisto.generation.backends.base import Sampling
from themisto.generation.run_folder import (RUN_FILE, RUN_FORMAT, Generation, GenerationWriter, RunFolderError,
                                            read_run, read_run_json)
from themisto.harness.scorer import answer_of
from themisto.resume import folder_written_whole, write_json_atomic

LOG_FILE_BYTES = 1 << 30  # the log itself (compressed)
LOG_MEMBERS = 200_000  # files in the archive: a sample per file, a few more
HEADER_BOUNDS = Bounds(file_bytes=16 << 20, depth=64, items=1_000_000)
# One sample's file holds its messages, events and transcript: a long probe conversation is a few MB.
SAMPLE_BOUNDS = Bounds(file_bytes=64 << 20, depth=64, items=5_000_000)
_SAMPLE_MEMBER = re.compile(r"samples/.+_epoch_\d+\.json")
BACKEND = "inspect"


def _member(archive, name: str, bounds: Bounds, log: Path):
    """One archive member's JSON, decompressed and parsed within `bounds`."""
    where = f"{log}:{name}"
    try:
        with archive.open(name) as fh:
            data = fh.read(bounds.file_bytes + 1)  # never more than the bound, whatever the member declares
    except Exception as error:  # a damaged archive: zlib/zstd/BadZipFile errors alike
        raise RunFolderError(f"{where}: cannot be read ({type(error).__name__}: {str(error)[:200]})") from None
    if len(data) > bounds.file_bytes:
        raise RunFolderError(f"{where}: larger than {bounds.file_bytes:,} bytes (bound: file_bytes)")
    try:
        return loads_json(data.decode("utf-8"), bounds, path=where)
    except UnicodeDecodeError:
        raise RunFolderError(f"{where}: not UTF-8") from None
    except BoundError as error:
        raise RunFolderError(str(error)) from None


def _get(data, *path, kind=None):
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data if kind is None or isinstance(data, kind) else None


def _number(value, default):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _int_or_none(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_log(log: str | Path) -> tuple[dict, list[dict]]:
    """The log's header and its samples (each a parsed `samples/...json` member), read within bounds."""
    import zipfile

    import zipfile_zstd  # noqa: F401  (Inspect writes its members zstd-compressed; this teaches zipfile to read them)

    log = Path(log)
    if not log.is_file():
        raise RunFolderError(f"{log}: no such Inspect log")
    if log.stat().st_size > LOG_FILE_BYTES:
        raise RunFolderError(f"{log}: larger than {LOG_FILE_BYTES:,} bytes (bound: file_bytes)")
    try:
        archive = zipfile.ZipFile(log)
    except (zipfile.BadZipFile, OSError) as error:
        raise RunFolderError(f"{log}: not an Inspect .eval log (a zip archive): {error}") from None
    with archive:
        names = archive.namelist()
        if len(names) > LOG_MEMBERS:
            raise RunFolderError(f"{log}: {len(names):,} members, more than {LOG_MEMBERS:,} (bound: members)")
        if "header.json" not in names:
            raise RunFolderError(f"{log}: no header.json (an unfinished log? Inspect writes it when the run ends)")
        header = _member(archive, "header.json", HEADER_BOUNDS, log)
        samples = [_member(archive, name, SAMPLE_BOUNDS, log) for name in names if _SAMPLE_MEMBER.fullmatch(name)]
    return header, samples


def _run_json(header: dict, log: Path, digest: str) -> dict:
    themisto = _get(header, "eval", "metadata", "themisto", kind=dict)
    if themisto is None:
        raise RunFolderError(f"{log}:header.json: not a log of a Themisto task (no eval.metadata.themisto; run "
                             "`inspect eval themisto/next_cell ...`)")
    epochs = _get(header, "eval", "config", "epochs")
    config = _get(header, "eval", "model_generate_config", kind=dict) or {}
    defaults = Sampling()
    sampling = {"n": epochs if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 else 1,
                "temperature": _number(config.get("temperature"), defaults.temperature),
                "top_p": _number(config.get("top_p"), defaults.top_p),
                "max_new_tokens": _number(config.get("max_tokens"), defaults.max_new_tokens),
                "seed": _number(config.get("seed"), defaults.seed)}
    return {"format": RUN_FORMAT, "task": themisto.get("task"), "contexts": [themisto.get("context")],
            "backend": BACKEND, "backend_version": _get(header, "eval", "packages", "inspect_ai", kind=str),
            "model": _get(header, "eval", "model", kind=str), "sampling": sampling,
            "templates": themisto.get("templates"), "release": themisto.get("release"),
            "split": themisto.get("split"), "limit": themisto.get("limit"),
            "max_prompt_tokens": themisto.get("max_prompt_tokens"), "probe": themisto.get("probe"),
            "delta": themisto.get("delta"),
            "inspect_log": {"path": str(log), "sha256": digest, "status": header.get("status"),
                            "task": _get(header, "eval", "task", kind=str)}}


def _generation(sample: dict, run: dict, log: Path) -> Generation:
    """One sample's generation line: the raw reply, its status, and the answer taken from it as runs take it."""
    from themisto.harness.probe_tool import STORE_KEY

    example, epoch = sample.get("id"), sample.get("epoch")
    where = f"{log}:samples/{example}_epoch_{epoch}.json"
    if not isinstance(example, (str, int)) or isinstance(example, bool) or not _int_or_none(epoch):
        raise RunFolderError(f"{where}: a sample needs an `id` and a positive `epoch`")
    metadata = sample.get("metadata") if isinstance(sample.get("metadata"), dict) else {}
    raw = _get(sample, "output", "completion")
    usage = _get(sample, "output", "usage", kind=dict) or {}
    tokens = (_int_or_none(usage.get("input_tokens")), _int_or_none(usage.get("output_tokens")))
    common = {"id": str(example), "task": run["task"], "context": run["contexts"][0], "sample": epoch - 1,
              "kept": metadata.get("kept"), "probes": _get(sample, "store", STORE_KEY)}
    if isinstance(metadata.get("skipped"), str):
        return Generation("", "skipped", metadata["skipped"], *tokens, **common)
    error = sample.get("error") or _get(sample, "output", "error")
    if error or not isinstance(raw, str):
        reason = _get(error, "message", kind=str) if isinstance(error, dict) else error
        return Generation(raw if isinstance(raw, str) else "", "failed",
                          str(reason or "the log has no completion for it")[:500], *tokens, **common)
    return Generation(raw, "ok", None, *tokens, prediction=answer_of(raw, run["task"], run["contexts"][0]),
                      **common)


def run_folder_from_log(log: str | Path, folder: str | Path | None = None) -> Path:
    """The run folder of an Inspect log (default: `LOG.run/` beside it), written whole from the log and read back
    through the run folder's reader; one already made from the same log (same sha256) is kept as it is, so its
    scorer records are reused."""
    log = Path(log)
    folder = Path(folder) if folder is not None else log.with_name(log.name.removesuffix(".eval") + ".run")
    digest = hashlib.sha256(log.read_bytes()).hexdigest() if log.is_file() else ""
    if folder.exists():
        existing = read_run_json(folder, missing_ok=True) if folder.is_dir() else None
        if _get(existing, "inspect_log", "sha256") == digest and digest:
            read_run(folder)
            return folder
        raise RunFolderError(f"{folder}: exists and was not made from {log}; remove it or name another folder")
    header, samples = read_log(log)
    run = _run_json(header, log, digest)
    if not samples:
        raise RunFolderError(f"{log}: no samples")
    # The dataset's order (the release's, as `themisto generate` takes rows), not the order samples finished in.
    order = {str(i): n for n, i in enumerate(_get(header, "eval", "dataset", "sample_ids", kind=list) or [])}
    samples.sort(key=lambda s: (order.get(str(s.get("id")), len(order)), str(s.get("id")), str(s.get("epoch"))))
    with folder_written_whole(folder) as tmp:
        write_json_atomic(tmp / RUN_FILE, run)
        read_run_json(tmp)  # the header's shape checked before any line is written
        with GenerationWriter(tmp) as writer:
            for sample in samples:
                writer.write(_generation(sample, run, log))
        read_run(tmp)  # every line checked as a submission's
    return folder
