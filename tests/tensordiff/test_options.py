"""The typed option tables: one parse from the user's strings, defaults in one place, and bad
input refused with the known names (never a silent pass-through)."""
from __future__ import annotations

import pytest

from tensordiff.pipeline import registry
from tensordiff.pipeline.adapter import ModelAdapter
from tensordiff.judge.contract import Contract
from tensordiff.errors import BadInput
from tensordiff.pipeline.faults import FLOAT32, LANGUAGE, Fault
import tensordiff.models.deepseek_v41_flash.faults as D
import tensordiff.models.qwen3_vl.faults as Q
from tensordiff.models.deepseek_v41_flash.options import OPTIONS as DS
from tensordiff.models.qwen3_vl.options import OPTIONS as QW
from tensordiff.pipeline.options import (
    Option, OptionTable, fault_refusal, oracle_option, parse_assignments, parse_bool, render,
    validate_request,
)

DEEPSEEK, QWEN = "deepseek-v4.1-flash", "qwen3-vl"


@pytest.mark.parametrize("text,want", [("true", True), ("1", True), ("yes", True), ("YES", True), (" on ", True),
                                       ("false", False), ("0", False), ("no", False), ("False", False),
                                       ("off", False)])
def test_booleans_accept_the_usual_spellings(text, want):
    assert parse_bool(text, "x") is want


@pytest.mark.parametrize("text", ["", "maybe", "2", "tru"])
def test_a_bad_boolean_is_bad_input(text):
    with pytest.raises(BadInput, match="not a boolean"):
        parse_bool(text, "option kernel_quant")


def test_kernel_quant_false_is_off():
    # the old reading, bool("false"), turned quantisation ON
    assert DS.parse({"kernel_quant": "false"}, DEEPSEEK)["kernel_quant"] is False
    assert DS.parse({"kernel_quant": "true"}, DEEPSEEK)["kernel_quant"] is True
    assert DS.parse({}, DEEPSEEK)["kernel_quant"] == DS.get("kernel_quant").default


def test_attention_is_a_list_of_kernel_names_not_of_letters():
    # the old reading iterated "math" letter by letter (KeyError 'm' on CUDA)
    assert DS.parse({"attention": "math"}, DEEPSEEK)["attention"] == ("math",)
    assert DS.parse({"attention": "flash, math"}, DEEPSEEK)["attention"] == ("flash", "math")
    with pytest.raises(BadInput, match="'nonsense' is not one of cudnn, flash, efficient, math"):
        DS.parse({"attention": "nonsense"}, DEEPSEEK)
    with pytest.raises(BadInput, match="comma-separated"):
        DS.parse({"attention": "flash,,math"}, DEEPSEEK)


def test_the_attention_choices_are_the_engines_kernels():
    from engine.runtime.attention import KERNELS, OWN_KERNELS, _backends

    assert DS.get("attention").choices == KERNELS + OWN_KERNELS  # SDPA's, then our Triton kernel
    # the CUDA route maps each parsed name to an SDPA backend (the CPU never gets there)
    assert len(_backends(DS.parse({"attention": "math"}, DEEPSEEK)["attention"])) == 1


def test_unknown_key_names_the_known_options():
    with pytest.raises(BadInput) as e:
        DS.parse({"nonsense": "1"}, DEEPSEEK)
    msg = str(e.value)
    assert "unknown option 'nonsense'" in msg and "attention, language_numerics, kernel_quant, index_keys, fuse, graphs" in msg
    assert "tensordiff options deepseek-v4.1-flash" in msg


def test_parse_fills_every_default(monkeypatch):
    monkeypatch.delenv("TENSORDIFF_FUSE", raising=False)
    monkeypatch.delenv("TENSORDIFF_GRAPHS", raising=False)
    assert set(DS.parse({}, DEEPSEEK)) == set(DS.names)
    assert QW.parse({}, QWEN) == {"processor": "pil", "attention": "sdpa", "fuse": "auto", "graphs": "auto"}


