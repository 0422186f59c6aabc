"""Shared by the engine tests: an engine run kept in memory, and its stages fed its own tensors
(a stage that runs the engine's own code gives the engine's tensors back bit for bit)."""
import pytest

from tensordiff.format.capture import MemoryRecorder
from tensordiff.pipeline.runs import make_request


def _own_run(model: str, **kw):
    ad, req = make_request(model, **kw)
    rec = MemoryRecorder()
    ad.runner("engine")(req, rec)
    return req, rec


def _stages_on_own_tensors(make_stages, req, rec) -> dict:
    out = {}
    for stage in make_stages(req, rec.run).values():
        out.update(stage(dict(rec.tensors)))
    return out


@pytest.fixture(scope="session")
def own_run():
    """(model, **request) -> (RunRequest, MemoryRecorder of the engine's run)."""
    return _own_run


@pytest.fixture(scope="session")
def stages_on_own_tensors():
    """(make_stages, req, rec) -> every stage's outputs, each stage fed the run's own tensors."""
    return _stages_on_own_tensors
