import os

import pytest

# Synthetic weights and the oracle cache go to one per-session directory, never ~/.cache.
@pytest.fixture(autouse=True, scope="session")
def _tensordiff_cache(tmp_path_factory):
    if "TENSORDIFF_CACHE" not in os.environ:
        os.environ["TENSORDIFF_CACHE"] = str(tmp_path_factory.mktemp("tensordiff-cache"))
    yield


# Resolve MKL VML's lazy kernel dispatch before any test runs a side in this process
# (tensordiff/warmup.py: the first parallel call of an op can take the low-accuracy kernel).
@pytest.fixture(autouse=True, scope="session")
def _vml_warm():
    from tensordiff.warmup import warm

    warm()
    yield
