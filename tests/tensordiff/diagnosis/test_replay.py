"""Stage replay: a stage that reads its input grid wrongly is named by feeding it the
reference's input re-laid; a stage wrong in another way is not."""
from __future__ import annotations

import numpy as np
import torch
from conftest import write

from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Boundary, Contract
from tensordiff.judge.diagnosis.replay import replay_roots

H, W, R, C = 6, 8, 3, 4  # an 6x8 grid into 3x3 cells: the width is not a multiple of 3
CH, CW = -(-H // R), -(-W // R)
RUN = {"inputs": {"grid": [H, W], "cells": [CH, CW]}}
CONTRACT = Contract("toy-diagnosis", (Boundary("x", (), layout="grid"), Boundary("cells", ("x",), layout="cells")))
WEIGHT = torch.from_numpy(np.random.default_rng(2).standard_normal((R * R * C, 5)).astype(np.float32))


def cells(x: torch.Tensor, flat_pad: bool = False, scale: float = 1.0) -> torch.Tensor:
    """3x3 cells of a grid of rows, zero padded at the right and bottom (or, flat_pad, with zero
    rows appended to the flat sequence and re-read at the padded width), then a nonlinear map."""
    if flat_pad:
        flat = torch.cat([x, torch.zeros(CH * R * CW * R - H * W, C)])
        g = flat.view(CH * R, CW * R, C)
    else:
        g = torch.zeros(CH * R, CW * R, C)
        g[:H, :W] = x.view(H, W, C)
    u = g.view(CH, R, CW, R, C).permute(0, 2, 1, 3, 4).reshape(CH * CW, R * R * C)
    return torch.tanh(u @ (WEIGHT * scale))


def _case(tmp_path, **engine):
    x = np.random.default_rng(1).standard_normal((H * W, C)).astype(np.float32)
    xt = torch.from_numpy(x)
    a = write(tmp_path / "a", {"x": x, "cells": cells(xt).numpy()}, RUN)
    b = write(tmp_path / "b", {"x": x, "cells": cells(xt, **engine).numpy()}, RUN)
    report = compare_dumps(a, b, contract=CONTRACT)
    assert report.earliest == ["cells"] and report.boundary("cells").diagnosis == []  # nothing direct

    def make_stages(req, run):
        return {"cells": lambda inputs: {"cells": cells(inputs["x"], **engine)}}

    adapter = type("Adapter", (), {"contract": CONTRACT, "stages": None})()
    replay_roots(adapter, None, a, b, report, make_stages=make_stages)
    return report.boundary("cells").diagnosis


def test_a_pad_appended_to_the_flat_sequence_is_named_at_the_stage_input(tmp_path):
    (f,) = _case(tmp_path, flat_pad=True)
    assert f["kind"] == "stage" and f["name"] == "pad-misplaced" and f["explained"] >= 0.95
    assert "re-read as a grid of width 9" in f["text"] and "padding appended to the flat sequence" in f["text"]


def test_a_stage_wrong_in_another_way_gets_no_layout(tmp_path):
    assert _case(tmp_path, scale=1.1) == []


def test_a_replay_that_fails_is_a_note(tmp_path):
    def broken(req, run):
        raise RuntimeError("no weights")

    x = np.random.default_rng(1).standard_normal((H * W, C)).astype(np.float32)
    xt = torch.from_numpy(x)
    a = write(tmp_path / "a", {"x": x, "cells": cells(xt).numpy()}, RUN)
    b = write(tmp_path / "b", {"x": x, "cells": cells(xt, flat_pad=True).numpy()}, RUN)
    report = compare_dumps(a, b, contract=CONTRACT)
    adapter = type("Adapter", (), {"contract": CONTRACT, "stages": None})()
    replay_roots(adapter, None, a, b, report, make_stages=broken)
    assert report.boundary("cells").diagnosis == [] and report.verdict == "diverged"
    assert "the stage replay of the diagnosis failed (RuntimeError: no weights)" in report.notes
