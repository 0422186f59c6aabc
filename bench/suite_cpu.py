"""A pytest plugin that records each test's CPU seconds (this process and the child processes it
waited for) beside its wall seconds, for measuring the suite on a shared machine, where wall time
says more about the neighbours than about the tests.

    PYTHONPATH=$PWD python -m pytest -q -p bench.suite_cpu --suite-cpu-out=/tmp/cpu.json

Writes one JSON object (and, test by test as they finish, one JSON line each to the same name
with the suffix .jsonl): {"tests": {nodeid: {"wall_s", "cpu_s"}}, "collect": {"wall_s", "cpu_s"}}.
A test's figures cover its setup, call and teardown, so a session fixture's work is charged to
the first test that asks for it. Under xdist each worker writes its own file (`.gwN` before the
suffix). Nothing here asserts a time.
"""
from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def pytest_addoption(parser):
    parser.addoption("--suite-cpu-out", default=None, help="write per-test wall and CPU seconds here (JSON)")


class _Recorder:
    def __init__(self, out: Path):
        self.out = out
        self.tests: dict[str, dict[str, float]] = {}
        self.t0 = (time.perf_counter(), _cpu())
        self.collect = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_collection(self):
        w, c = time.perf_counter(), _cpu()
        yield
        self.collect = {"wall_s": round(time.perf_counter() - w, 3), "cpu_s": round(_cpu() - c, 3)}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        w, c = time.perf_counter(), _cpu()
        yield
        rec = {"wall_s": round(time.perf_counter() - w, 3), "cpu_s": round(_cpu() - c, 3)}
        self.tests[item.nodeid] = rec
        with open(self.out.with_suffix(".jsonl"), "a") as f:  # as it goes: a long run can be read early
            f.write(json.dumps({"test": item.nodeid, **rec}) + "\n")

    def pytest_sessionfinish(self):
        total = {"wall_s": round(time.perf_counter() - self.t0[0], 3), "cpu_s": round(_cpu() - self.t0[1], 3)}
        self.out.write_text(json.dumps({"collect": self.collect, "session": total, "tests": self.tests}, indent=1))


def pytest_configure(config):
    out = config.getoption("--suite-cpu-out")
    if not out:
        return
    out = Path(out)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        out = out.with_name(f"{out.stem}.{worker}{out.suffix}")
    config.pluginmanager.register(_Recorder(out), "suite-cpu-recorder")
