"""The suite's own temp-directory rules (tests/conftest.py, pyproject's pytest options): a module's
shared dumps go when its tests pass and stay when one fails; a passing test's tmp_path goes."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
PYPROJECT = (Path(__file__).parents[1] / "pyproject.toml").read_text()
OPTIONS = PYPROJECT.split("[tool.pytest.ini_options]", 1)[1].split("\n[", 1)[0]

MODULE = '''
import pytest

@pytest.fixture(scope="module")
def shared(module_tmp):
    d = module_tmp("dumps")
    (d / "big.bin").write_bytes(b"x" * 1000)
    return d

def test_uses_it(shared, tmp_path):
    (tmp_path / "own.bin").write_bytes(b"y")
    assert (shared / "big.bin").exists()

def test_again(shared):
    assert OUTCOME
'''


def run(pytester, outcome: bool) -> list[str]:
    """The files the inner run left in its temp tree (--basetemp=runpytest-0, which pytest itself
    never removes: only the rules under test remove anything there)."""
    pytester.makeconftest(CONFTEST)
    # the suite's options but its addopts (pytester is this run's; xdist workers would only slow it)
    pytester.makepyprojecttoml("[tool.pytest.ini_options]" + re.sub(r"(?m)^addopts = .*$", "", OPTIONS))
    pytester.makepyfile(test_m=MODULE.replace("OUTCOME", str(outcome)))
    # in this process (the inner run's start-up is most of the cost), with the --basetemp a
    # subprocess run would get from pytester
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                          f"--basetemp={pytester.path / 'runpytest-0'}")
    result.assert_outcomes(passed=2) if outcome else result.assert_outcomes(passed=1, failed=1)
    base = pytester.path / "runpytest-0"
    assert base.is_dir()
    return sorted(p.name for p in base.rglob("*.bin"))


def test_a_passing_module_leaves_no_dumps(pytester):
    assert run(pytester, True) == []


def test_a_failing_module_keeps_its_dumps(pytester):
    # the module's shared dumps stay for the post-mortem; the passing test's own tmp_path does not
    assert run(pytester, False) == ["big.bin"]



def suite_conftest(request):
    """tests/conftest.py as this run loaded it (exactly one plugin)."""
    root = Path(__file__).parent / "conftest.py"
    (conftest,) = [p for p in request.config.pluginmanager.get_plugins()
                   if getattr(p, "__file__", None) and Path(p.__file__) == root]
    return conftest


def test_the_suite_runs_torch_with_sleeping_openmp_workers(request):
    """Set by tests/conftest.py before torch was imported (a user's own policy is kept)."""
    import os

    from tensordiff.commands.openmp import VARIABLE

    suite_conftest(request)  # loaded, once
    # passive_waits() sets the variable only before torch's import; a user's own stays as it is
    assert VARIABLE in os.environ, "torch was imported before tests/conftest.py asked for passive waits"


def test_each_xdist_worker_runs_torch_on_its_share_of_the_cores(request):
    """Set by tests/conftest.py under pytest-xdist: workers x threads = the cores, not more."""
    import os

    import torch

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("a serial run keeps torch's default thread count (run with -n 2 to check)")
    conftest = suite_conftest(request)
    if conftest.WORKER_THREADS is None:
        pytest.skip("the user's own OMP_NUM_THREADS is kept")
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    assert conftest.WORKER_THREADS == max(1, (os.cpu_count() or 1) // workers)
    assert os.environ["OMP_NUM_THREADS"] == str(conftest.WORKER_THREADS)  # CLI subprocesses inherit it
    assert torch.get_num_threads() == conftest.WORKER_THREADS
