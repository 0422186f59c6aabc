"""`tensordiff inspect CKPT` on a DeepSeek V4.1 Flash checkpoint directory
(`tensordiff/models/deepseek_checkpoint.py`): units and layers present, each group's stored
format, what a run converts on load, what is missing, the bytes a run with --layers reads (the
same tensors both sides read); broken or incomplete input is exit 2 with one line on stderr."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from cli_runner import run_cli
from tensordiff.models.deepseek_v41_flash import ADAPTER
from tensordiff.models.deepseek_v41_flash.checkpoint import describe
from tensordiff.models.deepseek_v41_flash.synthetic import resolve
from tensordiff.pipeline import provenance
from tensordiff.pipeline.adapter import RunRequest

INDEX = "model.safetensors.index.json"
REPRS = ("torch.", "dtype=", "PosixPath", "Counter(", "{'", "[('")


def _copy(tmp_path: Path, spec: str = "synthetic:tiny-fp8") -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(resolve(spec), dst)
    return dst


def _index(ck: Path) -> dict:
    return json.loads((ck / INDEX).read_text())


def _drop_from_index(ck: Path, keep) -> None:
    index = _index(ck)
    index["weight_map"] = {n: s for n, s in index["weight_map"].items() if keep(n)}
    (ck / INDEX).write_text(json.dumps(index))


def test_the_release_storage_is_described_with_its_conversions():
    view = describe(resolve("synthetic:tiny-fp8"))
    assert view.model == "deepseek-v4.1-flash" and view.problems == []
    assert view.present_layers == tuple(range(6)) and view.run_layers == tuple(range(6))
    assert view.groups["routed experts"] == {"FP4 in int8 + scale": 6 * 8 * 3}
    assert view.groups["attention output wo_a"] == {"FP8 + e8m0 scale": 6}
    assert view.groups["shared expert"] == {"FP8 + e8m0 scale": 18}
    assert sorted(view.conversions.values()) == [6, 144]
    assert "8 of 8 routed experts" in view.layer_units[0] and "Engram table" in view.layer_units[1]


def test_the_converted_layout_converts_nothing():
    view = describe(resolve("synthetic:tiny-fp8-converted"))
    assert view.problems == [] and view.conversions == {}
    assert view.groups["routed experts"] == {"FP4 as float4 + scale": 144}
    assert view.groups["attention output wo_a"] == {"bf16": 6}


def test_another_models_checkpoint_is_not_described(tmp_path):
    d = tmp_path / "other"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    assert describe(d) is None


@pytest.mark.parametrize("layers", [None, "0", "2-4"])
def test_the_bytes_a_run_reads_are_the_tensors_both_sides_read(layers):
    """The language bytes the view counts are those of the names each side's own loader reads."""
    import engine.deepseek_v41_flash.checkpoint as W
    from engine.deepseek_v41_flash.config import Config
    from engine.deepseek_v41_flash.model import LanguageModel
    from engine.deepseek_v41_flash.subset import parse_layers
    from oracle.deepseek_v41_flash.checkpoint import default_dtype, released_scales
    from oracle.deepseek_v41_flash.config import ModelArgs
    from oracle.deepseek_v41_flash.model import LanguageModel as OracleLM
    from oracle.deepseek_v41_flash.subset import layer_ids

    ck = resolve("synthetic:tiny-fp8")
    view = describe(ck, layers)
    counted = sum(b for part, b in view.reads.items() if part.startswith("language"))
    size = lambda names: sum(view.tensors[n].nbytes for n in set(names))  # noqa: E731
    cfg = Config.load(ck)
    ids = parse_layers(layers, cfg)
    engine = LanguageModel.tensor_names(cfg, ids)
    engine += W.stored_beside(ck, engine, "attn.wo_a.weight", "attn.wo_a.scale")
    markers = {"image_start", "image_end", "image_newline"}
    assert size(set(engine) - markers) == counted
    args = ModelArgs.from_dir(ck)
    with default_dtype(torch.bfloat16), torch.device("meta"):
        oracle = [n for n, _ in OracleLM(args, torch.bfloat16, layers=layer_ids(layers, args)).named_parameters()]
    oracle += released_scales(json.loads((ck / INDEX).read_text())["weight_map"], oracle)
    assert size(set(oracle) - markers) == counted
    assert view.run_layers == ids


def test_the_cli_prints_plain_words_and_exits_0(capsys):
    code, out, err = run_cli(["inspect", resolve("synthetic:tiny-fp8"), "--layers", "0,2"], capsys)
    assert code == 0 and err == "" and out.count("\n") > 20
    assert not any(r in out for r in REPRS), out


