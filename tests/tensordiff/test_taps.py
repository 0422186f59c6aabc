"""tensordiff.tap: forward hooks on any nn.Module, recorded into a Recorder."""
import pytest
import torch

from tensordiff import MemoryRecorder, Recorder, tap
from tensordiff.format.dump import open_dump
from tensordiff.errors import BadInput


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
        self.pair = Pair()

    def forward(self, x):
        for b in self.blocks:
            x = torch.relu(b(x))
        cos, sin = self.pair(x)
        return cos + sin


class Pair(torch.nn.Module):
    def forward(self, x):
        return x.cos(), x.sin()


def test_records_outputs_inputs_and_tuple_elements(tmp_path):
    torch.manual_seed(0)
    net, x = Net(), torch.randn(3, 4)
    with Recorder(tmp_path / "d", model="net") as rec, tap(net, {"block0": "blocks.0", "block1.in": "blocks.1@input",
                                                                 "rope.cos": "pair[0]", "rope.sin": "pair[1]"}, rec):
        y = net(x)
    d = open_dump(tmp_path / "d")
    assert d.names == ["block0", "block1.in", "rope.cos", "rope.sin"]  # forward order
    assert [e.boundary for e in d.entries] == ["block0", "block1", "rope", "rope"]
    want0 = net.blocks[0](x)
    assert torch.equal(torch.from_numpy(d.load("block0")), want0.detach())
    assert torch.equal(torch.from_numpy(d.load("block1.in")), torch.relu(want0).detach())
    assert torch.allclose(torch.from_numpy(d.load("rope.cos") + d.load("rope.sin")), y.detach())
    assert not net.blocks[0]._forward_hooks and not net.blocks[1]._forward_pre_hooks  # removed on exit


def test_a_later_in_place_change_does_not_reach_the_record():
    class InPlace(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            y = self.lin(x)
            y.mul_(0)  # a later kernel overwrites the buffer the hook saw
            return y

    m, rec = InPlace(), MemoryRecorder()
    with torch.no_grad(), tap(m, {"lin": "lin"}, rec):
        m(torch.ones(1, 2))
    assert rec.tensors["lin"].abs().sum() > 0


def test_a_failed_forward_writes_no_dump(tmp_path):
    net = Net()
    with pytest.raises(RuntimeError):
        with Recorder(tmp_path / "d", model="net") as rec, tap(net, {"block0": "blocks.0"}, rec):
            net(torch.randn(3, 5))  # wrong width: the forward fails
    assert not (tmp_path / "d").exists()


def test_a_module_called_twice_is_refused_unless_every_call():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(self.lin(x))

    m = Twice()
    with pytest.raises(BadInput, match="ran more than once"), tap(m, {"lin": "lin"}, MemoryRecorder()):
        m(torch.ones(1, 2))
    rec = MemoryRecorder()
    with tap(m, {"lin": "lin"}, rec, every_call=True):
        m(torch.ones(1, 2))
    assert list(rec.tensors) == ["lin.0", "lin.1"]


@pytest.mark.parametrize("points,msg", [
    ({"b": "blocks.7"}, r"no submodule 'blocks.7' \(near it: blocks.0, blocks.1\)"),
    ({"b": "pair"}, r"gave a tuple of 2, not a tensor; name an element, e.g. 'pair\[0\]'"),
    ({"b": "pair[5]"}, r"no element \[5\]"),
    ({"b": "blocks/0"}, "is not a module path"),
    ({"../x": "blocks.0"}, "is not allowed"),
    ({}, "at least one point"),
])
def test_bad_points_are_one_clear_error(points, msg):
    net = Net()
    with pytest.raises(BadInput, match=msg):
        with tap(net, points, MemoryRecorder()):
            net(torch.randn(3, 4))
    assert not any(b._forward_hooks for b in net.modules())


def test_works_on_a_transformers_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    rec = MemoryRecorder()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad(), tap(model, {"hidden.0": "model.layers.0", "hidden.1": "model.layers.1",
                                      "final_norm": "model.norm", "logits": "[logits]"}, rec):
        out = model(ids, output_hidden_states=True)
    assert list(rec.tensors) == ["hidden.0", "hidden.1", "final_norm", "logits"]
    assert torch.equal(rec.tensors["hidden.0"], out.hidden_states[1])
    assert torch.equal(rec.tensors["final_norm"], out.hidden_states[2])  # HF's last entry is after the norm
    assert torch.equal(rec.tensors["logits"], out.logits)


def test_inputs_by_position_and_keyword():
    class Kw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x, scale=x * 2)

    class Inner(torch.nn.Module):
        def forward(self, x, scale=None):
            return x * scale

    m, x, rec = Kw(), torch.randn(2, 3), MemoryRecorder()
    with tap(m, {"x": "inner@input[0]", "scale": "inner@input[scale]"}, rec):
        m(x)
    assert torch.equal(rec.tensors["x"], x) and torch.equal(rec.tensors["scale"], x * 2)
    with pytest.raises(BadInput, match=r"got no input \[bias\] \(1 positional; keywords: scale\)"):
        with tap(m, {"b": "inner@input[bias]"}, MemoryRecorder()):
            m(x)


