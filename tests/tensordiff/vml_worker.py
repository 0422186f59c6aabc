"""One fresh process of the VML first-call race check (tests/tensordiff/test_warmup.py).

    python tests/tensordiff/vml_worker.py [--plant]     # prints one JSON line: {"defects": [...]}

It does what a fresh `tensordiff dump/check` does (tensordiff.warmup.warm(), unless
TENSORDIFF_VML_WARMUP=0), then the failing route: the DeepSeek engine's and oracle's 2D RoPE
tables as the process's first large cos/sin, on at least two intra-op threads; then the first
parallel call of every VML-routed op. A defect is a rope table off the unit circle or any first
call that differs, bit for bit, from the same call repeated once the dispatch is settled.
`--plant` is the fault that proves the check: the first half of the engine's rope.cos is
replaced by oneMKL's low-accuracy kernel (vmsCos with VML_EP), the defect the race produces.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GRID = (51, 74)  # the default picture's DeepSeek patch grid: 3,774 rows, as in the failing runs
DIM, THETA = 32, 10000.0
VML_EP = 0x3 | 0x00140000 | 0x100  # VML_EP | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE (mkl_vml_defines.h)


def plant_ep(cos):
    """Overwrite the first half of `cos` with MKL's EP-kernel cos of the same angles (or, where
    that kernel is exact on this CPU, the same angles' cos rounded to 11 bits)."""
    import ctypes

    import numpy as np
    import torch

    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    h, w = GRID
    inv = 1.0 / (THETA ** (torch.arange(0, DIM, 2, dtype=torch.float32) / DIM))
    idx = torch.arange(h * w)
    ang = torch.cat([(idx // w).float()[:, None] * inv, (idx % w).float()[:, None] * inv], -1).contiguous()
    half = ang[: ang.shape[0] // 2].numpy().ravel().copy()
    out = np.empty_like(half)
    lib.vmsCos(ctypes.c_int(half.size), half.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
               ctypes.c_longlong(VML_EP))
    low = torch.from_numpy(out.reshape(-1, DIM))
    exact = torch.cos(ang[: ang.shape[0] // 2].double()).float()
    if float((low.double() - exact.double()).abs().max()) < 1e-6:
        # this CPU's EP kernel is as accurate as the HA one: an ~11-bit kernel (EP's nominal
        # accuracy) stands in for it, so the check still meets the fault it exists for
        low = exact.half().float()
    cos = cos.clone()
    cos[: ang.shape[0] // 2] = low
    return cos


def rope_defect(side: str, cos, sin) -> str | None:
    err = float((cos.double() ** 2 + sin.double() ** 2 - 1).abs().max())
    if err > 1e-6:  # fp32 rounding gives ~1e-7; the EP kernel 3e-4
        rows = ((cos.double() ** 2 + sin.double() ** 2 - 1).abs().amax(1) > 1e-6).nonzero().flatten()
        return f"{side} rope off the unit circle: max |cos^2+sin^2-1| = {err:.3g}, rows {int(rows[0])}..{int(rows[-1])}"
    return None


def main(plant: bool) -> dict:
    import torch

    from tensordiff import warmup

    torch.set_num_threads(max(2, torch.get_num_threads()))
    warmed = warmup.warm()
    # As in a real run (a patch projection precedes the rope tables): the intra-op pool is up and
    # spinning, so the first cos really runs on two threads at once. Neither op goes through VML.
    x = torch.ones(1 << 20)
    for _ in range(3):
        x.add_(1)
    torch.ones(256, 256) @ torch.ones(256, 256)
    defects = []
    from engine.deepseek_v41_flash.rope import rope_tables

    cos, sin = rope_tables(*GRID, DIM, THETA)
    if plant:
        cos = plant_ep(cos)
    defects.append(rope_defect("engine", cos, sin))
    c2, s2 = rope_tables(*GRID, DIM, THETA)
    if not (torch.equal(cos, c2) and torch.equal(sin, s2)):
        defects.append("engine rope differs from the same call repeated")
    from oracle.deepseek_v41_flash.vision import get_vision_cos_sin

    oc, os_ = get_vision_cos_sin(*GRID, DIM, THETA)
    defects.append(rope_defect("oracle", oc.squeeze(1), os_.squeeze(1)))
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.rand(1 << 17, generator=gen, dtype=dtype) * 0.9 + 0.05  # inside every op's domain
        for op in warmup.VML_OPS:
            first = getattr(torch, op)(x)
            again = getattr(torch, op)(x)
            if not torch.equal(first, again):
                bad = (first != again).nonzero().flatten()
                defects.append(f"{op} {str(dtype)[6:]}: first call differs from the repeat at {bad.numel()} "
                               f"elements ({int(bad[0])}..{int(bad[-1])})")
    return {"warmed": warmed, "threads": torch.get_num_threads(), "defects": [d for d in defects if d]}


if __name__ == "__main__":
    print(json.dumps(main("--plant" in sys.argv[1:])))
