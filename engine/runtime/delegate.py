"""A backend whose measured-slower ops run the reference backend's op instead.

The hip backend's own kernels are what its tests hold to the torch reference; on the speed path
(a served engine's compiled, graphed passes) some of them lose to torch's op at the tower's real
shape (a hand-tiled patch GEMM against cuBLAS, say). There the engine times each of its own
kernels against the reference op once, on the pass's own tensors, and hands the clearly slower ones to
the reference. What was measured and what was delegated goes to the manifest's speed path, so
a dump says which kernel produced it. The one-shot eager route (`check`) never delegates.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

# a near tie keeps the backend's own kernel (the one its tests cover): delegate only a clear win
DELEGATE_BELOW = 0.9
# Inside a compiled block an op is not timed alone: torch.compile fuses torch's norm and rope into
# the GEMMs' neighbours, which an opaque kernel call prevents, so an op 10x faster in isolation can
# make the block slower. There the choice is between two whole compiled blocks, each as a replayed
# CUDA graph runs it, and the faster one is kept (the backend's kernels on a tie).
BLOCK_DELEGATE_BELOW = 1.0


class DelegatingBackend:
    """`base` with the ops in `ops` taken from `reference` (same semantics, the Backend protocol)."""

    def __init__(self, base, reference, ops):
        self.base, self.reference, self.ops = base, reference, frozenset(ops)
        self.name = base.name  # still that backend's run (the compiled route keys on the name)

    def __getattr__(self, op: str):
        return getattr(self.reference if op in self.ops else self.base, op)


def per_call_ms(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Milliseconds per call, `reps` calls back to back after one warm-up (median of 3)."""
    fn()
    runs = []
    for _ in range(3):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            runs.append(a.elapsed_time(b) / reps)
        else:
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            runs.append((time.perf_counter() - t) * 1e3 / reps)
    return sorted(runs)[1]


def measure(calls: dict[str, Callable[[Any], Any]], base, reference, device: torch.device,
            reps: int = 10, timer=per_call_ms) -> dict[str, dict]:
    """calls: op name -> fn(backend) running that op on the pass's tensors. Returns, per op, the
    backend's and the reference's ms per call and whether the op is delegated."""
    out = {}
    for op, call in calls.items():
        own = timer(lambda: call(base), device, reps)
        ref = timer(lambda: call(reference), device, reps)
        out[op] = {"own_ms": own, "reference_ms": ref, "delegated": ref < DELEGATE_BELOW * own}
    return out


def delegating(base, reference, timings: dict[str, dict]):
    """`base`, or a `DelegatingBackend` for the ops `measure` found clearly faster in `reference`."""
    ops = [op for op, t in timings.items() if t["delegated"]]
    return DelegatingBackend(base, reference, ops) if ops else base


def graphed_ms(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Milliseconds per call of fn as a replayed CUDA graph runs it (`reps` calls captured in one
    graph, median of 3 replays), so launch gaps count as little as in the engine's graphed
    passes. On the CPU, or when fn cannot be captured, `per_call_ms`."""
    if device.type != "cuda":
        return per_call_ms(fn, device, reps)
    try:
        s = torch.cuda.Stream(device=device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):  # warm: compiled kernels, cuBLAS workspaces, cuDNN plans
            fn()
        torch.cuda.current_stream(device).wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
    except Exception:  # noqa: BLE001 - not capturable: time it as plain calls
        torch.cuda.synchronize(device)
        return per_call_ms(fn, device, reps)
    graph.replay()
    runs = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b) / reps)
    del graph
    return sorted(runs)[1]


def measure_block(own: Callable[[], Any], reference: Callable[[], Any], device: torch.device, reps: int = 8,
                  timer=graphed_ms) -> dict:
    """Two whole compiled blocks on the pass's tensors: `own` (the backend's kernels between the
    compiled glue) and `reference` (torch's ops, compiled whole). Timed twice each, alternating
    (the clock ramps under load), best of each kept. delegated: the reference block is faster."""
    own_ms = ref_ms = float("inf")
    for _ in range(2):
        own_ms = min(own_ms, timer(own, device, reps))
        ref_ms = min(ref_ms, timer(reference, device, reps))
    return {"own_ms": own_ms, "reference_ms": ref_ms, "delegated": ref_ms < BLOCK_DELEGATE_BELOW * own_ms}
