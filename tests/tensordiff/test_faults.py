"""The fault tables: one per model, names as constants, each fault's needs stated as data, and
the engine's fault names exactly the table's."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tensordiff.pipeline import registry
from tensordiff.pipeline.faults import CHUNK, FLOAT32, LANGUAGE, Fault, Need, find, refusal
import tensordiff.models.deepseek_v41_flash.faults as D
import tensordiff.models.qwen3_vl.faults as Q

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"deepseek-v4.1-flash": D, "qwen3-vl": Q}


@pytest.mark.parametrize("model", sorted(TABLES))
def test_each_model_has_one_table_and_its_adapter_uses_it(model):
    table = TABLES[model]
    assert registry.adapter(model).faults is table.FAULTS
    names = [f.name for f in table.FAULTS]
    assert len(names) == len(set(names))
    # every name is a module constant: the table's entries are referred to by constant
    constants = {v for k, v in vars(table).items() if k.isupper() and isinstance(v, str)}
    assert set(names) <= constants


# tensors a run of each model dumps (the language boundaries are resolved from what is present)
PRESENT = {"deepseek-v4.1-flash": ["embeddings", "engram.1", "attn.0", "router.0.ids", "router.0.weights",
                                   "hidden.0", "attn.1", "router.1.ids", "router.1.weights", "hidden.1", "logits",
                                   "logits.step.1", "logits.step.2"],
           # a language run: the text boundaries follow the vision ones
           "qwen3-vl": ["embeddings", "text_rope", "hidden.0", "deepstack_add.0", "hidden.1", "logits",
                        "logits.step.1"]}


@pytest.mark.parametrize("model", sorted(TABLES))
def test_every_boundary_a_fault_must_trip_is_in_the_contract(model):
    from fnmatch import fnmatch

    c = registry.adapter(model).contract
    names = [b.name for b in (c.resolver(PRESENT[model]) if c.resolver else c.boundaries)]
    for f in TABLES[model].FAULTS:
        assert any(fnmatch(n, f.boundary) for n in names), (f.name, f.boundary, names)


def test_the_engines_fault_names_are_the_tables():
    from engine.deepseek_v41_flash import faults as EF
    from engine.qwen3_vl import faults as QF

    assert EF.VISION + EF.LANGUAGE == tuple(f.name for f in D.FAULTS)
    assert QF.ALL == tuple(f.name for f in Q.FAULTS)


def _literals(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return out


def test_no_fault_name_is_a_string_literal_outside_its_table():
    """The names live in the tables; code compares against the constants (docstrings and
    comments may name a fault, a bare string in code may not)."""
    names = {f.name for t in TABLES.values() for f in t.FAULTS}
    tables = {ROOT / "tensordiff/models/deepseek_v41_flash/faults.py", ROOT / "tensordiff/models/qwen3_vl/faults.py"}
    bad = []
    for pkg in ("tensordiff", "engine", "oracle", "tests"):
        for p in (ROOT / pkg).rglob("*.py"):
            if p in tables or p == Path(__file__).resolve():
                continue
            hits = {s for s in _literals(p) if s in names}
            if hits:
                bad.append(f"{p.relative_to(ROOT)}: {sorted(hits)}")
    assert not bad, bad


def test_needs_with_a_check_refuse_and_plain_needs_document():
    from types import SimpleNamespace

    run = SimpleNamespace(prompt=None, chunk=None, decode=0, dtype="bfloat16")
    assert LANGUAGE.unmet(run) and CHUNK.unmet(run) and FLOAT32.unmet(run)
    assert not Need("a picture wider than 3 patches").unmet(run)
    f = Fault("x", "b", "d", needs=(Need("documented"), CHUNK))
    assert refusal(f, run) == "fault 'x' needs --chunk (a chunked prefill); this run would never reach it"
    assert refusal(f, SimpleNamespace(prompt=None, chunk=3, decode=0, dtype="float32")) is None
    assert f.needs_text == "documented; --chunk (a chunked prefill)"


def test_a_plain_string_need_still_works_for_third_party_tables():
    f = Fault("x", "b", "d", needs="an image wider than it is tall")
    assert [n.text for n in f.requirements] == ["an image wider than it is tall"] and f.needs_text
    assert Fault("y", "b", "d").requirements == ()


def test_find():
    assert find(D.FAULTS, D.GELU_TANH).boundary == "aligner"
    with pytest.raises(KeyError):
        find(D.FAULTS, "nope")


def test_language_faults_need_the_language_route_and_vision_faults_do_not():
    for f in D.LANGUAGE_FAULTS:
        assert LANGUAGE in f.requirements, f.name
    for f in D.VISION:
        assert LANGUAGE not in f.requirements, f.name
    assert re.fullmatch(r"router\.0\.ids", find(D.FAULTS, D.ROUTER_TEXT_BIAS_FOR_IMAGES).boundary)