def test_qwen_attention_is_typed_and_attn_still_accepted(monkeypatch):
    monkeypatch.delenv("TENSORDIFF_FUSE", raising=False)
    monkeypatch.delenv("TENSORDIFF_GRAPHS", raising=False)
    assert QW.parse({"attn": "eager"}, QWEN)["attention"] == "eager"
    assert QW.resolve({"attn": "eager"}) == {"processor": "pil", "attention": "eager", "fuse": "auto",
                                             "graphs": "auto"}
    with pytest.raises(BadInput, match="'nonsense' is not one of sdpa, eager"):
        QW.parse({"attn": "nonsense"}, QWEN)
    with pytest.raises(BadInput, match="given twice"):
        QW.parse({"attn": "eager", "attention": "sdpa"}, QWEN)


@pytest.mark.parametrize("env,want", [(None, "auto"), ("0", "off"), ("1", "on"), ("true", "on"), ("auto", "auto"),
                                      ("off", "off")])
def test_speed_path_env_vars_only_supply_the_default(monkeypatch, env, want):
    for var in ("TENSORDIFF_FUSE", "TENSORDIFF_GRAPHS"):
        if env is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, env)
    got = DS.parse({}, DEEPSEEK)
    assert got["fuse"] == want and got["graphs"] == want
    # the option given wins over the environment
    assert DS.parse({"fuse": "off", "graphs": "yes"}, DEEPSEEK) | {} == {**got, "fuse": "off", "graphs": "on"}


def test_a_bad_env_default_is_bad_input_naming_the_variable(monkeypatch):
    monkeypatch.setenv("TENSORDIFF_GRAPHS", "sometimes")
    with pytest.raises(BadInput, match="TENSORDIFF_GRAPHS"):
        DS.parse({}, DEEPSEEK)


def test_resolve_types_a_hand_built_request_and_keeps_undeclared_keys():
    rows = object()  # a test's stand-in image rows: passed through untouched
    got = DS.resolve({"kernel_quant": "false", "image_rows": rows})
    assert got["kernel_quant"] is False and got["image_rows"] is rows and got["attention"] is None
    assert DS.resolve(DS.parse({"kernel_quant": "1"}, DEEPSEEK)) == DS.parse({"kernel_quant": "1"}, DEEPSEEK)


def test_for_side_keeps_what_each_runner_reads():
    opts = DS.parse({"attention": "math"}, DEEPSEEK)
    assert set(DS.for_side(opts, "oracle")) == {"language_numerics", "kernel_quant", "index_keys"}
    assert set(DS.for_side(opts, "engine")) == {"attention", "language_numerics", "kernel_quant", "index_keys",
                                                "fuse", "graphs"}
    assert DS.for_side({**opts, "sdpa": "math"}, "oracle", undeclared=True) == {
        "language_numerics": None, "kernel_quant": None, "index_keys": "official", "sdpa": "math"}


def test_a_table_refuses_a_malformed_declaration():
    with pytest.raises(ValueError):
        Option("x", "float", 0.0, "no such type")
    with pytest.raises(ValueError):
        Option("x", "choice", None, "choices missing")
    with pytest.raises(ValueError, match="twice"):
        OptionTable((Option("a", "bool", False, "a"), Option("b", "bool", False, "b", aliases=("a",))))


@pytest.mark.parametrize("items,match", [(["kernel_quant"], "KEY=VALUE"), (["=1"], "KEY=VALUE"),
                                         (["a=1", "a=2"], "given twice")])
def test_assignments_are_key_value(items, match):
    with pytest.raises(BadInput, match=match):
        parse_assignments(items)


def test_assignments_keep_values_as_strings():
    assert parse_assignments(["attention=flash,math", "kernel_quant=no"]) == {"attention": "flash,math",
                                                                             "kernel_quant": "no"}


def test_render_lists_name_type_default_and_help():
    text = render(registry.adapter(DEEPSEEK))
    for o in DS.options:
        assert o.name in text and o.help in text
    assert "kernel_quant = bool   default none" in text and "$TENSORDIFF_FUSE" in text


# --- validate_request: the run's fault and options against the adapter's tables


