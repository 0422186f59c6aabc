import hashlib
import json

import numpy as np
import pytest
import torch
from helpers_dumps import write
from safetensors.torch import load_file, save_file

from tensordiff import BadInput, Recorder, open_dump
from tensordiff.format.capture import MemoryRecorder
from tensordiff.format.storage import read_safetensors_header


def test_record_copies_the_buffer(tmp_path):
    buf = torch.ones(4, 3)
    with Recorder(tmp_path / "d", model="m") as r:
        r.record("x", buf)
        buf.fill_(7)  # a later kernel overwrites the buffer
    assert (open_dump(tmp_path / "d").load("x") == 1).all()


def test_directory_appears_only_on_clean_close(tmp_path):
    with pytest.raises(RuntimeError):
        with Recorder(tmp_path / "d", model="m") as r:
            r.record("x", torch.ones(2))
            raise RuntimeError("engine crashed")
    assert not (tmp_path / "d").exists()
    assert not any(p.name.startswith(".d.tmp") for p in tmp_path.iterdir())


def test_refuses_to_overwrite_unless_told(tmp_path):
    write(tmp_path / "d", {"x": torch.ones(2)})
    with pytest.raises(BadInput, match="refusing to overwrite"):
        Recorder(tmp_path / "d", model="m")
    with Recorder(tmp_path / "d", model="m", overwrite=True) as r:
        r.record("y", torch.zeros(3))
    assert open_dump(tmp_path / "d").names == ["y"]


@pytest.mark.parametrize("fmt", ["safetensors", "hdf5"])
def test_bf16_and_ints_stored_exactly(tmp_path, fmt):
    x = torch.randn(5, 7).to(torch.bfloat16)
    ids = torch.arange(12).reshape(3, 4)
    write(tmp_path / "d", {"a.x": x, "a.ids": ids}, fmt=fmt)
    d = open_dump(tmp_path / "d")
    e = d.entry("a.x")
    assert e.dtype.name == "bfloat16" and e.shape == (5, 7)
    assert torch.equal(torch.from_numpy(d.load("a.x")), x.float())
    assert (d.load("a.ids") == ids.numpy()).all()
    raw = e.stored.reader().read(0, 35)
    assert hashlib.sha256(raw.tobytes()).hexdigest() == e.sha256
    assert e.sha256 == hashlib.sha256(x.view(torch.int16).numpy().tobytes()).hexdigest()


def test_manifest_has_the_required_fields(tmp_path):
    write(tmp_path / "d", {"rope.cos": torch.ones(2, 2)}, run={"dtype": "float32"})
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["format"] == "tensordiff-dump" and m["version"] == 1 and m["model"] == "toy"
    t = m["tensors"][0]
    assert {k: t[k] for k in ("name", "boundary", "dtype", "shape")} == {
        "name": "rope.cos", "boundary": "rope", "dtype": "float32", "shape": [2, 2]}
    assert set(t) >= {"file", "key", "sha256"}


def test_our_safetensors_interoperate_with_the_reference_library(tmp_path):
    x = torch.randn(3, 5).to(torch.bfloat16)
    write(tmp_path / "d", {"x": x})
    assert torch.equal(load_file(tmp_path / "d" / "x.safetensors")["x"], x)
    save_file({"k": x}, tmp_path / "lib.safetensors")
    hdr, _ = read_safetensors_header(tmp_path / "lib.safetensors")
    raw = hdr["k"].reader().read(0, 15)
    assert np.array_equal(raw, x.view(torch.int16).numpy().view(np.uint16).reshape(-1))


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "", "a..b"])
def test_bad_names_refused(tmp_path, name):
    with pytest.raises(BadInput):
        with Recorder(tmp_path / "d", model="m") as r:
            r.record(name, torch.ones(1))


# ---------------------------------------------------------------- replacing only our own dumps

def test_overwrite_refuses_a_directory_that_is_not_a_dump(tmp_path):
    user = tmp_path / "photos"
    user.mkdir()
    (user / "cat.jpg").write_bytes(b"precious")
    with pytest.raises(BadInput, match="only replaces a tensordiff dump"):
        Recorder(user, model="m", overwrite=True)
    assert (user / "cat.jpg").read_bytes() == b"precious"


