"""Bad inputs against the installed command line, one subprocess each, with a timeout.

Every case is one of six kinds, its test named after the kind:
- test_traceback_*: a bad file, value or path must end in one line on stderr and exit 2, naming the
  file and the field, never a traceback;
- test_data_lost_*: files are snapshotted before and after; a refused command leaves them as they were;
- test_passes_*: a comparison that compared nothing finite must not pass in silence;
- test_wrong_exit_*: an out-of-range value or a check that checked nothing exits 2;
- test_unclear_*: the message names what is wrong and what was expected;
- test_no_answer_*: a request the model cannot serve is refused at once, not run until killed.

Unreadable files: a process running as root reads every file whatever its mode bits, so there the
command runs under tests/reliability/unreadable.py, which makes opening the named paths fail with
EACCES as the kernel does for a user without read permission; as another user the files are
chmod 000 and the console script runs as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensordiff.format.capture import Recorder

HERE = Path(__file__).resolve().parent
TD = Path(sys.executable).with_name("tensordiff")  # the installed console script
ROOT_USER = os.geteuid() == 0


def run(args, *, timeout=240, unreadable=(), cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    if unreadable and ROOT_USER:
        cmd = [sys.executable, str(HERE / "unreadable.py"), *map(str, args)]
        env["TD_UNREADABLE"] = "\n".join(str(p) for p in unreadable)
    else:
        for p in unreadable:
            os.chmod(p, 0)
        cmd = [str(TD), *map(str, args)]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL)
    finally:
        for p in unreadable:
            if not ROOT_USER:
                os.chmod(p, 0o644)


def refused(res, *named: str) -> str:
    """Exit 2 with one line on stderr, no traceback, naming each of `named`; returns the line."""
    err = res.stderr.strip()
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.returncode == 2, (res.returncode, res.stdout[-800:], res.stderr[-800:])
    lines = [ln for ln in err.splitlines() if ln.startswith("tensordiff: error")]
    assert len(lines) == 1, err
    for n in named:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def dump(path: Path, tensors: dict, run=None, model="toy") -> Path:
    with Recorder(path, model=model, run=run or {}, producer={"name": "battery"}) as r:
        for k, v in tensors.items():
            r.record(k, v)
    return path


def pair(tmp_path: Path) -> tuple[Path, Path]:
    return (dump(tmp_path / "a", {"x": np.ones(4, np.float32)}),
            dump(tmp_path / "b", {"x": np.ones(4, np.float32)}))


# ----------------------------------------------------------------------------- checkpoints

def _link_tree(src: Path, dst: Path) -> Path:
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link)
    return dst


def _rewrite(path: Path, obj) -> None:
    path.unlink()  # a hard link to the cached file: never write through it
    path.write_text(json.dumps(obj))


@pytest.fixture(scope="module")
def ds_ckpt():
    from tensordiff.models.deepseek_v41_flash.synthetic import synthetic_dir

    return synthetic_dir("tiny")


@pytest.fixture(scope="module")
def qwen_ckpt():
    from tensordiff.models.qwen3_vl.synthetic import ensure

    return ensure("tiny")


def ds_with(src: Path, tmp: Path, **fields) -> Path:
    d = _link_tree(src, tmp / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    _rewrite(d / "config.json", {**cfg, **fields})
    return d


def qwen_with(src: Path, tmp: Path, vision=None, text=None, proc=None, size=None) -> Path:
    d = _link_tree(src, tmp / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    cfg["vision_config"].update(vision or {})
    cfg["text_config"].update(text or {})
    _rewrite(d / "config.json", cfg)
    pp = json.loads((d / "preprocessor_config.json").read_text())
    pp.update(proc or {})
    pp["size"].update(size or {})
    _rewrite(d / "preprocessor_config.json", pp)
    return d


DS = "deepseek-v4.1-flash"
QWEN = "qwen3-vl"
SIDES = ("oracle", "engine")


# ============================================================================= traceback

@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("field,value", [("vision_patch_size", 0), ("vision_n_heads", "2"),
                                         ("vision_min_pixels", -5), ("vision_dim", 1.5),
                                         ("vision_downsample_ratio", 0)])
def test_traceback_deepseek_config_value(ds_ckpt, tmp_path, side, field, value):
    ck = ds_with(ds_ckpt, tmp_path, **{field: value})
    refused(run(["dump", DS, "--side", side, "--weights", ck, "--out", tmp_path / "o"]), "config.json", field)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("where,field,value", [("vision", "patch_size", 0), ("vision", "num_heads", "4"),
                                               ("vision", "num_position_embeddings", -4),
                                               ("text", "num_hidden_layers", 0)])
def test_traceback_qwen_config_value(qwen_ckpt, tmp_path, side, where, field, value):
    ck = qwen_with(qwen_ckpt, tmp_path, **{where: {field: value}})
    refused(run(["dump", QWEN, "--side", side, "--weights", ck, "--out", tmp_path / "o", "--prompt", "<image> hi"]),
            "config.json", field)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("key,value", [("merge_size", 0), ("image_mean", [0.5]), ("rescale_factor", "x"),
                                       ("size.shortest_edge", -1)])
def test_traceback_qwen_preprocessor_value(qwen_ckpt, tmp_path, side, key, value):
    if key.startswith("size."):
        ck = qwen_with(qwen_ckpt, tmp_path, size={key[5:]: value})
    else:
        ck = qwen_with(qwen_ckpt, tmp_path, proc={key: value})
    refused(run(["dump", QWEN, "--side", side, "--weights", ck, "--out", tmp_path / "o"]),
            "preprocessor_config.json", key.split(".")[-1])


def test_traceback_unreadable_manifest(tmp_path):
    a = dump(tmp_path / "a", {"x": np.ones(4, np.float32)})
    b = dump(tmp_path / "b", {"x": np.ones(4, np.float32)})
    refused(run(["compare", a, b], unreadable=[b / "manifest.json"]), str(b / "manifest.json"))


def test_traceback_unreadable_tensor_file(tmp_path):
    a = dump(tmp_path / "a", {"x": np.ones(4, np.float32)})
    b = dump(tmp_path / "b", {"x": np.ones(4, np.float32)})
    refused(run(["compare", a, b], unreadable=[b / "x.safetensors"]), str(b / "x.safetensors"))


@pytest.mark.parametrize("model", [DS, QWEN])
def test_traceback_unreadable_config(ds_ckpt, qwen_ckpt, tmp_path, model):
    ck = _link_tree(ds_ckpt if model == DS else qwen_ckpt, tmp_path / "ckpt")
    refused(run(["dump", model, "--side", "engine", "--weights", ck, "--out", tmp_path / "o"],
                unreadable=[ck / "config.json"]), "config.json")


def test_traceback_unknown_user_in_weights(tmp_path):
    refused(run(["dump", DS, "--side", "engine", "--weights", "~no-such-user-td/ckpt", "--out", tmp_path / "o"]),
            "~no-such-user-td")


def test_traceback_unknown_user_in_gate_file(tmp_path):
    (tmp_path / "g.toml").write_text('[gate]\nname = "g"\n[[model]]\nname = "deepseek-v4.1-flash"\n'
                                     'weights = "~no-such-user-td/ckpt"\n')
    refused(run(["gate", tmp_path / "g.toml"]), "~no-such-user-td")


def test_traceback_dump_out_under_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    before = snapshot(tmp_path)
    refused(run(["dump", DS, "--side", "engine", "--out", tmp_path / "f" / "d"]), str(tmp_path / "f"))
    assert snapshot(tmp_path) == before


def test_traceback_import_out_under_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    src = Path(__file__).resolve().parents[1] / "data" / "import" / "polygraphy" / "outputs.json"
    refused(run(["import", "polygraphy", src, "--out", tmp_path / "f" / "d"]), str(tmp_path / "f"))


def _grid_pair(tmp_path, grid, contract=False):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    run_ = {} if contract else {"inputs": {"grid": grid}}
    a = dump(tmp_path / "a", {"patches": x}, run=run_)
    b = dump(tmp_path / "b", {"patches": x + 1}, run=run_)
    return a, b


def test_traceback_html_grid_from_manifest(tmp_path):
    a, b = _grid_pair(tmp_path, [2 ** 40, 2 ** 40])
    res = run(["compare", a, b, "--html", tmp_path / "r.html"], timeout=120)
    assert "Traceback" not in res.stderr and res.returncode in (1, 2), res.stderr[-1500:]


def test_traceback_html_grid_from_contract(tmp_path):
    a, b = _grid_pair(tmp_path, None, contract=True)
    (tmp_path / "c.toml").write_text('model = "toy"\ninputs = { grid = [1099511627776, 1099511627776] }\n'
                                     '[boundaries.patches]\ntensors = ["patches"]\nlayout = "grid"\ninputs = []\n')
    res = run(["compare", a, b, "--contract", tmp_path / "c.toml", "--html", tmp_path / "r.html"], timeout=120)
    assert "Traceback" not in res.stderr and res.returncode in (1, 2), res.stderr[-1500:]


# ============================================================================= data lost

def _force_dir(tmp_path) -> Path:
    d = dump(tmp_path / "out", {"x": np.ones(3, np.float32)})
    return d


def test_data_lost_dump_force_keeps_strangers(tmp_path):
    d = _force_dir(tmp_path)
    (d / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    refused(run(["dump", DS, "--side", "engine", "--out", d, "--force"]), "notes.txt")
    assert snapshot(tmp_path) == before


def test_data_lost_dump_force_keeps_the_input_image(tmp_path):
    from tensordiff.pipeline.inputs import default_image_path

    d = _force_dir(tmp_path)
    img = d / "picture.png"
    shutil.copy(default_image_path(), img)
    before = snapshot(tmp_path)
    refused(run(["dump", DS, "--side", "engine", "--out", d, "--force", "--image", img]), "picture.png")
    assert snapshot(tmp_path) == before


def test_data_lost_import_force_keeps_the_imported_file(tmp_path):
    d = _force_dir(tmp_path)
    src = Path(__file__).resolve().parents[1] / "data" / "import" / "polygraphy" / "outputs.json"
    shutil.copy(src, d / "outputs.json")
    before = snapshot(tmp_path)
    refused(run(["import", "polygraphy", d / "outputs.json", "--out", d, "--force"]), "outputs.json")
    assert snapshot(tmp_path) == before


def test_data_lost_force_replaces_a_plain_dump(tmp_path):
    """The clean case: a directory holding only what a dump wrote is replaced."""
    d = _force_dir(tmp_path)
    res = run(["dump", DS, "--side", "engine", "--out", d, "--force"])
    assert res.returncode == 0, res.stderr[-1500:]
    assert json.loads((d / "manifest.json").read_text())["model"] == DS
    assert not (d / "x.safetensors").exists()


# ============================================================================= passes that should not

@pytest.mark.parametrize("fill", [np.nan, np.inf])
def test_passes_no_finite_element_on_either_side(tmp_path, fill):
    a = dump(tmp_path / "a", {"x": np.full(8, fill, np.float32)})
    b = dump(tmp_path / "b", {"x": np.full(8, fill, np.float32)})
    res = run(["compare", a, b, "--json", tmp_path / "r.json"])
    assert res.returncode == 1, res.stdout[-1500:]
    t = json.loads((tmp_path / "r.json").read_text())["boundaries"][0]["tensors"][0]
    assert t["status"] != "match"


def test_passes_empty_tensors(tmp_path):
    a = dump(tmp_path / "a", {"x": np.zeros((0, 4), np.float32), "y": np.ones(3, np.float32)})
    b = dump(tmp_path / "b", {"x": np.zeros((0, 4), np.float32), "y": np.ones(3, np.float32)})
    res = run(["compare", a, b, "--json", tmp_path / "r.json"])
    rep = json.loads((tmp_path / "r.json").read_text())
    x = next(t for bd in rep["boundaries"] for t in bd["tensors"] if t["name"] == "x")
    assert x["status"] == "skipped", x  # reported as not compared, not as a match
    assert res.returncode == 0  # y compared and matches


def test_passes_nothing_but_empty_tensors(tmp_path):
    a = dump(tmp_path / "a", {"x": np.zeros((0, 4), np.float32)})
    b = dump(tmp_path / "b", {"x": np.zeros((0, 4), np.float32)})
    refused(run(["compare", a, b]), str(a))


def test_passes_verify_with_a_digest_that_is_not_a_string(tmp_path):
    a = dump(tmp_path / "a", {"x": np.ones(4, np.float32)})
    b = dump(tmp_path / "b", {"x": np.ones(4, np.float32)})
    m = json.loads((b / "manifest.json").read_text())
    m["tensors"][0]["sha256"] = 12345
    (b / "manifest.json").write_text(json.dumps(m))
    refused(run(["compare", a, b, "--verify"]), "sha256")


# ============================================================================= wrong exit or silent

@pytest.mark.parametrize("key,value", [("min_cosine", 1.5), ("max_mismatch", 5.0)])
def test_wrong_exit_tolerance_out_of_range(tmp_path, key, value):
    a, b = pair(tmp_path)
    (tmp_path / "t.toml").write_text(f"[tolerances.float32]\n{key} = {value}\n")
    refused(run(["compare", a, b, "--tolerances", tmp_path / "t.toml"]), "t.toml", key)


def test_wrong_exit_contract_tolerance_out_of_range(tmp_path):
    a, b = pair(tmp_path)
    (tmp_path / "c.toml").write_text('model = "toy"\n[boundaries.x]\ntensors = ["x"]\ninputs = []\n'
                                     'tolerance = { max_mismatch = 2.0 }\n')
    refused(run(["compare", a, b, "--contract", tmp_path / "c.toml"]), "c.toml", "max_mismatch")


def test_wrong_exit_verify_with_no_digests(tmp_path):
    a = dump(tmp_path / "a", {"x": np.ones(4, np.float32)})
    b = dump(tmp_path / "b", {"x": np.ones(4, np.float32)})
    for d in (a, b):
        m = json.loads((d / "manifest.json").read_text())
        for t in m["tensors"]:
            del t["sha256"]
        (d / "manifest.json").write_text(json.dumps(m))
    refused(run(["compare", a, b, "--verify"]), "sha256")


def test_wrong_exit_inspect_verify_with_no_digests(tmp_path):
    a = dump(tmp_path / "a", {"x": np.ones(4, np.float32)})
    m = json.loads((a / "manifest.json").read_text())
    del m["tensors"][0]["sha256"]
    (a / "manifest.json").write_text(json.dumps(m))
    refused(run(["inspect", a, "--verify"]), "sha256")
    assert run(["inspect", a]).returncode == 0  # without --verify nothing is promised


# ============================================================================= unclear message

def test_unclear_manifest_entry_without_file(tmp_path):
    b = dump(tmp_path / "b", {"x": np.ones(4, np.float32)})
    m = json.loads((b / "manifest.json").read_text())
    del m["tensors"][0]["file"]
    (b / "manifest.json").write_text(json.dumps(m))
    line = refused(run(["inspect", b]), "manifest.json", "'x'", "'file'")
    assert "None" not in line


@pytest.mark.parametrize("option", ["--tolerances", "--contract"])
def test_unclear_directory_where_a_file_is_expected(tmp_path, option):
    a, b = pair(tmp_path)
    (tmp_path / "settings").mkdir()
    line = refused(run(["compare", a, b, option, tmp_path / "settings"]), str(tmp_path / "settings"))
    assert "directory" in line.replace(str(tmp_path), "")


def test_unclear_directory_where_the_manifest_is_expected(tmp_path):
    a = dump(tmp_path / "a", {"x": np.ones(4, np.float32)})
    (a / "x.safetensors").unlink()
    (a / "x.safetensors").mkdir()
    line = refused(run(["inspect", a]), "x.safetensors")
    assert "directory" in line.replace(str(tmp_path), "")


def test_unclear_layers_backwards():
    line = refused(run(["dump", DS, "--side", "oracle", "--prompt", "<image> hi", "--layers", "5-2",
                        "--out", "/nonexistent-td/o"]), "5-2")
    assert "2-5" in line


def test_unclear_negative_layer_count(ds_ckpt, tmp_path):
    ck = ds_with(ds_ckpt, tmp_path, vision_n_layers=-3)
    refused(run(["dump", DS, "--side", "oracle", "--weights", ck, "--out", tmp_path / "o"]), "vision_n_layers", "-3")


def test_unclear_extreme_aspect_ratio(tmp_path):
    from PIL import Image

    img = tmp_path / "sliver.png"
    Image.new("RGB", (4000, 10), (120, 30, 60)).save(img)
    line = refused(run(["dump", QWEN, "--side", "oracle", "--image", img, "--out", tmp_path / "o"]), "sliver.png")
    assert "crop" in line or "pad" in line  # what to do about it


def test_unclear_file_name_with_a_newline(tmp_path):
    a = dump(tmp_path / "a", {"x": np.ones(4, np.float32)})
    refused(run(["compare", a, tmp_path / "b\nc"]), repr(str(tmp_path / "b\nc"))[1:-1])


def test_unclear_nan_on_one_side_with_equal_finite_pairs(tmp_path):
    x = np.arange(8, dtype=np.float32)
    y = x.copy()
    y[3] = np.nan
    a = dump(tmp_path / "a", {"x": x})
    b = dump(tmp_path / "b", {"x": y})
    res = run(["compare", a, b, "--json", tmp_path / "r.json"])
    assert res.returncode == 1
    t = json.loads((tmp_path / "r.json").read_text())["boundaries"][0]["tensors"][0]
    assert t["metrics"]["finite_max_abs"] == 0.0, t["metrics"]  # the finite pairs are equal
    assert "max|Δ| inf" not in res.stdout


# ============================================================================= no answer

@pytest.mark.parametrize("model", [QWEN, DS])
def test_no_answer_decode_beyond_the_model_limit(tmp_path, model):
    refused(run(["dump", model, "--side", "oracle", "--prompt", "<image> hi", "--decode", "1000000",
                 "--out", tmp_path / "o"], timeout=90), "1000000")
