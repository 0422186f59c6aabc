"""pytest plugin (entry point `pytest11`): assert a produced dump against a baseline dump.

    def test_my_engine(tmp_path, tensordiff_baseline):
        run_my_engine(out=tmp_path / "dump")          # writes a tensordiff dump
        tensordiff_baseline.check(tmp_path / "dump")  # fails with the earliest-divergence report

The baseline lives next to the test module (`<module dir>/<module name>/<test name>.tensordiff/`)
unless a path is given. A missing baseline is written and the test fails saying so;
`--tensordiff-regen` rewrites baselines instead of asserting (like `--force-regen` in
pytest-regressions) and fails each test whose baseline it refreshed, so a regeneration never
passes; `--tensordiff-tolerances FILE` is the tolerance file of every check that names none.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from tensordiff.format.dump import open_dump
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.reports.text import render_text


def pytest_addoption(parser):
    group = parser.getgroup("tensordiff")
    group.addoption("--tensordiff-regen", action="store_true", default=False,
                    help="write or refresh tensordiff baselines instead of comparing against them")
    group.addoption("--tensordiff-tolerances", default=None,
                    help="TOML tolerance file for tensordiff baseline checks")


def pytest_configure(config):
    config.addinivalue_line("markers", "tensordiff: a test that checks dumps against tensordiff baselines")


class BaselineCheck:
    def __init__(self, request: pytest.FixtureRequest):
        self.request = request
        self.regen = request.config.getoption("--tensordiff-regen")
        self.tolerances = request.config.getoption("--tensordiff-tolerances")

    def default_path(self) -> Path:
        mod = Path(str(self.request.node.path))
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.request.node.name)
        return mod.parent / mod.stem / f"{name}.tensordiff"

    def check(self, produced, baseline=None, tolerances=None, *, contract=None):
        __tracebackhide__ = True

        produced = Path(produced)
        open_dump(produced)  # a broken produced dump fails here, clearly
        base = Path(baseline) if baseline else self.default_path()
        if self.regen or not base.exists():
            existed = base.exists()
            tmp = base.with_name(base.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            base.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(produced, tmp)
            if existed:
                shutil.rmtree(base)
            tmp.rename(base)
            verb = "refreshed" if existed else "written"
            pytest.fail(f"tensordiff baseline {verb}: {base}\nRerun the test to compare against it.", pytrace=False)
        report = compare_dumps(base, produced, tolerances or self.tolerances, contract=contract)
        if report.verdict != "match":
            pytest.fail(render_text(report) + f"\n\nbaseline: {base}\nTo accept the new tensors: pytest --tensordiff-regen",
                        pytrace=False)
        return report


@pytest.fixture
def tensordiff_baseline(request) -> BaselineCheck:
    """Compare a produced dump with its baseline; see `BaselineCheck.check`."""
    return BaselineCheck(request)
