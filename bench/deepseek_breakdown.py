"""Where the DeepSeek tower + aligner's time goes, piece by piece, at the bench's own shape.

Called by bench/engine_speed.py (the `deepseek_breakdown` section) on the engine's own prepared
weights. Every piece is timed back to back (`reps` calls between two CUDA events, so a piece of a
few microseconds is not a launch-latency figure), and the GEMMs also as a share of the bf16 dense
peak (`peak_tflops`, the H200's 989 by default). From those it writes:

- `block`: one block's pieces, eager and compiled: qkv / wo / w1 / w2 GEMMs alone, attention (the
  engine's kernel order), attn_in and out (the compiled route's two Inductor graphs), so that
  elementwise = piece - its GEMMs (norms, RoPE, SiLU*up, bias and residual adds);
- `tower`: embed (patch GEMM), rope tables, final norm, aligner (gather + two GEMMs);
- `totals`: the sum of the measured pieces for all layers, set beside the route's measured time
  (the difference: graph gaps and anything not listed), and the floor this attention speed
  allows: layers x (measured attention + the GEMMs at peak) + the tower's other GEMMs at peak.
  If that floor is above the 32 ms target, the target is out of reach at this attention speed.
- `hip_ops`: each op the hip backend runs with its own kernel (rms_norm, rope, patch GEMM,
  aligner gather) against torch's op at the same shape, and which are slower.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

H200_BF16_DENSE_TFLOPS = 989.0


def timed_ms(fn, reps: int, device) -> float:
    """Milliseconds per call of fn(), `reps` calls back to back (median of 3 such runs): the
    engine's own timer (the one its hip-vs-torch delegation measures with)."""
    from engine.runtime.delegate import per_call_ms

    return per_call_ms(fn, torch.device(device), reps)


def gemm_flop(m: int, w: torch.Tensor) -> int:
    n, k = w.shape
    return 2 * m * n * k


def breakdown(eng, patches: torch.Tensor, plan, route_ms: dict, reps: int = 20,
              peak_tflops: float = H200_BF16_DENSE_TFLOPS) -> dict:
    """eng: a torch-backend `VisionEngine` (bf16 on the GPU, or anything for a smoke run)."""
    from engine.deepseek_v41_flash import fused

    dev = patches.device
    tower, block = eng.tower, eng.tower.block
    layers = len(tower.w.blocks)
    blk = tower.w.blocks[min(1, layers - 1)]
    grid = plan.grid
    out: dict = {"reps": reps, "peak_tflops": peak_tflops, "layers": layers, "block": {}, "tower": {}}
    with torch.inference_mode():
        x = tower.embed(patches)
        n, d = x.shape
        cos, sin = tower.rope(grid, dev)
        q, k, v = block.attn_in(x, blk, cos, sin)
        o = block.attend(q, k, v)
        h = torch.randn_like(x)
        act = torch.randn(n, blk.w2.shape[1], device=dev, dtype=x.dtype)
        o2 = o.reshape(n, d)
        gemms = {"qkv": (lambda: F.linear(h, blk.wqkv, blk.bqkv), blk.wqkv),
                 "wo": (lambda: F.linear(o2, blk.wo, blk.bo), blk.wo),
                 "w1": (lambda: F.linear(h, blk.w1), blk.w1),
                 "w2": (lambda: F.linear(act, blk.w2), blk.w2)}
        b = out["block"]
        gemm_ms = gemm_roof = 0.0
        for name, (fn, w) in gemms.items():
            ms = timed_ms(fn, reps, dev)
            roof = gemm_flop(n, w) / (peak_tflops * 1e9)
            b[f"gemm_{name}"] = {"ms": ms, "tflops": gemm_flop(n, w) / ms / 1e9, "roofline_ms": roof,
                                 "share_of_peak": roof / ms}
            gemm_ms += ms
            gemm_roof += roof
        b["gemms"] = {"ms": gemm_ms, "roofline_ms": gemm_roof}
        heads, hd = q.shape[1], q.shape[2]
        att_ms = timed_ms(lambda: block.attend(q, k, v), reps, dev)
        b["attention"] = {"ms": att_ms, "tflops": 4 * n * n * hd * heads / att_ms / 1e9}
        # the same call on contiguous [H, N, hd] operands: what the views' layout costs the kernel
        qh, kh, vh = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))
        b["attention_heads_major"] = {"ms": timed_ms(lambda: block.attend(qh, kh, vh), reps, dev)}
        b["attn_in_eager"] = {"ms": timed_ms(lambda: block.attn_in(x, blk, cos, sin), reps, dev)}
        b["out_eager"] = {"ms": timed_ms(lambda: block.out(x, o, blk), reps, dev)}
        b["block_eager"] = {"ms": timed_ms(lambda: block(x, blk, cos, sin), reps, dev)}
        if fused.can_compile(dev):
            c = fused.compiled(block)
            b["attn_in_compiled"] = {"ms": timed_ms(lambda: c.attn_in(x, blk, cos, sin), reps, dev)}
            b["out_compiled"] = {"ms": timed_ms(lambda: c.out(x, o, blk), reps, dev)}
            b["block_compiled"] = {"ms": timed_ms(lambda: c(x, blk, cos, sin), reps, dev)}
        kind = "compiled" if "block_compiled" in b else "eager"
        in_ms, out_ms = b[f"attn_in_{kind}"]["ms"], b[f"out_{kind}"]["ms"]
        # what the route's pieces spend beyond their GEMMs: norms, RoPE, SiLU*up, bias/residual adds
        b["elementwise"] = {"of": kind, "attn_in_ms": in_ms - b["gemm_qkv"]["ms"],
                            "out_ms": out_ms - b["gemm_wo"]["ms"] - b["gemm_w1"]["ms"] - b["gemm_w2"]["ms"]}
        b["elementwise"]["ms"] = b["elementwise"]["attn_in_ms"] + b["elementwise"]["out_ms"]

        t = out["tower"]
        pw = tower.w.patch_w
        xp = torch.randn(n, pw.shape[1], device=dev, dtype=x.dtype)
        t["embed"] = {"ms": timed_ms(lambda: tower.embed(patches), reps, dev),
                      "roofline_ms": gemm_flop(n, pw) / (peak_tflops * 1e9)}
        t["embed_gemm"] = {"ms": timed_ms(lambda: F.linear(xp, pw, tower.w.patch_b), reps, dev)}
        t["rope_tables"] = {"ms": timed_ms(lambda: tower.rope(grid, dev), reps, dev)}
        t["final_norm"] = {"ms": timed_ms(lambda: tower.norm(x), reps, dev)}
        t["aligner"] = {"ms": timed_ms(lambda: eng.align(x, grid), reps, dev)}
        al = eng.aligner
        tokens = eng.align(x, grid).shape[0]
        t["aligner"]["roofline_ms"] = (gemm_flop(tokens, al.w1) + gemm_flop(tokens, al.w2)) / (peak_tflops * 1e9)

    block_ms = in_ms + att_ms + out_ms
    others = sum(t[p]["ms"] for p in ("embed", "rope_tables", "final_norm", "aligner"))
    others_roof = t["embed"]["roofline_ms"] + t["aligner"]["roofline_ms"]
    tot = {"block_of": kind, "per_block_ms": block_ms, "blocks_ms": layers * block_ms, "others_ms": others,
           "sum_of_pieces_ms": layers * block_ms + others,
           "attention_ms": layers * att_ms, "gemms_ms": layers * gemm_ms, "elementwise_ms": layers * b["elementwise"]["ms"],
           # the least this attention speed allows: measured attention + every GEMM at peak
           "floor_attention_plus_gemm_roofline_ms": layers * (att_ms + gemm_roof) + others_roof,
           "floor_attention_plus_measured_gemms_ms": layers * (att_ms + gemm_ms) + t["embed_gemm"]["ms"]}
    for name, ms in route_ms.items():
        tot[f"{name}_ms"] = ms
        tot[f"{name}_minus_sum_of_pieces_ms"] = ms - tot["sum_of_pieces_ms"]  # graph gaps, anything unlisted
    out["totals"] = tot
    return out


