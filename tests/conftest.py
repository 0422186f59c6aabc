import os

import pytest

# Synthetic weights and the oracle cache go to one per-session directory, never ~/.cache.
@pytest.fixture(autouse=True, scope="session")
def _tensordiff_cache(tmp_path_factory):
    if "TENSORDIFF_CACHE" not in os.environ:
        os.environ["TENSORDIFF_CACHE"] = str(tmp_path_factory.mktemp("tensordiff-cache"))
    yield
