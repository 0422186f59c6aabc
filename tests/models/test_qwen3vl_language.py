"""The Qwen3-VL language path against transformers (fp32, CPU, synthetic:tiny): the clean engine
matches on four photographs and three chunk sizes with decode; every language fault is named at
its boundary, alone, end to end, by local error and through the CLI."""
from __future__ import annotations

import dataclasses
import fnmatch
import json

import pytest
import torch

from cli_runner import run_cli
from qwen3vl_images import make_images
from tensordiff.pipeline.adapter import RunRequest
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.format.dump import open_dump
from tensordiff.pipeline.faults import CHUNK
from tensordiff.pipeline.local_error import local_error
import tensordiff.models.qwen3_vl.faults as QF
from tensordiff.models.qwen3_vl.adapter import ADAPTER

PROMPT = "Here is a photo: <image> What does it show?"
PHOTOS = ("astronaut", "chelsea", "coffee", "wide")
CHUNKS = (1, 7, 16)
DECODE = 3
LANGUAGE = {"embeddings", "text_rope", "hidden.0", "deepstack_add.0", "hidden.1", "deepstack_add.1", "hidden.2",
            "deepstack_add.2", "hidden.3", "logits", "logits.step.1", "logits.step.2", "logits.step.3",
            "token.step.1", "token.step.2", "token.step.3"}
TOKENS = {"token.step.1", "token.step.2", "token.step.3"}  # no stage: each is the argmax of logits a stage judged


@pytest.fixture(scope="module")
def setup(module_tmp):
    root = module_tmp("qwen3vl-language")
    return root, make_images(root / "images"), ADAPTER.weights("synthetic:tiny")


def dump(root, side, req, tag):
    out = root / f"{tag}-{side}"
    if out.exists():
        return out
    rec = Recorder(out, model=ADAPTER.name, producer={"name": f"test-{side}", "side": side})
    ADAPTER.runner(side)(req, rec)
    return rec.close()


def request(images, wdir, name, **kw):
    return RunRequest(weights="synthetic:tiny", weights_dir=wdir, image=images[name], prompt=PROMPT, decode=DECODE,
                      **kw)


def pad_range(run_dir) -> tuple[int, int]:
    """The image rows off the t = h = w diagonal (all but the first pad row), [lo, hi)."""
    pos = open_dump(run_dir).load("positions.ids")  # text rows sit on the diagonal
    off = [i for i in range(pos.shape[1]) if not (pos[0, i] == pos[1, i] == pos[2, i])]
    return off[0], off[-1] + 1


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("name", PHOTOS)
def test_clean_engine_matches_transformers(setup, name, chunk):
    root, images, wdir = setup
    req = request(images, wdir, name)
    a = dump(root, "oracle", req, name)  # single shot: the expectation of every chunking
    b = dump(root, "engine", dataclasses.replace(req, chunk=chunk), f"{name}-c{chunk}")
    report = compare_dumps(a, b)
    assert report.verdict == "match", str(report)
    assert LANGUAGE <= {bd.name for bd in report.boundaries}
    # the run really decoded and the chunking really cut the image's pad range
    run = json.loads((b / "manifest.json").read_text())["run"]
    assert len(run["outputs"]["generated"]) == DECODE + 1 and run["outputs"]["stop"] == "steps"
    assert run["outputs"] == json.loads((a / "manifest.json").read_text())["run"]["outputs"]
    for d in (a, b):  # both sides: the token fed to each step beside the very row it is the argmax of
        dd = open_dump(d)
        for k in range(1, DECODE + 1):
            row = dd.load("logits")[-1:] if k == 1 else dd.load(f"logits.step.{k - 1}")[-1:]
            assert (dd.load(f"token.step.{k}.scores") == row).all()
            assert dd.load(f"token.step.{k}.ids").tolist() == [[run["outputs"]["generated"][k - 1]]]
    assert report.boundary("logits.step.2").inputs[0] == "token.step.2"
    lo, hi = pad_range(a)
    assert any(lo < c < hi for c in range(chunk, hi, chunk)), (lo, hi, chunk)