def hip_ops(hip, torch_be, eng, patches: torch.Tensor, plan, reps: int = 20) -> dict:
    """The hip backend's own kernels against torch's ops on the tower's tensors."""
    from engine.deepseek_v41_flash.aligner import cell_index

    tower = eng.tower
    blk = tower.w.blocks[0]
    dev = patches.device
    with torch.inference_mode():
        x = tower.embed(patches)
        n, d = x.shape
        cos, sin = tower.rope(plan.grid, dev)
        nh, hd = tower.block.nh, tower.block.hd
        qk = torch.randn(n, 2 * nh, hd, device=dev, dtype=x.dtype)
        xp = torch.randn(n, tower.w.patch_w.shape[1], device=dev, dtype=x.dtype)
        index = cell_index(*plan.grid, eng.cfg.vision_downsample_ratio, dev).to(torch.int32)
        ops = {"rms_norm": lambda be: be.rms_norm(x, blk.norm1, 1e-6),
               "rope_rotate_half": lambda be: be.rope_rotate_half(qk, cos, sin),
               "patch_linear": lambda be: be.patch_linear(xp, tower.w.patch_w, tower.w.patch_b),
               "aligner_gather": lambda be: be.aligner_gather(x, index)}
        res = {}
        for name, op in ops.items():
            h_ms = timed_ms(lambda: op(hip), reps, dev)
            t_ms = timed_ms(lambda: op(torch_be), reps, dev)
            diff = float((op(hip).float() - op(torch_be).float()).abs().max())
            res[name] = {"hip_ms": h_ms, "torch_ms": t_ms, "hip_over_torch": h_ms / t_ms, "max_abs_diff": diff}
    calls = {"rms_norm": 2 * len(tower.w.blocks) + 1, "rope_rotate_half": len(tower.w.blocks), "patch_linear": 1,
             "aligner_gather": 1}
    for name, r in res.items():
        r["calls_per_pass"] = calls[name]
        r["pass_cost_ms"] = calls[name] * (r["hip_ms"] - r["torch_ms"])  # > 0: hip costs this much more
    return {"ops": res, "slower_on_hip": sorted(k for k, r in res.items() if r["hip_over_torch"] > 1.0)}
