"""The release card: README.md rendered from the dataset_card.md template, with the YAML front matter that makes a
release folder load with no script.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from themisto.release.folder import (CARD_FILE, BuildReport, ReleaseError, parquet_name, schema_module, shipped,
                                     split_card)
from themisto.release.sharing import gated_fields, sharing_section
from themisto.release.sources import sources_table
from themisto.release.tasks import RULES
from themisto.release.values import VALUES
from themisto.vocabulary import TASKS

CARD_TEMPLATE = shipped("dataset_card.md")
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# The card's results section lies between `<!-- results: begin -->` and `<!-- results: end -->` (write_between_markers);
# a build leaves RESULTS_NONE there, `write_results` the table.
RESULTS_NONE = "No scores are recorded with this build."


def card_yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def _sizes_table(report: BuildReport) -> str:
    lines = ["| config | test | train |", "| --- | ---: | ---: |"]
    for config, splits in report.sizes.items():
        lines.append(f"| `{config}` | {splits.get('test', 0):,} | {splits.get('train', 0):,} |")
    return "\n".join(lines)


def _rules_table(report: BuildReport) -> str:
    lines = ["| rule | " + " | ".join(f"{t} removed" for t in TASKS) + " |", "| --- |" + " ---: |" * len(TASKS)]
    for rule, sentence in RULES.items():
        counts = [report.tasks.get(t, {}).get("removed", {}).get(rule, 0) for t in TASKS]
        lines.append(f"| {sentence} | " + " | ".join(f"{c:,}" for c in counts) + " |")
    cands = [report.tasks.get(t, {}).get("candidates", 0) for t in TASKS]
    lines.append("| (candidate targets before the rules) | " + " | ".join(f"{c:,}" for c in cands) + " |")
    return "\n".join(lines)


def _share(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _split_table(report: BuildReport) -> str:
    """Each group of the split (participant or trajectory): its side, trajectories, steps per notebook task, rows."""
    split = report.split
    if not split.get("groups"):
        return "- (this build recorded no split by group)"
    tasks = sorted({t for g in split["groups"] for t in g["tasks"]})
    # The configs whose rows the split counted per group (`values` and the text track's configs it does not).
    configs = [c for c in report.sizes if c != "trajectories" and any(c in g["rows"] for g in split["groups"])]
    lines = [f"Unit: **{split['unit']}**; `test` holds {split['test_groups']['all']} group(s) ("
             + ", ".join(f"{t}: {split['test_groups'].get(t, 0)}" for t in tasks)
             + f"), `train` {split['train_groups']}.", "",
             "| group | split | trajectories | steps | " + " | ".join(f"{t} steps" for t in tasks) + " | "
             + " | ".join(f"`{c}` rows" for c in configs) + " |",
             "| --- | --- |" + " ---: |" * (2 + len(tasks) + len(configs))]
    for g in sorted(split["groups"], key=lambda g: (g["split"], g["group"])):
        rows = [sum(g["rows"].get(c, {}).values()) for c in configs]
        lines.append(f"| `{g['group']}` | {g['split']} | {len(g['trajectories'])} | {g['steps']:,} | "
                     + " | ".join(f"{g['tasks'].get(t, 0):,}" for t in tasks) + " | "
                     + " | ".join(f"{n:,}" for n in rows) + " |")
    return "\n".join(lines)


def _stopped(timeout: dict) -> str:
    """A step replay stopped at its limit, with the developer's seconds beside the replay's."""
    developer = "not seen finishing" if timeout.get("developer_s") is None else f"{timeout['developer_s']:.0f} s"
    return f"step {timeout['step']}: {timeout['replay_s']:.0f} s (developer: {developer})"


def _fidelity_table(report: BuildReport) -> str:
    """Per trajectory: participant, task, kernels, steps and the replay's fidelity to the log (with its status
    mismatches by cause) and to the notebook; then what each cause means."""
    if not report.fidelity:
        return "- (this build replayed nothing: no fidelity to report)"
    from themisto.replay.fidelity import CAUSES
    from themisto.replay.final_notebook import CLASSES

    lines = ["| trajectory | participant | task | kernels | steps | status | ename | output types | "
             "status mismatches by cause | stopped at their limit | final notebook: " + " / ".join(CLASSES)
             + " (not compared) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for kernel_id, f in sorted(report.fidelity.items(), key=lambda kv: (str(kv[1].get("participant")), kv[0])):
        final = f.get("final_notebook")
        notebook = ("no final notebook" if not final else " / ".join(str(final["compared"].get(c, 0)) for c in CLASSES)
                    + f" ({sum(final['not_compared'].values())})")
        causes = ", ".join(f"{cause} {n}" for cause, n in (f.get("status_causes") or {}).items()) or "-"
        stopped = ", ".join(_stopped(t) for t in f.get("timeouts") or []) or "-"
        lines.append(f"| `{kernel_id}` | `{f.get('participant')}` | {f.get('task') or '-'} | "
                     f"{f.get('kernels') or '-'} | {f['executions_replayed']:,} | "
                     f"{_share(f['status_match'])} of {f['comparable']} | {_share(f['ename_match'])} of "
                     f"{f['logged_errors']} | {_share(f['output_types_match'])} | "
                     f"{causes} | {stopped} | {notebook} |")
    lines += ["", "Causes:"] + [f"- `{cause}`: {text}" for cause, text in CAUSES.items()]
    return "\n".join(lines)


def _settings_list(report: BuildReport) -> str:
    return "\n".join(f"- `{key}`: `{json.dumps(value)}`" for key, value in sorted(report.settings.items()))


def _source_text(source: dict) -> str:
    lines = [f"- kind: `{source.get('kind', 'unknown')}`"]
    for item in source.get("inputs", []):
        lines.append(f"- input `{item.get('name')}` (sha256 `{item.get('sha256', '?')}`)")
    for key, value in sorted(source.items()):
        if key not in ("kind", "inputs"):
            lines.append(f"- {key}: `{json.dumps(value, sort_keys=True)}`")
    return "\n".join(lines)


def _values_summary(report: BuildReport) -> str:
    if VALUES not in report.sizes:
        return "This build stored no values (its replay did not store them), so it has no `values` config."
    caps = report.settings.get("value_caps", {})
    note = next((n for n in report.notes if n.startswith("values: ")), "")
    return (f"In this build: {note[len('values: '):]}. Caps: {caps.get('value_bytes', 0):,} bytes per value, "
            f"{caps.get('release_bytes', 0):,} bytes for all values of the release.")


def size_category(rows: int) -> str:
    """The Hub's size bucket for a number of rows (`n<1K`, `1K<n<10K`, ...).

    >>> [size_category(n) for n in (999, 1000, 54_321, 2_000_000)]
    ['n<1K', '1K<n<10K', '10K<n<100K', '1M<n<10M']
    """
    for name, upper in _SIZE_BUCKETS:
        if rows < upper:
            return name
    return "n>1B"


_SIZE_BUCKETS = (("n<1K", 10**3), ("1K<n<10K", 10**4), ("10K<n<100K", 10**5), ("100K<n<1M", 10**6),
                 ("1M<n<10M", 10**7), ("10M<n<100M", 10**8), ("100M<n<1B", 10**9))


def render_card(template: str, report: BuildReport, num_bytes: dict[str, dict[str, int]], folder: Path) -> str:
    """The release README: the template's YAML with this build's configs and sizes, the body's {{…}} filled."""
    schema = schema_module()
    data, body = split_card(template, CARD_TEMPLATE)
    configs, infos = [], []
    for config in [c for c in (*schema.CONFIGS, *schema.OPTIONAL_CONFIGS) if c in report.sizes]:
        splits = [s for s in schema.SPLITS if report.sizes[config].get(s)]
        configs.append({"config_name": config,
                        "data_files": [{"split": s, "path": parquet_name(config, s)} for s in splits]})
        if config == schema.DEFAULT_CONFIG:
            configs[-1]["default"] = True
        download = sum((folder / parquet_name(config, s)).stat().st_size for s in splits)
        infos.append({
            "config_name": config,
            "features": schema.features_yaml(config),
            "splits": [{"name": s, "num_bytes": num_bytes[config][s], "num_examples": report.sizes[config][s]}
                       for s in splits],
            "download_size": download,
            "dataset_size": sum(num_bytes[config][s] for s in splits),
        })
    data["configs"] = configs
    data["dataset_info"] = infos
    data["size_categories"] = [size_category(max(sum(splits.values()) for splits in report.sizes.values()))]
    if report.source.get("kind") != "shipped-sample":
        # The sample is authored by the project (MIT); the JuNE logs' redistribution terms are not stated.
        data["license"] = "other"
        wild = any(source.startswith("ipython") for source in report.sources)
        data["license_name"] = "mixed-public-repositories" if wild else "unclear-june-logs"
        if wild:  # sessions of public repositories: the Hub's click-through terms (`themisto.release.sharing`)
            data.update(gated_fields())
    values = {
        "sizes_table": _sizes_table(report),
        "rules_table": _rules_table(report),
        "split_table": _split_table(report),
        "sources_table": sources_table(report.sources),
        "sharing": sharing_section(report),
        "fidelity_table": _fidelity_table(report),
        "results": RESULTS_NONE,
        "build_settings": _settings_list(report),
        "source": _source_text(report.source),
        "content_sha256": report.content_sha256,
        "notes": "\n".join(f"- {n}" for n in report.notes) or "- none",
        "values_summary": _values_summary(report),
    }
    unknown = sorted({m.group(1) for m in PLACEHOLDER.finditer(body)} - set(values))
    if unknown:
        raise ReleaseError(f"{CARD_TEMPLATE}: unknown placeholder(s) {unknown} (known: {sorted(values)})")
    body = PLACEHOLDER.sub(lambda m: values[m.group(1)], body)
    return f"---\n{card_yaml(data)}---\n{body}"


