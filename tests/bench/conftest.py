"""The bench smoke tests call a script's `main(argv)` in this process where the test is about the
script's report, not its process: one torch (and transformers) import for all of them instead of
one per script. A test whose point is the command line or the exit status keeps its subprocess."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str):
    """bench/<name>.py as a module. The bench folder goes on the path as the scripts themselves
    put it there (they import each other by bare name: `from deepseek_vision import picture`)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture(scope="session")
def bench():
    """bench("name") -> bench/name.py as a module (bench_module)."""
    return bench_module