class WithMethod(torch.nn.Module):
    """A computation written as a method, not a submodule (as transformers' `_deepstack_process`)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def add_extra(self, x, extra):
        return x + extra

    def forward(self, x):
        for k in range(2):
            x = self.add_extra(self.lin(x), float(k + 1))
        return x


def test_a_method_return_is_tapped_every_call_and_unwrapped_on_exit():
    torch.manual_seed(0)
    m, rec, x = WithMethod(), MemoryRecorder(), torch.randn(1, 2)
    with torch.no_grad(), tap(m, {"extra": "add_extra@return"}, rec, every_call=True):
        y = m(x)
        assert "add_extra" in m.__dict__
    assert list(rec.tensors) == ["extra.0", "extra.1"]
    with torch.no_grad():
        assert torch.equal(rec.tensors["extra.0"], m.lin(x) + 1) and torch.equal(rec.tensors["extra.1"], y)
    assert "add_extra" not in m.__dict__  # the class's method is back


def test_a_disabled_tap_records_and_counts_nothing():
    m, rec = WithMethod(), MemoryRecorder()
    with torch.no_grad(), tap(m, {"lin": "lin", "extra": "add_extra@return"}, rec, every_call=True) as t:
        m(torch.ones(1, 2))
        t.enabled = False  # e.g. decode after a tapped prefill
        m(torch.ones(1, 2))
        assert t.calls == {"lin": 2, "extra": 2}
        t.enabled = True
        m(torch.ones(1, 2))
    assert sorted(rec.tensors) == ["extra.0", "extra.1", "extra.2", "extra.3", "lin.0", "lin.1", "lin.2", "lin.3"]


@pytest.mark.parametrize("spec,msg", [("nope@return", "no such method"), ("lin@return", "a submodule"),
                                      ("@return", "names no method"), ("lin.nope@return", "no such method"),
                                      ("missing.add@return", "no submodule 'missing'")])
def test_bad_method_points_are_one_clear_error(spec, msg):
    m = WithMethod()
    with pytest.raises(BadInput, match=msg):
        tap(m, {"x": spec}, MemoryRecorder())
    assert "add_extra" not in m.__dict__ and not m.lin._forward_hooks


def test_a_method_returning_a_tuple_needs_an_element():
    class Two(torch.nn.Module):
        def both(self, x):
            return x, -x

        def forward(self, x):
            return self.both(x)[1]

    m, rec = Two(), MemoryRecorder()
    with pytest.raises(BadInput, match=r"method 'both' gave a tuple of 2, not a tensor; name an element, "
                                       r"e.g. 'both@return\[0\]'"), tap(m, {"x": "both@return"}, rec):
        m(torch.ones(1))
    with tap(m, {"neg": "both@return[1]"}, rec):
        m(torch.ones(1))
    assert torch.equal(rec.tensors["neg"], -torch.ones(1))


def test_a_tap_firing_while_a_cuda_graph_is_captured_is_refused_and_not_counted(monkeypatch):
    # an engine capturing decode in a CUDA graph runs the module's Python once, at capture: a tap
    # there would record the capture's placeholder (the query patched: no GPU needed)
    capturing = {"on": True}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    torch.manual_seed(0)
    net, x, rec = Net(), torch.randn(3, 4), MemoryRecorder()
    with tap(net, {"block0": "blocks.0", "block1.in": "blocks.1@input"}, rec) as t:
        with pytest.raises(BadInput) as e:
            net(x)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("tap point 'block0': it ran while a CUDA graph was being captured")
        assert "eagerly" in msg and "outside the graph" in msg
        assert t.calls == {} and rec.tensors == {}
        capturing["on"] = False  # eager decode: the same taps record, the refused call not counted as one
        net(x)
    assert t.calls == {"block0": 1, "block1.in": 1} and list(rec.tensors) == ["block0", "block1.in"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: a real graph capture")
def test_a_tap_inside_a_real_cuda_graph_capture_is_refused_and_eager_records():
    torch.manual_seed(0)
    net, x = torch.nn.Linear(4, 4).cuda(), torch.randn(2, 4, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm before capture (cuBLAS workspace), untapped
        net(x)
    torch.cuda.current_stream().wait_stream(s)
    rec = MemoryRecorder()
    with tap(net, {"out": ""}, rec) as t:
        with pytest.raises(BadInput, match="while a CUDA graph was being captured"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                net(x)
        assert rec.tensors == {} and t.calls == {}
        want = net(x)  # eager: recorded, a copy
    assert torch.equal(rec.tensors["out"], want)
