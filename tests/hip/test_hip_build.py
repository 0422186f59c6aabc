"""Every kernel family compiles with Debian's hipcc (AMD, gfx90a + gfx940) and with nvcc (sm_90),
warnings as errors, on a machine without a GPU; and the sources keep to the portability rules.

With TENSORDIFF_REQUIRE_KERNEL_BUILD=1 (CI) a missing compiler fails; otherwise it skips.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HIP = Path(__file__).resolve().parents[2] / "hip"
SCRIPT = HIP / "build_check.sh"
REQUIRED = os.environ.get("TENSORDIFF_REQUIRE_KERNEL_BUILD") == "1"
COMPILERS = {"hipcc": os.environ.get("HIPCC", "hipcc"), "nvcc": os.environ.get("NVCC", "nvcc")}


def _need(compiler: str) -> None:
    exe = COMPILERS[compiler]
    if shutil.which(exe) is None:
        msg = f"{exe} not found (apt-get install -y hipcc for hipcc; the CUDA toolkit for nvcc)"
        if REQUIRED:
            pytest.fail(f"{msg}, and TENSORDIFF_REQUIRE_KERNEL_BUILD=1 requires it")
        pytest.skip(f"{msg}; set TENSORDIFF_REQUIRE_KERNEL_BUILD=1 to make this a failure")


def _build(compiler: str, *files: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), compiler, *map(str, files)], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def every_build():
    """One build_check.sh run over every family with each compiler this machine has: one queue of
    compiles for both, so the two cores stay busy to the end (the route templates' device passes
    are most of the work); each test below reads its own compiler's lines."""
    present = [c for c in COMPILERS if shutil.which(COMPILERS[c])]
    if not present:
        return None
    return _build("all" if len(present) == len(COMPILERS) else present[0])


@pytest.mark.parametrize("compiler", ["hipcc", "nvcc"])
def test_every_kernel_family_builds(compiler, every_build):
    _need(compiler)
    r = every_build
    tag = "hip" if compiler == "hipcc" else "nvcc"  # the script's name for each compiler's jobs
    # the other compiler's failure is its own test's
    assert r.returncode == 0 or f"FAIL {tag} " not in r.stdout, f"hip/build_check.sh failed:\n{r.stdout}{r.stderr}"
    built = [tuple(line.split()[-2:]) for line in r.stdout.splitlines() if line.startswith(f"ok   {tag} ")]
    archs = ("gfx90a", "gfx940") if compiler == "hipcc" else ("sm_90",)  # hipcc: one job an arch
    assert sorted(built) == sorted((a, p.name) for p in HIP.glob("*.hip") for a in archs)


@pytest.mark.parametrize("compiler", ["hipcc", "nvcc"])
def test_a_warning_fails_the_build(compiler, tmp_path):
    # The check has teeth: -Werror turns an unused variable into a failed build.
    _need(compiler)
    src = tmp_path / "planted.hip"
    src.write_text(f'#include "{HIP / "common.h"}"\n'
                   "__global__ void planted(float* y) { int unused = 3; y[threadIdx.x] = 1.f; }\n")
    r = _build(compiler, src)
    assert r.returncode != 0 and "FAIL" in r.stdout, r.stdout


def test_a_missing_compiler_fails_the_script(tmp_path):
    env = dict(os.environ, HIPCC=str(tmp_path / "no-such-hipcc"))
    r = subprocess.run(["bash", str(SCRIPT), "hipcc"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0 and "not found" in r.stdout


# Portability rules, checked on the text: nothing sized by a warp of 32 outside portable.h, raw
# CUDA intrinsics only there, blocks of a multiple of 64 threads.
FORBIDDEN = [
    (re.compile(r"__shfl\w*_sync|__ballot_sync|__activemask"), "CUDA-only warp intrinsic (use port_*)"),
    (re.compile(r"\b__shfl(_xor|_up|_down)?\s*\(|\b__ballot\s*\("), "raw warp intrinsic (use port_*)"),
    (re.compile(r"0xffffffff(?!ffffffff)", re.I), "32-lane mask"),
    (re.compile(r"warpSize\s*[=!]=\s*32|\b32\s*[=!]=\s*warpSize"), "warp size assumed to be 32"),
    (re.compile(r"[&%]\s*31\b|>>\s*5\b|/\s*32\b|%\s*32\b"), "lane arithmetic for 32-wide warps"),
]
THREADS = re.compile(r"constexpr\s+int\s+kThreads\s*=\s*(\d+)")


def lint(text: str) -> list[str]:
    problems = [why for pat, why in FORBIDDEN if pat.search(text)]
    problems += [f"block of {n} threads is not a multiple of 64" for n in THREADS.findall(text) if int(n) % 64]
    return problems


def kernel_sources() -> list[Path]:
    return sorted(p for p in HIP.iterdir() if p.suffix in (".hip", ".h") and p.name != "portable.h")


@pytest.mark.parametrize("path", kernel_sources(), ids=lambda p: p.name)
def test_sources_keep_the_portability_rules(path):
    assert lint(path.read_text()) == []


@pytest.mark.parametrize("planted", [
    "v = __shfl_xor_sync(0xffffffffu, v, 1);",
    "int lane = threadIdx.x & 31;",
    "if (warpSize == 32) {}",
    "constexpr int kThreads = 96;",
    "auto m = __ballot(p);",
])
def test_lint_catches_wave32_assumptions(planted):
    assert lint(planted)


def test_every_family_has_a_cuda_shim_and_a_backend_entry():
    from engine.backend.hip_ops import FAMILIES

    families = {p.stem for p in HIP.glob("*.hip")}
    assert set(FAMILIES) == families
    for f in families:
        shim = HIP / "cuda" / f"{f}.cu"
        assert shim.is_file() and f'#include "../{f}.hip"' in shim.read_text()
