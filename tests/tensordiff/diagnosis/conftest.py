"""Synthetic pairs for the diagnosis tests: A a random tensor, B a planted change of it, both
written as dumps and compared under a one-boundary contract with the layout under test."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tensordiff import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Boundary, Contract

MODEL = "toy-diagnosis"


def contract(layout: str = "plain", meaning: str = "") -> Contract:
    return Contract(MODEL, (Boundary("plan", (), meaning), Boundary("x", ("plan",), layout=layout)))


def write(path, tensors: dict, run: dict):
    with Recorder(path, model=MODEL, run=run, producer={"name": "test"}) as r:
        for k, v in tensors.items():
            t = torch.from_numpy(np.ascontiguousarray(v))
            r.record(k, t, boundary=k.split(".")[0])  # "x.cos" -> x, "plan.size" -> plan
    return path


@pytest.fixture
def compare(tmp_path):
    """compare(a, b, layout=, run=, plan=) -> the report of x (and plan) for tensors {name: array}."""
    count = iter(range(1000))

    def run_it(a: dict, b: dict, layout: str = "plain", run: dict | None = None, meaning: str = "",
               plan: tuple | None = None):
        k = next(count)
        run = run or {}
        pa, pb = plan if plan else ({"plan.size": np.array([1, 2], dtype=np.int64)},) * 2
        da = write(tmp_path / f"a{k}", {**pa, **a}, run)
        db = write(tmp_path / f"b{k}", {**pb, **b}, run)
        return compare_dumps(da, db, contract=contract(layout, meaning))

    return run_it


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def names(report, boundary="x"):
    return [f["name"] for f in (report.boundary(boundary).diagnosis or [])]
