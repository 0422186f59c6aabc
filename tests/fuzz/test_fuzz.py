"""Fuzzing the untrusted-file readers for a few seconds each (tests/fuzz/targets.py), and
replaying every crashing input found so far (tests/fuzz/crashes/<target>/*.crash).

Property: any bytes give a result or BadInput (one line), never another exception, and the
reader writes nothing. `python tests/fuzz/run_long.py` runs the same targets for 1e5 inputs each.
"""
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import RUNNERS, SEEDS, check, mutate, regression_cases  # noqa: E402

TARGETS = sorted(SEEDS)


@st.composite
def inputs(draw, target):
    """Raw bytes, or a seed mutated by a seeded chain of the runner's own mutations."""
    import numpy as np

    if draw(st.booleans()):
        return draw(st.binary(max_size=512))
    seed = draw(st.sampled_from(SEEDS[target]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    data = seed
    for _ in range(draw(st.integers(1, 3))):
        data = mutate(data, rng)
    return data


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target(target, tmp_path):
    work = tmp_path  # the examples share work / "w": each runner writes its input over the last

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(inputs(target))
    def prop(data):
        found = check(target, data, work / "w")
        assert found is None, found

    prop()


@pytest.mark.parametrize("target", TARGETS)
def test_every_seed_is_read_not_refused(target, tmp_path):
    for i, seed in enumerate(SEEDS[target]):
        (tmp_path / str(i)).mkdir()
        RUNNERS[target](seed, tmp_path / str(i))  # a valid input: no BadInput either


def test_the_property_trips_on_a_planted_reader_bug(tmp_path, monkeypatch):
    def crashes(data, work):
        raise IndexError("planted")

    def writes(data, work):
        (work / "stray.txt").write_text("x")

    monkeypatch.setitem(RUNNERS, "tolerance", crashes)
    assert "IndexError: planted" in check("tolerance", b"", tmp_path / "a")
    monkeypatch.setitem(RUNNERS, "tolerance", writes)
    assert "wrote ['stray.txt']" in check("tolerance", b"", tmp_path / "b")


@pytest.mark.parametrize("case", [c for t in TARGETS for c in regression_cases(t)],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_crashing_inputs_found_so_far(case, tmp_path):
    assert check(case.parent.name, case.read_bytes(), tmp_path) is None
