"""Stage the fine-tuning study for a short rented GPU slot: the wheels its image lacks, and two folders that two calls
carry there (each call at most 64 MiB with the project's tree), which `scripts/gpu_study.sh` takes.

    python scripts/gpu_stage.py wheels -o .gpu/wheels [--python-version 3.12]   # pip download --no-deps, sizes
    python scripts/gpu_stage.py stage --release R --model M --study STUDY -o .gpu [--wheels .gpu/wheels]

`stage` needs STUDY prepared here first (`themisto study ... --prepare-only`: study.json and rows.json, the
slow CPU part), packs the model (a .gguf file or a model folder) as a tar cut in two parts, and writes
.gpu/call1/ (the wheels and the first part) and .gpu/call2/ (the second part, the release, the study's two files,
stage.json with every sha256 and the study's options). It prints the two calls and what each carries.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
# What the GPU image lacks (it has torch 2.11, transformers 5.17, peft, accelerate, pyarrow and pandas), at this
# project's pins; transformers and its tokenizers, regex and safetensors ride along so both sides run one version
# (gpu_study.sh falls back to the image's transformers where the carried one does not import there). datasets 5.2
# and transformers 5.23 need huggingface_hub >= 1.31, transformers 5.17 (the image's) < 2: the last 1.x satisfies
# all three.
WHEELS: tuple[str, ...] = ("datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", "xxhash==4.1.0",
                           "gguf==0.19.0", "peft==0.21.2", "trl==1.16.0", "transformers==5.23.0",
                           "tokenizers==0.23.3", "safetensors==0.8.0", "regex==2026.12.2",
                           "huggingface_hub==1.33.0")
STUDY_FILES = ("study.json", "rows.json")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(MIB), b""):
            digest.update(chunk)
    return digest.hexdigest()


def size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_bytes() -> int:
    """What every call carries anyway: the project's tracked and unignored files."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, check=True).stdout
    return sum((REPO / name).stat().st_size for name in out.decode().split("\0") if name and (REPO / name).is_file())


def download_wheels(out: Path, python_version: str) -> list[tuple[str, int]]:
    """`pip download --no-deps` of WHEELS for `python_version` on manylinux x86-64; their names and sizes."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", "-d", str(out),
                    *WHEELS], check=True)
    return [(p.name, p.stat().st_size) for p in sorted(out.glob("*.whl"))]


def wheels_command(args: argparse.Namespace) -> int:
    found = download_wheels(args.output, args.python_version)
    for name, n in found:
        print(f"{n / MIB:8.2f} MiB  {name}")
    print(f"{sum(n for _, n in found) / MIB:8.2f} MiB  in all ({len(found)} wheels, Python {args.python_version})")
    return 0


def _check_study(study: Path, release: Path, model: str) -> dict:
    """The prepared study's header, checked against the release and the model being staged."""
    from themisto.release.folder import open_release
    from themisto.training.finetune import describe_base_model

    missing = [name for name in STUDY_FILES if not (study / name).is_file()]
    if missing:
        raise SystemExit(f"gpu_stage: {study} has no {', '.join(missing)}: prepare it first with `themisto study "
                         f"--release {release} --model {model} --preset gpu --execute --prepare-only -o {study}`")
    header = json.loads((study / "study.json").read_text(encoding="utf-8"))
    if header["release_hash"] != open_release(release).content_hash:
        raise SystemExit(f"gpu_stage: {study} was prepared against another release than {release}")
    weights = describe_base_model(model).get("weights_sha256")
    if weights != header["base_model"].get("weights_sha256"):
        raise SystemExit(f"gpu_stage: {model}'s weights differ from the study's base model")
    return header