def test_decode_positions_really_need_rope_deltas(setup):
    """The clean case is no accident: rope_deltas is negative on these pictures, so a decoder that
    ignored it would sit elsewhere (the fault below proves the boundary sees it)."""
    root, images, wdir = setup
    a = dump(root, "oracle", request(images, wdir, "chelsea"), "chelsea")
    assert int(open_dump(a).load("positions.rope_deltas")[0]) < 0


@pytest.mark.parametrize("fault", QF.LANGUAGE_NAMES)
def test_language_fault_is_named_at_its_boundary(setup, fault, tmp_path):
    root, images, wdir = setup
    req = request(images, wdir, "chelsea")
    chunk = 7 if CHUNK in ADAPTER.fault(fault).requirements else None
    a = dump(root, "oracle", req, "chelsea")
    bad = dataclasses.replace(req, fault=fault, chunk=chunk)
    b = dump(root, "engine", bad, f"chelsea-{fault}")
    report = compare_dumps(a, b)
    want = ADAPTER.fault(fault).boundary
    assert report.verdict == "diverged", str(report)
    assert report.earliest and all(fnmatch.fnmatchcase(e, want) for e in report.earliest), (fault, report.earliest)
    # local error: the engine's stage, on the oracle's own inputs, names the same origin
    local = local_error(ADAPTER, bad, a, report, None, tmp_path)
    assert local.available and local.origin is not None and fnmatch.fnmatchcase(local.origin, want), local.summary()


def test_clean_local_error_has_no_origin_with_chunks(setup, tmp_path):
    root, images, wdir = setup
    req = dataclasses.replace(request(images, wdir, "coffee"), chunk=7)
    a = dump(root, "oracle", request(images, wdir, "coffee"), "coffee")
    report = compare_dumps(a, dump(root, "engine", req, "coffee-c7"))
    local = local_error(ADAPTER, req, a, report, None, tmp_path)
    assert local.available and local.origin is None, local.summary()
    staged = {r.boundary: r.status for r in local.boundaries}
    assert all(staged.get(b) == "match" for b in LANGUAGE - TOKENS), staged


def test_cli_check_matches_and_localises(setup, tmp_path, capsys):
    root, images, wdir = setup
    base = ["check", "qwen3-vl", "--weights", "synthetic:tiny", "--image", images["coffee"], "--prompt", PROMPT,
            "--chunk", 7, "--decode", 2]
    code, out, err = run_cli(base + ["--out", tmp_path / "clean"], capsys)
    assert code == 0, out + err
    assert "logits.step.2" in out
    code, out, err = run_cli(base + ["--fault", QF.DEEPSTACK_EVERY_ROW, "--out", tmp_path / "bad"], capsys)
    assert code == 1, out + err
    assert "deepstack_add.0" in out and "DIVERGED (root)" in out


def test_cli_refuses_a_language_fault_without_its_route(setup, capsys):
    root, images, wdir = setup
    code, out, err = run_cli(["check", "qwen3-vl", "--weights", "synthetic:tiny", "--image", images["coffee"],
                              "--prompt", PROMPT, "--fault", QF.IMAGE_CHUNK_SHIFT], capsys)
    assert code == 2 and "--chunk" in err and "Traceback" not in err


def test_engine_stops_on_a_vision_special_token(setup):
    """Generation ends when the model emits <|vision_start|> (151652): never fed back."""
    from engine.qwen3_vl.config import load_config
    from engine.qwen3_vl.decoder import Decoder
    from engine.qwen3_vl.sequence import Sequence
    from engine import backend as backends

    _, _, wdir = setup
    cfg = load_config(wdir)
    dec = Decoder.load(wdir, cfg.text, cfg.tie_word_embeddings, backends.get("torch"), torch.float32)
    ids = torch.tensor(list(b"hello"), dtype=torch.int64)
    seq = Sequence(dec, ids, torch.arange(5).expand(3, -1), 0, cfg.image_token_id, {151652, 151653, 151655})
    last = seq.prefill()
    forced = torch.full_like(last, -1.0)
    forced[151652] = 1.0
    assert seq.decode(4, forced) == [151652] and seq.stop == "vision-token"
    assert seq.pos == 5  # nothing was fed
    seq2 = Sequence(dec, ids, torch.arange(5).expand(3, -1), 0, cfg.image_token_id, {151652})
    assert len(seq2.decode(2, seq2.prefill())) == 3 and seq2.stop == "steps"