def test_validate_request_types_the_options():
    ad = registry.adapter(DEEPSEEK)
    fault, opts = validate_request(ad, options={"kernel_quant": "no"})
    assert fault is None and opts["kernel_quant"] is False


def test_a_language_fault_without_a_prompt_is_refused():
    ad = registry.adapter(DEEPSEEK)
    with pytest.raises(BadInput, match="needs --prompt"):
        validate_request(ad, fault=D.ROUTER_TEXT_BIAS_FOR_IMAGES)
    f, _ = validate_request(ad, fault=D.ROUTER_TEXT_BIAS_FOR_IMAGES, prompt="Describe <image>.")
    assert f.boundary == "router.0.ids"
    assert validate_request(ad, fault=D.ROUTER_BIASED_WEIGHTS, decode=2)[0].name == D.ROUTER_BIASED_WEIGHTS


def test_the_chunk_fault_needs_a_chunk():
    ad = registry.adapter(DEEPSEEK)
    with pytest.raises(BadInput, match="needs --chunk"):
        validate_request(ad, fault=D.OVERLAY_CHUNK_SHIFT, prompt="<image> hi")
    assert validate_request(ad, fault=D.OVERLAY_CHUNK_SHIFT, prompt="<image> hi", chunk=4)[0] is not None


@pytest.mark.parametrize("model,fault", [(DEEPSEEK, D.GELU_TANH), (QWEN, Q.VISION_GELU_ERF),
                                         (QWEN, Q.MERGER_GELU_TANH)])
def test_a_float32_fault_in_bfloat16_is_refused(model, fault):
    ad = registry.adapter(model)
    with pytest.raises(BadInput, match="needs --dtype float32"):
        validate_request(ad, fault=fault, dtype="bfloat16")
    assert validate_request(ad, fault=fault, dtype="float32")[0].name == fault


def test_a_vision_fault_needs_nothing_checkable():
    ad = registry.adapter(DEEPSEEK)
    for name in (D.CONTAIN_CEIL, D.ROPE_INTERLEAVED, D.ALIGNER_FLAT_PAD, D.PATCH_PAD_NONZERO):
        assert fault_refusal(ad, name, dtype="bfloat16") is None


def test_an_unknown_fault_names_the_known_ones():
    with pytest.raises(BadInput, match=f"unknown fault 'nope' for {QWEN} \\(known: {Q.MERGE_ORDER_RASTER}"):
        validate_request(registry.adapter(QWEN), fault="nope")
    assert "has no fault" in fault_refusal(registry.adapter(QWEN), D.CONTAIN_CEIL)


def test_an_adapter_without_a_table_takes_no_options():
    toy = ModelAdapter("toy", Contract("toy", ()), (Fault("f", "b", "d", needs=(LANGUAGE, FLOAT32)),),
                       oracle=lambda: None, engine=lambda: None)
    assert validate_request(toy) == (None, {})
    with pytest.raises(BadInput, match="this model takes no options"):
        validate_request(toy, options={"attention": "math"})
    with pytest.raises(BadInput, match="needs --prompt"):
        validate_request(toy, fault="f", dtype="bfloat16")


# --- calibrate's --variant: an oracle option, typed through the same table


def test_oracle_option_types_the_value():
    assert oracle_option(registry.adapter(QWEN), "attn", "eager", "--variant attn=eager") == ("attention", "eager")
    assert oracle_option(registry.adapter(DEEPSEEK), "kernel_quant", "yes", "--variant") == ("kernel_quant", True)


@pytest.mark.parametrize("model,key,value,match", [
    (QWEN, "attn", "nonsense", "not one of sdpa, eager"),
    (QWEN, "nonsense", "1", "options: processor, attention"),
    (DEEPSEEK, "attention", "math", "engine only"),  # the oracle would not change: a floor of zero
    (DEEPSEEK, "kernel_quant", "maybe", "not a boolean"),
])
def test_oracle_option_refuses_what_the_oracle_does_not_read(model, key, value, match):
    with pytest.raises(BadInput, match=match):
        oracle_option(registry.adapter(model), key, value, f"--variant {key}={value}")
