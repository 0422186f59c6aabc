"""The worked example of examples/sglang_dump: SGLang-style dumps of a tiny decoder imported
with `tensordiff import sglang` and compared; clean they match, a planted layer-1 fault is named at
its module (at the prompt and every decode step, or at decode only), and the example leaves
nothing behind."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "sglang_dump"
RUN = HERE / "run.py"


def listing(d: Path) -> set:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


@pytest.fixture(scope="module")
def example_main():
    """run.py's `main`, loaded once in this process (not as __main__, so nothing runs on load)."""
    import runpy

    path, modules = list(sys.path), set(sys.modules)
    try:  # run.py puts its own folder first on sys.path for `import model`: not for later tests
        yield runpy.run_path(str(RUN), run_name="sglang_dump_example")["main"]
    finally:
        sys.path[:] = path
        for name in ("model", "sglang_style"):
            if name not in modules:
                sys.modules.pop(name, None)


def run_here(example_main, tmp_path, capsys, *args):
    with pytest.raises(SystemExit) as e:
        example_main(["--json", str(tmp_path / "r.json"), *args])
    out, err = capsys.readouterr()
    r = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else None
    return e.value.code, out, err, r


def test_the_clean_run_matches_as_written_and_leaves_nothing_behind(tmp_path):
    # the command of the README, from the repository root, in its own process; its temporary
    # folder goes under a TMPDIR of the test's own, which must be empty again afterwards
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = listing(HERE)
    p = subprocess.run([sys.executable, "examples/sglang_dump/run.py", "--json", str(tmp_path / "r.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(tmp)})
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["verdict"] == "match" and r["producers"]["b"]["name"] == "sglang dumper"
    names = [b["name"] for b in r["boundaries"]]
    assert {"model.layers.1.mlp.act_fn", "model.layers.1.mlp.act_fn.step.2", "output.step.2"} <= set(names)
    assert list(tmp.iterdir()) == [] and listing(HERE) == before


def test_a_swapped_activation_is_named_in_layer_1_at_the_prompt_and_each_step(example_main, tmp_path, capsys):
    code, out, err, r = run_here(example_main, tmp_path, capsys, "--bug", "act-swap")
    assert code == 1, out + err
    assert r["earliest"] == ["model.layers.1.mlp.act_fn", "model.layers.1.mlp.act_fn.step.1",
                             "model.layers.1.mlp.act_fn.step.2"]
    status = {b["name"]: b["status"] for b in r["boundaries"]}
    assert status["model.layers.1.mlp.act_fn.inputs"] == "match" and status["model.layers.0"] == "match"
    assert status["model.layers.1.mlp.down_proj"] == "consequent"


def test_a_decode_only_fault_is_named_between_its_modules_at_decode_only(example_main, tmp_path, capsys):
    code, out, err, r = run_here(example_main, tmp_path, capsys, "--bug", "stale-kv")
    assert code == 1, out + err
    # the attention between qkv_proj (right) and o_proj (its input wrong), at each decode step; the prompt right
    assert r["earliest"] == ["model.layers.1.self_attn.o_proj.inputs.step.1",
                             "model.layers.1.self_attn.o_proj.inputs.step.2"]
    status = {b["name"]: b["status"] for b in r["boundaries"]}
    assert status["model.layers.1.self_attn.qkv_proj.step.1"] == "match" and status["output"] == "match"


def test_out_keeps_the_dumps_and_is_never_overwritten(example_main, tmp_path, capsys):
    code, out, err, r = run_here(example_main, tmp_path, capsys, "--out", str(tmp_path / "out"))
    assert code == 0 and r["verdict"] == "match"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["reference", "server", "sglang"]
    assert any((tmp_path / "out" / "sglang" / "server" / "exp").glob("step=2___rank=0___*name=non_intrusive__output*.pt"))
    code, out, err, _ = run_here(example_main, tmp_path, capsys, "--out", str(tmp_path / "out"))
    assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1
