"""The CLI's `-o NAME=VALUE`, `tensordiff options` and fault refusals: bad input is one line on
stderr and exit 2, never a traceback and never a silent MATCH."""
from __future__ import annotations

import json

import pytest

from tensordiff.commands.cli import main
import tensordiff.models.deepseek_v41_flash.faults as D
import tensordiff.models.qwen3_vl.faults as Q
from tensordiff.models.deepseek_v41_flash.options import OPTIONS as DS
from tensordiff.models.qwen3_vl.options import OPTIONS as QW

DEEPSEEK, QWEN = "deepseek-v4.1-flash", "qwen3-vl"


def run(args, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.mark.parametrize("args,match", [
    (["check", DEEPSEEK, "-o", "nonsense=1"], "unknown option 'nonsense' for deepseek-v4.1-flash (known: attention, "
                                              "language_numerics, kernel_quant, index_keys, fuse, graphs"),
    (["check", DEEPSEEK, "-o", "attention=nonsense"], "'nonsense' is not one of cudnn, flash, efficient, math"),
    (["check", DEEPSEEK, "-o", "kernel_quant=maybe"], "not a boolean"),
    (["check", DEEPSEEK, "-o", "kernel_quant"], "KEY=VALUE"),
    (["check", DEEPSEEK, "-o", "fuse=sometimes"], "not one of off, on, auto"),
    (["check", DEEPSEEK, "--processor", "pil"], "unknown option 'processor' for deepseek-v4.1-flash"),
    (["check", QWEN, "-o", "attn=nonsense"], "'nonsense' is not one of sdpa, eager"),
    (["check", QWEN, "-o", "attention=math"], "'math' is not one of sdpa, eager"),
    (["dump", DEEPSEEK, "--side", "engine", "--out", "{tmp}/d", "-o", "graphs=2"], "not one of off, on, auto"),
    (["check", DEEPSEEK, "--fault", D.ROUTER_TEXT_BIAS_FOR_IMAGES], "needs --prompt"),
    (["check", DEEPSEEK, "--fault", D.OVERLAY_CHUNK_SHIFT, "--prompt", "<image> hi"], "needs --chunk"),
    # the direct comparison runs the engine in bf16 only (the default bf16 check's semantic pass
    # runs it in float32 too, where these approximations are reached and caught)
    (["check", DEEPSEEK, "--fault", D.GELU_TANH, "--dtype", "bfloat16", "--passes", "direct"], "needs --dtype float32"),
    (["check", QWEN, "--fault", Q.MERGER_GELU_TANH, "--dtype", "bfloat16", "--passes", "direct"],
     "needs --dtype float32"),
    (["check", DEEPSEEK, "--passes", "numeric"], "low-precision"),
    (["check", DEEPSEEK, "--dtype", "bfloat16", "--passes", "semantic,numeric", "--oracle-dtype", "float32"],
     "no direct pass"),
    (["options", "no-such-model"], "unknown model"),
])
def test_bad_options_and_unreachable_faults_exit_2_with_one_line(args, match, capsys, tmp_path):
    code, out, err = run([a.replace("{tmp}", str(tmp_path)) for a in args], capsys)
    assert code == 2, (out, err)
    assert match in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out


def test_a_bad_env_default_exits_2(capsys, monkeypatch):
    monkeypatch.setenv("TENSORDIFF_FUSE", "bogus")
    code, _, err = run(["check", DEEPSEEK], capsys)
    assert code == 2 and "TENSORDIFF_FUSE" in err


@pytest.mark.parametrize("args", [["options"], ["options", DEEPSEEK], ["check", DEEPSEEK, "--help"],
                                  ["dump", QWEN, "--help"]])
def test_options_are_listed(args, capsys):
    code, out, _ = run(args, capsys)
    assert code == 0
    tables = [DS, QW] if len(args) == 1 or args[-1] == "--help" else [DS]
    for t in tables:
        for o in t.options:
            assert o.name in out and o.help.split(",")[0] in out.replace("\n", " ").replace("  ", " ")
    assert "tensordiff options MODEL" in out or args[0] == "options"


def test_faults_lists_what_each_needs(capsys):
    code, out, _ = run(["faults", DEEPSEEK], capsys)
    assert code == 0 and "needs: --prompt (or --decode)" in out and "needs: --dtype float32" in out


def test_attention_math_runs_on_the_cpu_and_matches(capsys, tmp_path):
    # the CLI help's own example: a list of one kernel name, not of four letters
    code, out, err = run(["check", DEEPSEEK, "-o", "attention=math", "--out", tmp_path / "d"], capsys)
    assert code == 0 and out.startswith("MATCH"), err
    run_ = json.loads((tmp_path / "d" / "engine" / "manifest.json").read_text())["run"]
    assert run_["options"]["attention"] == ["math"]
    oracle = json.loads((tmp_path / "d" / "oracle" / "manifest.json").read_text())["run"]
    assert "attention" not in oracle["options"]  # engine-only: never in the oracle's manifest or cache key


def test_the_option_value_reaches_the_manifest(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDIFF_GRAPHS", "0")  # the env var only supplies the default...
    code, _, err = run(["dump", DEEPSEEK, "--side", "engine", "--out", tmp_path / "e", "-o", "fuse=on",
                        "-o", "kernel_quant=no"], capsys)
    assert code == 0, err
    opts = json.loads((tmp_path / "e" / "manifest.json").read_text())["run"]["options"]
    assert opts == {"attention": None, "language_numerics": "official", "kernel_quant": False,
                    "index_keys": "official", "fuse": "on", "graphs": "off"}  # ...the value is recorded