def test_a_partial_download_is_fine_for_the_layers_it_holds(tmp_path, capsys):
    ck = _copy(tmp_path)
    _drop_from_index(ck, lambda n: not n.startswith(("layers.3.", "layers.4.", "layers.5.")))
    view = describe(ck, "0-2")
    assert view.present_layers == (0, 1, 2) and view.problems == []
    everything = describe(ck)
    assert len(everything.problems) == 3 and all("asked for" in p for p in everything.problems)
    code, out, err = run_cli(["inspect", ck], capsys)
    assert code == 2 and err.count("\n") == 1 and "layer 3" in err and "Traceback" not in err
    assert "language layers: 0-2 of 0-5 (3 absent)" in out  # the report before the one-line error


def test_a_missing_shard_is_named_with_what_it_holds(tmp_path, capsys):
    ck = _copy(tmp_path)
    shard = _index(ck)["weight_map"]["layers.0.attn.wo_a.weight"]
    (ck / shard).unlink()
    view = describe(ck)
    assert view.missing_shards == [shard]
    assert any(shard in p and "missing" in p for p in view.problems)
    code, out, err = run_cli(["inspect", ck], capsys)
    assert code == 2 and err.count("\n") == 1 and shard in err


def test_a_missing_scale_is_named(tmp_path):
    ck = _copy(tmp_path)
    _drop_from_index(ck, lambda n: n != "layers.0.attn.wo_a.scale")
    view = describe(ck)
    assert view.groups["attention output wo_a"] == {"FP8 + e8m0 scale": 5, "FP8 without its scale": 1}
    assert any("layers.0.attn.wo_a.weight" in p and "without its scale" in p for p in view.problems)


def test_a_truncated_shard_is_unreadable(tmp_path, capsys):
    ck = _copy(tmp_path)
    shard = ck / _index(ck)["weight_map"]["layers.0.attn.wo_a.weight"]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    view = describe(ck)
    assert any("unreadable" in p and shard.name in p for p in view.problems)
    assert "unreadable" in view.groups["routed experts"]
    code, _, err = run_cli(["inspect", ck], capsys)
    assert code == 2 and err.count("\n") == 1


@pytest.mark.parametrize("breakage, args", [
    ("config", []),
    ("index", []),
    ("escape", []),
    (None, ["--layers", "7"]),
    (None, ["--layers", "a-b"]),
    (None, ["--verify"]),
])
def test_unreadable_input_is_exit_2_with_one_line(tmp_path, capsys, breakage, args):
    ck = _copy(tmp_path)
    if breakage == "config":
        (ck / "config.json").write_text("{not json")
    elif breakage == "index":
        (ck / INDEX).write_text("[]")
    elif breakage == "escape":
        index = _index(ck)
        index["weight_map"]["embed.weight"] = "../elsewhere.safetensors"
        (ck / INDEX).write_text(json.dumps(index))
    code, out, err = run_cli(["inspect", ck, *args], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_layers_on_a_dump_is_refused(tmp_path, capsys):
    dumps = Path(__file__).resolve().parents[2] / "dumps" / "sample-oracle"
    code, _, err = run_cli(["inspect", dumps, "--layers", "0"], capsys)
    assert code == 2 and "--layers" in err


def test_a_layer_subset_run_hashes_only_its_layers_shards(tmp_path):
    """With --layers, the weights digest covers the vision path, embedding, norm, head and those
    layers: an edit to another layer's shard leaves it, an edit to one of them changes it."""
    req = RunRequest(weights="x", prompt="Look: <image>", options={"layers": "2"})
    prefixes = ADAPTER.weight_prefixes(req)
    assert "layers.2." in prefixes and not any(p.startswith("layers.") and p != "layers.2." for p in prefixes)
    assert not "layers.20.attn.wq_a.weight".startswith(prefixes[-1])  # "layers.2." is not a prefix of layer 20
    assert ADAPTER.weight_prefixes(RunRequest(weights="x", prompt="Look: <image>")) is None  # every layer
    ck = tmp_path / "ck"
    ck.mkdir()
    from safetensors.torch import save_file

    for name, shard in (("vision.w", "a"), ("layers.2.w", "b"), ("layers.20.w", "c")):
        save_file({name: torch.ones(2)}, str(ck / f"{shard}.safetensors"))
    (ck / INDEX).write_text(json.dumps({"weight_map": {"vision.w": "a.safetensors", "layers.2.w": "b.safetensors",
                                                       "layers.20.w": "c.safetensors"}}))
    names = [p.name for p in provenance.weight_files(ck, prefixes)]
    assert names == ["a.safetensors", "b.safetensors", INDEX]
