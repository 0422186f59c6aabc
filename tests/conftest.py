import os
import shutil

import pytest

from tensordiff.commands.openmp import passive_waits

# Under pytest-xdist (the default: pyproject's addopts) the workers share the cores: each one's
# torch gets its share of threads (1 a worker with `-n auto`), set before any test module imports
# torch and inherited by the CLI processes the tests start. Two workers of two threads each on two
# cores ran the suite in 425 s, of one thread each in 345 s: oversubscribed threads wait on each
# other at every parallel op. A user's own OMP_NUM_THREADS is kept; serial runs keep torch's default.
# `WORKER_THREADS`: the share set here (None: not a worker, or the user's own).
WORKER_THREADS = None
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    WORKER_THREADS = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)

# Idle OpenMP workers sleep, as in every CLI process (tensordiff/commands/openmp.py): set before any test
# module imports torch. Results are the same (thread counts and partitioning do not change); on a
# shared or loaded machine spinning workers cost the suite a large share of its CPU and wall time.
# `PASSIVE_WAITS` says whether it reached torch (False: a user's own policy, or torch came first).
PASSIVE_WAITS = passive_waits()


# Dumps a test module shares live in directories that go when the module's tests are done
# (kept only when one of them failed, for the post-mortem). The suite writes about 8 GB of dumps
# over a run; held until the session ends they would fill a CI machine's disk.
@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request):
    """module_tmp(name) -> tmp_path_factory.mktemp(name), removed with its module."""
    failed = request.session.testsfailed
    made = []

    def make(name: str):
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield make
    if request.session.testsfailed == failed:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


# Synthetic weights and the oracle cache go to one per-session directory, never ~/.cache.
@pytest.fixture(autouse=True, scope="session")
def _tensordiff_cache(tmp_path_factory):
    if "TENSORDIFF_CACHE" not in os.environ:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            # one cache for every worker of the run (beside their own basetemps), so synthetic
            # weights and oracle dumps are made once per run; every writer into it stages under
            # a unique name and renames, so workers never see each other's half-written entries
            shared = tmp_path_factory.getbasetemp().parent / "tensordiff-cache"
            shared.mkdir(exist_ok=True)
            os.environ["TENSORDIFF_CACHE"] = str(shared)
        else:
            os.environ["TENSORDIFF_CACHE"] = str(tmp_path_factory.mktemp("tensordiff-cache"))
    yield


# Resolve MKL VML's lazy kernel dispatch before any test runs a side in this process
# (tensordiff/warmup.py: the first parallel call of an op can take the low-accuracy kernel).
@pytest.fixture(autouse=True, scope="session")
def _vml_warm():
    from tensordiff.warmup import warm

    warm()
    yield
