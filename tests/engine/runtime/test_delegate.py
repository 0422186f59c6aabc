"""engine/runtime/delegate.py: a backend's measured-slower ops run the reference's, and only those."""
from __future__ import annotations

import time

import torch

from engine.backend.torch_ops import TorchBackend
from engine.runtime import delegate


class Slow(TorchBackend):
    """The torch ops, with patch_linear 30 ms slower per call (a slow hand-written kernel)."""
    name = "slow"

    def __init__(self):
        self.calls = []

    def patch_linear(self, x, weight, bias):
        self.calls.append("patch_linear")
        time.sleep(0.03)
        return super().patch_linear(x, weight, bias)

    def rms_norm(self, x, weight, eps):
        self.calls.append("rms_norm")
        return super().rms_norm(x, weight, eps)


def test_only_the_clearly_slower_op_is_delegated_and_it_runs_the_references():
    slow, ref = Slow(), TorchBackend()
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    calls = {"patch_linear": lambda be: be.patch_linear(x, w, None),
             "rms_norm": lambda be: be.rms_norm(x, torch.ones(16), 1e-6)}
    t = delegate.measure({"patch_linear": calls["patch_linear"]}, slow, ref, torch.device("cpu"), reps=2)
    assert t["patch_linear"]["delegated"] and t["patch_linear"]["own_ms"] > 25  # timed for real
    t["rms_norm"] = {"own_ms": 1.0, "reference_ms": 0.95, "delegated": False}
    be = delegate.delegating(slow, ref, t)
    assert be.name == "slow" and be.ops == {"patch_linear"}
    slow.calls.clear()
    assert torch.equal(be.patch_linear(x, w, None), ref.patch_linear(x, w, None))
    be.rms_norm(x, torch.ones(16), 1e-6)
    assert slow.calls == ["rms_norm"]  # patch_linear went to the reference, rms_norm stayed


def test_nothing_faster_leaves_the_backend_itself():
    slow = Slow()
    assert delegate.delegating(slow, TorchBackend(), {"rms_norm": {"delegated": False}}) is slow


def test_the_rule_a_clear_win_delegates_a_near_tie_keeps_the_backends_own():
    """measure's verdict at fixed timings (own 1 ms): the reference at 0.5 and 0.89 ms delegates,
    at 0.95 and 1.2 ms does not."""
    times = iter([1.0, 0.5, 1.0, 0.89, 1.0, 0.95, 1.0, 1.2])
    calls = {name: (lambda be: None) for name in ("a", "b", "c", "d")}
    t = delegate.measure(calls, object(), object(), torch.device("cpu"), timer=lambda fn, dev, reps: next(times))
    assert {k: v["delegated"] for k, v in t.items()} == {"a": True, "b": True, "c": False, "d": False}


def test_the_block_rule_keeps_the_faster_whole_block_and_the_backends_on_a_tie():
    """measure_block at fixed timings: each side timed twice, alternating, its best kept; the
    reference block delegates only when strictly faster."""
    for own, ref, want in (((1.0, 1.2), (0.9, 1.5), True), ((1.0, 1.0), (1.0, 1.0), False),
                           ((2.0, 1.0), (1.5, 1.1), False), ((3.0, 3.0), (2.0, 2.5), True)):
        times = iter([own[0], ref[0], own[1], ref[1]])
        t = delegate.measure_block(lambda: None, lambda: None, torch.device("cpu"),
                                   timer=lambda fn, dev, reps: next(times))
        assert (t["own_ms"], t["reference_ms"], t["delegated"]) == (min(own), min(ref), want)


def test_graphed_ms_on_the_cpu_times_plain_calls():
    calls = []
    ms = delegate.graphed_ms(lambda: calls.append(time.sleep(0.002)), torch.device("cpu"), reps=3)
    assert ms >= 1.5 and len(calls) == 1 + 3 * 3  # one warm-up, 3 runs of 3 (per_call_ms)
