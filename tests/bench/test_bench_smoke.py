"""The throughput benchmark runs end to end on a tiny size and writes the fields the closing
note quotes (it is a smoke test: no timing is asserted). One run of its command line, every case
at toy sizes, one round: each test below reads its own cases from that run's report."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "compare_throughput.py"


@pytest.fixture(scope="module")
def run(module_tmp):
    """(the dumps folder, the finished process, the JSON report) of one run of every case: the big
    case's ten routes on 3 MB, the many-tensors case at one count (both formats), the memory and CLI
    cases at toy sizes."""
    tmp = module_tmp("compare-throughput")
    out = tmp / "bench.json"
    r = subprocess.run([sys.executable, str(BENCH), "--dir", str(tmp / "dumps"), "--size-mb", "3", "--repeat", "1",
                        "--cases", "big,many,memory,cli", "--many-counts", "40", "--memory-numel", "300000",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return tmp / "dumps", r, json.loads(out.read_text())


def test_bench_tiny_writes_its_report(run):
    dumps, r, rep = run
    assert "compare / read" in r.stdout
    assert 2.5e6 < rep["dumps"]["bytes"] < 3.5e6
    warm = rep["warm"]
    for route in ("read", "read1", "compare", "naive", "limit", "kernel", "verify", "sha256"):
        for k in ("wall_s", "gb_per_s", "peak_rss_mb", "rss_after_import_mb"):
            assert warm[route][k] > 0, (route, k)
        assert warm[route]["cpu_s"] >= 0
        assert warm[route]["bytes"] == rep["dumps"]["bytes"] - _headers(dumps)
    assert warm["compare"]["verdict"] == "match"  # B is A plus a few ULP: within the defaults
    assert set(warm["compare"]["statuses"]) == {"patches", "rope.cos", "rope.sin", "block0", "final_norm",
                                                "aligner", "router.0.ids"}
    assert warm["ratio_compare_to_read"] > 0 and warm["cpu_ratio_compare_to_read"] > 0
    assert warm["ratio_run_by_run"]["median"] > 0
    assert "speedup_vs_naive" in warm and "ratio_compare_to_read1" in warm
    assert set(rep["met"]) == {"ratio", "rss"}
    assert rep["comparator"]["kernel"]
    assert warm["limit"]["max_abs"] > 0 and warm["ratio_compare_to_limit"] > 0
    assert warm["verify"]["verdict"] == "match" and warm["ratio_verify_to_compare"] > 0
    assert warm["sha256"]["tensors"] == 14 and warm["ratio_verify_to_sha256"] > 0  # 7 a side, each hashed
    assert warm["ratio_sha256_to_compare"] > 0
    assert warm["kernel"]["max_abs"] == warm["limit"]["max_abs"]  # the kernel saw the same pairs
    assert warm["ratio_kernel_to_limit"] > 0 and warm["cpu_ratio_kernel_to_limit"] >= 0
    big_rows = {row[0] for row in rep["summary"] if row[0].startswith("big: ")}  # the other cases': below
    assert big_rows == {"big: compare / C limit", "big: verify / compare", "big: compare / C limit, CPU seconds",
                        "big: verify / compare, CPU seconds", "big: kernel alone / C limit",
                        "big: kernel alone / C limit, CPU seconds", "big: verify / sha256 alone",
                        "big: sha256 alone / compare", "big: kernel_fullhist alone / C limit",
                        "big: kernel_fullhist alone / C limit, CPU seconds"} | (
        {"big: kernel_nohist alone / C limit", "big: kernel_nohist alone / C limit, CPU seconds"}
        if "kernel_nohist" in warm else set())
    if "AVX-512" in rep["comparator"]["kernel"]:  # the route without the histogram ran, on the same pairs
        assert warm["kernel_nohist"]["max_abs"] == warm["kernel"]["max_abs"]
        assert warm["ratio_kernel_to_kernel_nohist"] > 0
    # every chunk in the full histogram (no cuts), on the same pairs
    assert warm["kernel_fullhist"]["max_abs"] == warm["kernel"]["max_abs"]
    assert warm["ratio_kernel_fullhist_to_kernel"] > 0 and warm["cpu_ratio_kernel_fullhist_to_kernel"] >= 0


def test_bench_tiny_other_cases(run):
    """The many-tensors, memory and CLI cases at toy sizes: every figure the summary quotes."""
    dumps, _, rep = run
    for k in ("safetensors-40", "hdf5-40"):
        m = rep["many"][k]
        assert m["compare_s"] > 0 and m["numpy_s"] > 0 and m["tensors"] == int(k.split("-")[1])
    assert rep["many"]["hdf5_over_safetensors-40"] > 0 and rep["many"]["hdf5_over_safetensors_open-40"] > 0
    for w in (1, 2):
        assert rep["memory"][f"threads_{w}"]["peak_rss_mb"] > 0
    assert rep["cli"]["compare"]["wall_s"] > 0 and rep["cli"]["python_numpy"]["wall_s"] > 0
    names = {row[0] for row in rep["summary"]}
    assert "cli: tensordiff compare sample dumps, s" in names and "many hdf5_over_safetensors-40" in names
    assert not list(dumps.glob("many-*")) and not (dumps / "memory").exists()


def _headers(root: Path) -> int:
    """Bytes of safetensors headers (8-byte length + JSON), which no route reads as tensor data."""
    n = 0
    for p in root.glob("*/*.safetensors"):
        with open(p, "rb") as f:
            n += 8 + int.from_bytes(f.read(8), "little")
    return n
