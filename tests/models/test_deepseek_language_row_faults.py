"""Faults confined to one row or one token of the DeepSeek V4.1 Flash language path, on the route
a user meets first (`check` with no --dtype: the semantic pass and the numeric pass of the
official bf16 computation, CPU, synthetic:tiny): each is named at its boundary, and every pass
that names it has the same local origin; the clean engine on the same inputs passes."""
from __future__ import annotations

import pytest

from tensordiff.errors import BadInput
from tensordiff.pipeline.case import CaseSpec, check
from tensordiff.pipeline.registry import adapter
import tensordiff.models.deepseek_v41_flash.faults as D

MODEL = "deepseek-v4.1-flash"
PROMPT = "Describe <image>."
ROW_FAULTS = [(D.EMBED_LAST_ROW_SCALE, "embeddings"), (D.ROUTER_LAST_ROW_RENORM, "router.0.weights"),
              (D.DECODE_ROPE_OFF_BY_ONE, "logits.step.2")]


def _case(fault=None):
    return check(CaseSpec(MODEL, prompt=PROMPT, decode=3, fault=fault))


def test_the_fault_table_declares_them_at_their_boundaries():
    table = {f.name: f.boundary for f in adapter(MODEL).faults}
    assert all(table[f] == b for f, b in ROW_FAULTS)
    assert all(f in D.LANGUAGE_NAMES for f, _ in ROW_FAULTS)


def test_the_clean_engine_passes_the_default_route_on_the_same_inputs():
    case = _case()
    assert case.passes == ("semantic", "numeric") and case.dtype == "bfloat16"
    assert case.passed, case.summary_line()


@pytest.mark.parametrize("fault, boundary", ROW_FAULTS)
def test_a_row_fault_is_named_at_its_boundary_with_a_local_origin_that_agrees(fault, boundary):
    case = _case(fault)
    assert not case.passed
    assert case.report.earliest == [boundary], str(case.report)  # the semantic pass names it
    assert case.local is not None and case.local.origin == boundary, case.local.summary()
    if case.numeric.verdict == "diverged":  # the numeric pass names the same, with its own local origin
        assert case.numeric.earliest == [boundary], str(case.numeric)
    if case.local_numeric is not None and case.local_numeric.origin is not None:
        assert case.local_numeric.origin == boundary, case.local_numeric.summary()
    # confined: the boundary's own rows before the faulty one are right (one row or one token)
    t = case.report.boundary(boundary).tensors[0]
    assert t.worst is not None


def test_the_embedding_row_fault_is_one_row_and_the_row_aware_numeric_pass_sees_it():
    case = _case(D.EMBED_LAST_ROW_SCALE)
    t = case.numeric.boundary("embeddings").tensors[0]
    last = t.metrics["rows"] - 1
    assert t.metrics["worst_rows"][0]["row"] == last and t.metrics["worst_rows"][0]["x_floor"] > 2
    assert case.local_numeric.origin == "embeddings"


def test_the_decode_fault_needs_two_decode_steps():
    with pytest.raises(BadInput, match="--decode 2 or more"):
        CaseSpec(MODEL, prompt=PROMPT, decode=1, fault=D.DECODE_ROPE_OFF_BY_ONE).request()