def test_overwrite_refuses_a_plain_file_and_leaves_no_hidden_copy(tmp_path):
    f = tmp_path / "out"
    f.write_text("notes")
    with pytest.raises(BadInput, match="is a file"):
        Recorder(f, model="m", overwrite=True)
    assert f.read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_overwrite_refuses_a_dir_that_becomes_a_non_dump_before_close(tmp_path):
    p = tmp_path / "d"
    rec = Recorder(p, model="m", overwrite=True)
    rec.record("x", torch.ones(2))
    p.mkdir()
    (p / "mine.txt").write_text("keep")
    with pytest.raises(BadInput, match="only replaces a tensordiff dump"):
        rec.close()
    assert (p / "mine.txt").read_text() == "keep"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["d"]  # no temporary directory left


def test_overwrite_replaces_a_dump(tmp_path):
    p = tmp_path / "d"
    with Recorder(p, model="m") as r:
        r.record("x", torch.ones(2))
    with Recorder(p, model="m", overwrite=True) as r:
        r.record("y", torch.zeros(3))
    assert open_dump(p).names == ["y"]
    assert sorted(q.name for q in tmp_path.iterdir()) == ["d"]


def test_cli_force_onto_a_user_directory_exits_2(tmp_path, capsys):
    from tensordiff.commands.cli import main

    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    with pytest.raises(SystemExit) as e:
        main(["dump", "deepseek-v4.1-flash", "--side", "engine", "--out", str(user), "--force"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "only replaces a tensordiff dump" in err and "overwrite=True" not in err
    assert (user / "thesis.tex").read_text() == "years of work"


def test_refusal_speaks_the_cli_language(tmp_path):
    p = write(tmp_path / "d", {"x": torch.ones(1)})
    with pytest.raises(BadInput) as e:
        Recorder(p, model="m")
    assert "pass --force" in str(e.value) and "overwrite=True" not in str(e.value)


@pytest.mark.parametrize("name", ["patches\n", "patches\r", "pat\tches", "x\x00"])
def test_names_are_one_printable_line(tmp_path, name):
    rec = Recorder(tmp_path / "d", model="m")
    with pytest.raises(BadInput, match="not allowed"):
        rec.record(name, torch.ones(1))


@pytest.mark.parametrize("model", ["", "  ", "a\nb", None])
def test_model_validated_when_writing(tmp_path, model):
    with pytest.raises(BadInput, match="model"):
        Recorder(tmp_path / "d", model=model)


def test_duplicates_refused_at_record(tmp_path):
    rec = Recorder(tmp_path / "d", model="m")
    rec.record("x", torch.ones(1))
    with pytest.raises(BadInput, match="twice"):
        rec.record("x", torch.ones(1))
    mem = MemoryRecorder()
    mem.record("x", torch.ones(1))
    with pytest.raises(BadInput, match="twice"):
        mem.record("x", torch.ones(1))


def test_dump_directory_is_world_readable(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        with Recorder(tmp_path / "d", model="m") as r:
            r.record("x", torch.ones(1))
    finally:
        os.umask(old)
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755


@pytest.fixture
def capturing(monkeypatch):
    """A CUDA graph being captured, as torch reports it (the query patched: no GPU needed);
    `state["on"] = False` ends the capture."""
    state = {"on": True}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["on"])
    return state


def test_recording_while_a_cuda_graph_is_captured_is_refused_in_one_line(tmp_path, capturing):
    rec, mem = Recorder(tmp_path / "d", model="m"), MemoryRecorder()
    for r in (rec, mem):
        with pytest.raises(BadInput) as e:
            r.record("hidden", torch.ones(2))
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("record('hidden'): it ran while a CUDA graph was being captured")
        assert "dump decode eagerly (SGLang --disable-cuda-graph, vLLM --enforce-eager)" in msg
        assert "record outside the graph" in msg
    assert mem.tensors == {} and rec.names() == []  # the refused records left nothing behind
    capturing["on"] = False  # the capture is over: the same recorders record
    rec.record("hidden", torch.ones(2))
    mem.record("hidden", torch.ones(2))
    rec.close()
    assert open_dump(tmp_path / "d").names == ["hidden"] and list(mem.tensors) == ["hidden"]


def test_a_process_that_never_used_cuda_is_not_asked_about_capture(tmp_path, monkeypatch):
    def asked():
        raise AssertionError("the capture query ran in a process without CUDA")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", asked)
    with Recorder(tmp_path / "d", model="m") as rec:
        rec.record("x", torch.ones(2))
    assert open_dump(tmp_path / "d").names == ["x"]
