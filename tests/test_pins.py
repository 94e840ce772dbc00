"""The two install sets agree: requirements.txt (CPU, what CI tests) and requirements-gpu.txt (CUDA, vLLM) pin the
same versions but for the few vLLM needs otherwise, and the GPU set satisfies what vLLM 0.33.0 declares, read from the
pin files (no 336 MB download)."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
# vLLM 0.33.0's own Requires-Dist (its wheel's METADATA, unconditional entries) on packages either set pins.
VLLM_REQUIRES = ("torch==2.14.0", "torchaudio==2.11.0", "torchvision==0.29.0", "transformers>=5.16.1,<5.21.0",
                 "fastapi>=0.133.0,<0.137.0", "starlette>=1.0.1", "openai>=2.25.0", "pydantic>=2.12.0",
                 "huggingface_hub>=1.31.0", "numpy", "psutil", "tqdm", "pyyaml")
DIFFER = {"torch", "torchaudio", "torchvision", "transformers", "fastapi", "vllm"}  # where the GPU set may differ


def pins(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, str]:
    """Each package's pinned version in a requirements file, following `-r` includes; a package pinned twice, or
    required without an exact pin, fails."""
    assert path not in seen, f"{path.name}: includes itself"
    found: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            included = pins(path.parent / line[3:].strip(), (*seen, path))
            twice = set(included) & set(found)
            assert not twice, f"{path.name}:{number}: pinned twice: {sorted(twice)}"
            found.update(included)
            continue
        requirement = Requirement(line)
        specs = list(requirement.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{path.name}:{number}: not an exact pin: {raw}"
        name = canonicalize_name(requirement.name)
        assert name not in found, f"{path.name}:{number}: {name} pinned twice"
        found[name] = specs[0].version
    return found


def test_the_gpu_set_satisfies_what_vllm_requires():
    gpu = pins(REPO / "requirements-gpu.txt")
    assert gpu.get("vllm") == "0.33.0"
    for text in VLLM_REQUIRES:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in gpu, f"requirements-gpu.txt does not pin {name}, which vLLM requires ({text})"
        assert requirement.specifier.contains(gpu[name], prereleases=True), \
            f"requirements-gpu.txt pins {name}=={gpu[name]}; vLLM 0.33.0 requires {text}"


def test_the_cpu_and_gpu_sets_differ_only_where_vllm_needs_it():
    cpu, gpu = pins(REPO / "requirements.txt"), pins(REPO / "requirements-gpu.txt")
    assert cpu["torch"] == "2.13.0", "the CPU set keeps the CPU wheel of torch"
    assert "vllm" not in cpu
    shared = set(cpu) & set(gpu)
    differing = {name for name in shared if cpu[name] != gpu[name]}
    assert differing <= DIFFER, f"the sets pin other versions of {sorted(differing - DIFFER)}"
    assert set(cpu) - DIFFER == set(gpu) - DIFFER, "a package is pinned in one set only"
    # The GPU file says which torch and transformers it runs, as its pins do.
    text = (REPO / "requirements-gpu.txt").read_text(encoding="utf-8")
    assert re.search(rf"torch {re.escape(gpu['torch'])}", text) and re.search(
        rf"transformers {re.escape(gpu['transformers'])}", text)


def test_the_pin_reader_refuses_a_double_pin_and_a_range(tmp_path):
    (tmp_path / "a.txt").write_text("numpy==2.1.3\n")
    (tmp_path / "b.txt").write_text("-r a.txt\nnumpy==2.1.2\n")
    (tmp_path / "c.txt").write_text("numpy>=2\n")
    for name, message in (("b.txt", "pinned twice"), ("c.txt", "not an exact pin")):
        try:
            pins(tmp_path / name)
        except AssertionError as exc:
            assert message in str(exc)
        else:
            raise AssertionError(f"{name} was read without complaint")


def test_the_wide_kernel_set_keeps_the_kernel_stack_and_shadows_only_what_torch_needs():
    """requirements-kernel-wide.txt installs beside the wild and JuNE kernel sets (--no-deps, seen through a .pth
    file): it may pin again only the two packages torch 2.13 needs newer, and never the numpy 1.24 / pandas 2.0 stack;
    its torch is the CPU build, never PyPI's CUDA one."""
    below = {**pins(REPO / "requirements-kernel.txt"), **pins(REPO / "requirements-kernel-wild.txt")}
    wide = pins(REPO / "requirements-kernel-wide.txt")
    assert set(wide) & set(below) == {"typing-extensions", "sympy"}
    assert below["numpy"] == "1.24.3" and below["pandas"] == "2.0.1"
    assert wide["torch"] == "2.13.0+cpu"
    assert {"tensorflow-cpu", "jupyterthemes", "scanpy", "geopandas", "librosa"} <= set(wide)