def write_between_markers(path: Path, markdown: str, section: str = "results") -> None:
    """Replace what lies between a file's markers of `section` (`<!-- results: begin -->` … `<!-- results: end -->`
    for "results") with `markdown`, the rest of the file kept; a file without them is refused, naming it and them."""
    from themisto.resume import write_text_atomic

    path = Path(path)
    text = path.read_text(encoding="utf-8")
    begin, finish = f"<!-- {section}: begin -->", f"<!-- {section}: end -->"
    start, end = text.find(begin), text.find(finish)
    if start < 0 or end < start:
        raise ReleaseError(f"{path}: no {section} section ({begin} … {finish})")
    write_text_atomic(path, text[:start + len(begin)] + "\n" + markdown.strip() + "\n" + text[end:])


def write_results(folder: Path, markdown: str) -> None:
    """Put a results table into a built release's card, between its results markers (a rerun replaces it). The
    Parquet files and so the content hash do not change."""
    from themisto.release.folder import read_card

    read_card(folder)  # a card that is no card is refused here, naming it
    write_between_markers(Path(folder) / CARD_FILE, markdown)


def write_results_page(page: Path, markdown: str, *, source: str, section: str = "results") -> None:
    """Put the results (and the `source` they were computed by: command, folder, commit) into the project's results
    page, docs/results.md, between the markers of `section`, as the card gets them (scripts/june_release.sh,
    scripts/corpus_release.sh)."""
    write_between_markers(page, f"Written by {source}.\n\n{markdown.strip()}", section)