def study_options(settings: dict) -> list[str]:
    """The `themisto study` options that give the prepared study's settings there: its preset, and every setting
    that differs from the preset's (a rerun with other settings is refused)."""
    from themisto.study.settings import NOT_RESULTS, with_preset

    preset = with_preset(settings["preset"], {"release": "", "model": ""}).to_dict()
    options = ["--preset", settings["preset"]] + (["--execute"] if settings["execute"] else [])
    for name, value in settings.items():
        if name in NOT_RESULTS or name in ("release", "model", "preset", "execute") or value == preset.get(name):
            continue
        if value is None:
            raise SystemExit(f"gpu_stage: the study's {name} is unset where its preset sets it: no option says so")
        flag = "--" + name.replace("_", "-")
        options += [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    return options


def _pack_model(model: Path, tar_path: Path) -> None:
    with tarfile.open(tar_path, "w") as tar:  # a GGUF file is packed already: no compression
        tar.add(model, arcname=model.name)


def _split(tar_path: Path, first: int, dirs: tuple[Path, Path]) -> list[dict]:
    parts = []
    with tar_path.open("rb") as fh:
        for k, (folder, limit) in enumerate(zip(dirs, (first, None))):
            data = fh.read(limit) if limit is not None else fh.read()
            part = folder / f"model.tar.part{k + 1}"
            part.write_bytes(data)
            parts.append({"name": part.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return parts


def stage_command(args: argparse.Namespace) -> int:
    model = Path(args.model).resolve()
    header = _check_study(args.study, args.release, str(model))
    out = args.output
    call1, call2 = out / "call1", out / "call2"
    for folder in (call1, call2):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    wheels = sorted(args.wheels.glob("*.whl")) if args.wheels else []
    if wheels:
        shutil.copytree(args.wheels, call1 / "wheels")
    shutil.copytree(args.release, call2 / "release")
    (call2 / "study").mkdir()
    for name in STUDY_FILES:
        shutil.copy2(args.study / name, call2 / "study" / name)
    tar_path = out / "model.tar"
    _pack_model(model, tar_path)
    limit = int(args.limit_mib * MIB) - tree_bytes() - MIB  # a MiB of slack for the tool's own files
    total = tar_path.stat().st_size
    first = min(limit - size(call1), total - total // 2)  # half, or what call 1 holds beside the wheels
    second = tar_path.stat().st_size - first + size(call2) + 4096
    if first <= 0 or second > limit:
        raise SystemExit(f"gpu_stage: the model ({tar_path.stat().st_size / MIB:.1f} MiB), the wheels and the release "
                         f"do not fit two calls of {args.limit_mib} MiB")
    parts = _split(tar_path, first, (call1, call2))
    tar_path.unlink()
    settings = header["settings"]
    stage = {"model_name": model.name, "model_tar_sha256": None, "parts": parts,
             "weights_sha256": header["base_model"].get("weights_sha256"), "release_hash": header["release_hash"],
             "budget_s": args.budget_s, "study_options": study_options(settings)}
    stage["model_tar_sha256"] = _joined_sha256(call1, call2, parts)
    for folder in (call1, call2):
        (folder / "stage.json").write_text(json.dumps(stage, indent=2) + "\n", encoding="utf-8")
    _print_calls(call1, call2, args)
    return 0


def _joined_sha256(call1: Path, call2: Path, parts: list[dict]) -> str:
    digest = hashlib.sha256()
    for folder, part in zip((call1, call2), parts):
        digest.update((folder / part["name"]).read_bytes())
    return digest.hexdigest()


def _print_calls(call1: Path, call2: Path, args: argparse.Namespace) -> None:
    tree = tree_bytes()
    rel1, rel2 = (os.path.relpath(p.resolve(), REPO) for p in (call1, call2))
    print(f"the project's tree: {tree / MIB:.1f} MiB in every call")
    print(f"call 1 (stage) carries {rel1}: {size(call1) / MIB:.1f} MiB (with the tree {(size(call1) + tree) / MIB:.1f})")
    print(f"  run(command='bash scripts/gpu_study.sh stage {rel1}', carry=['{rel1}'], timeout_s=300)")
    print(f"call 2 (run), while the machine is still up, carries {rel2}: {size(call2) / MIB:.1f} MiB (with the tree "
          f"{(size(call2) + tree) / MIB:.1f})")
    print(f"  run(command='bash scripts/gpu_study.sh run {rel2}', carry=['{rel2}'], timeout_s=600)")
    print("what comes back lies in $OUT: study.tgz (the study folder without models/ and exports/), gpu.json, "
          "study.log, study.json.out, nvidia-smi.txt, generation.json, generation.log")


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))  # this checkout's themisto, whatever the environment has installed
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wheels = sub.add_parser("wheels", help="download the wheels the GPU image lacks")
    wheels.add_argument("-o", "--output", type=Path, default=REPO / ".gpu" / "wheels")
    wheels.add_argument("--python-version", default="3.12", help="the GPU image's Python (default %(default)s)")
    stage = sub.add_parser("stage", help="write the two folders the two calls carry")
    stage.add_argument("--release", type=Path, required=True)
    stage.add_argument("--model", required=True, help="the base model: a .gguf file or a model folder")
    stage.add_argument("--study", type=Path, required=True, help="a study folder prepared with --prepare-only")
    stage.add_argument("-o", "--output", type=Path, default=REPO / ".gpu")
    stage.add_argument("--wheels", type=Path, help="the wheels folder (`wheels` writes it)")
    stage.add_argument("--budget-s", type=float, default=420.0,
                       help="the study's --budget-s there (default %(default)s: a call's 600 s less the setup, the "
                            "generation bench and the packing)")
    stage.add_argument("--limit-mib", type=float, default=64.0, help="what one call may carry (default 64)")
    args = parser.parse_args(argv)
    return wheels_command(args) if args.command == "wheels" else stage_command(args)


if __name__ == "__main__":
    sys.exit(main())
