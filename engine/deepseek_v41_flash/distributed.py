"""The DeepSeek V4.1 Flash engine as a tensor- and expert-parallel run on torch.distributed.

    torchrun --standalone --nproc-per-node 2 -m engine.deepseek_v41_flash.distributed \\
        --weights synthetic:tiny --prompt "Describe <image>." --out runs/tp2 [-o NAME=VALUE] [--fault NAME]

Each process is one rank (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; gloo on the CPU, NCCL on
GPUs, or `--dist-backend`). The language backbone is split over the W ranks:

- attention: the query heads column-parallel (`wq_b` rows, the sinks), the grouped output
  projection `wo_a` by the heads' groups and `wo_b` row-parallel over them: each rank's output is
  a partial sum, all-reduced. The low-rank query, the single KV head, the compressor and the
  indexer are replicated (every rank computes them from the same input).
- MoE: the routed experts split into W contiguous ranges (expert parallel; each rank reads only
  its own from the checkpoint), the shared expert split along its intermediate dimension; the
  router runs on every rank, each rank mixes the rows routed to its experts, one all-reduce.
- the head vocab-parallel: each rank's logits columns, all-gathered for the greedy choice.
The vision tower runs whole on every rank.

Each rank writes its own dump `OUT/rank<r>` (dumps/README.md, "Sharded runs"): `attn.L` as the
rank's partial sum (`partial: sum`), `logits` / `logits.step.K` as its vocab slice (`shard`
along the last axis), everything else replicated (the router, and so `router.L.ids` and the
`router.L.scores` it ranked, runs whole on every rank). `tensordiff compare ORACLE OUT` merges them.

Faults (`--fault`, FAULTS): `shard-order-reversed` (the head's slices gathered, and recorded, in
reversed rank order), `partial-as-replicated` (the attention output's all-reduce skipped: each
rank takes its partial sum for the whole, and records it as replicated), `expert-bias-shift` (the
last rank's expert bias table shifted by one expert).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import EngineInputError
from engine.deepseek_v41_flash.attention import Attention
from engine.deepseek_v41_flash.moe import ExpertBank, GateWeights, MoE
from engine.deepseek_v41_flash.quant import QuantWeight

SHARD_ORDER_REVERSED = "shard-order-reversed"
PARTIAL_AS_REPLICATED = "partial-as-replicated"
EXPERT_BIAS_SHIFT = "expert-bias-shift"
# fault -> (the boundary it must trip first, what it plants)
FAULTS = {
    SHARD_ORDER_REVERSED: ("logits", "the vocab-parallel head's slices gathered (and recorded) in reversed rank order"),
    PARTIAL_AS_REPLICATED: ("attn.0", "the attention output's all-reduce skipped: each rank's partial sum taken as "
                                      "the whole (recorded as replicated)"),
    EXPERT_BIAS_SHIFT: ("router.0.ids", "the last rank's expert bias table shifted by one expert"),
}
MULTICAST_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
EXPERT = re.compile(r"\.ffn\.experts\.(\d+)\.")


def _rows(w, lo: int, hi: int):
    """Output rows lo..hi-1 (dim -2) of a plain or quantised weight, as its own storage."""
    if isinstance(w, QuantWeight):
        return QuantWeight(w.data[..., lo:hi, :].clone(), w.scale[..., lo:hi, :].clone(), w.fmt)
    return w[..., lo:hi, :].clone()


def _cols(w, lo: int, hi: int):
    """Input columns lo..hi-1 (dim -1); a quantised weight only on its 32-column scale blocks."""
    if isinstance(w, QuantWeight):
        if lo % 32 or hi % 32:
            raise EngineInputError(f"a quantised weight splits on 32-column blocks; columns {lo}:{hi} do not")
        pack = 2 if w.fmt == "fp4" else 1
        return QuantWeight(w.data[..., lo // pack:hi // pack].clone(), w.scale[..., lo // 32:hi // 32].clone(), w.fmt)
    return w[..., lo:hi].clone()


def _split(n: int, world: int, what: str) -> int:
    if n % world:
        raise EngineInputError(f"{what} ({n}) does not split over {world} ranks")
    return n // world


@dataclass
class Parallel:
    """This process's rank of a W-rank run: the slices it holds and the collectives it runs."""

    rank: int
    world: int
    backend: str = "gloo"
    fault: str | None = None
    logits: list = field(default_factory=list)  # the head's local slices since the last tap
    partials: dict = field(default_factory=dict)  # layer -> the attention's partial sums since its tap

    # ---------------------------------------------------------------- collectives

    def _host(self, t: torch.Tensor) -> bool:
        return self.backend == "gloo" and t.device.type != "cpu"  # gloo reduces host copies

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        buf = t.detach().to("cpu", copy=True) if self._host(t) else t.detach().clone()
        dist.all_reduce(buf)
        return buf.to(t.device)

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        import torch.distributed as dist

        src = t.detach().to("cpu").contiguous() if self._host(t) else t.detach().contiguous()
        parts = [torch.empty_like(src) for _ in range(self.world)]
        dist.all_gather(parts, src)
        return [p.to(t.device) for p in parts]

    # ---------------------------------------------------------------- the model's hooks

    def expert_range(self, n_experts: int) -> tuple[int, int]:
        per = _split(n_experts, self.world, "n_routed_experts")
        return self.rank * per, (self.rank + 1) * per

    def reads(self, name: str, cfg) -> bool:
        """Whether this rank loads checkpoint tensor `name`: every one but other ranks' experts."""
        m = EXPERT.search(name)
        lo, hi = self.expert_range(cfg.n_routed_experts)
        return m is None or lo <= int(m.group(1)) < hi

    def localise(self, i: int, cfg, attn: Attention, moe: MoE):
        """Layer i's attention and MoE as this rank runs them (see the module doc)."""
        H, G, hd, r = cfg.n_heads, cfg.o_groups, cfg.head_dim, cfg.o_lora_rank
        h_local = _split(H, self.world, "n_heads")
        if G % self.world and self.world % G:
            raise EngineInputError(f"o_groups ({G}) and {self.world} ranks: one must divide the other")
        per_group = H // G
        h0, h1 = self.rank * h_local, (self.rank + 1) * h_local
        g0, g1 = h0 // per_group, -(-h1 // per_group)
        c0 = (h0 - g0 * per_group) * hd if g1 - g0 == 1 else 0  # a group split over ranks: its heads' columns
        c1 = c0 + h_local // (g1 - g0) * hd
        w = attn.w
        aw = dataclasses.replace(w, sink=w.sink[h0:h1].clone(), wq_b=_rows(w.wq_b, h0 * hd, h1 * hd),
                                 wo_a=_cols(_rows(w.wo_a, g0 * r, g1 * r), c0, c1),
                                 wo_b=_cols(w.wo_b, g0 * r, g1 * r))
        local_cfg = dataclasses.replace(cfg, n_heads=h_local, o_groups=g1 - g0)
        sharded_attn = ShardedAttention(self, i, local_cfg, aw, attn.backend, attn.kernel_quant)
        sh = moe.shared
        inter = sh.w1.shape[-2]
        width = _split(inter, self.world, "the shared expert's width")
        lo, hi = self.rank * width, (self.rank + 1) * width
        shared = ExpertBank(_rows(sh.w1, lo, hi), _rows(sh.w3, lo, hi), _cols(sh.w2, lo, hi))
        gate = moe.gate
        if self.fault == EXPERT_BIAS_SHIFT and self.rank == self.world - 1:
            gate = GateWeights(gate.weight, gate.bias.roll(1),
                               gate.bias_vl.roll(1) if gate.bias_vl is not None else None)
        sharded_moe = ShardedMoE(self, gate, moe.experts, shared, topk=cfg.n_activated_experts,
                                 route_scale=cfg.route_scale, gate_temp=cfg.gate_temp,
                                 swiglu_limit=cfg.swiglu_limit, score_func=cfg.score_func,
                                 norm_topk_prob=cfg.norm_topk_prob, backend=moe.backend, fault=moe.fault)
        return sharded_attn, sharded_moe

    def vocab_rows(self, head: torch.Tensor) -> torch.Tensor:
        per = _split(head.shape[0], self.world, "vocab_size")
        return head[self.rank * per:(self.rank + 1) * per].clone()

    def gather_index(self, rank: int) -> int:
        """Where rank `rank`'s vocab slice goes in the whole (reversed under the fault)."""
        return self.world - 1 - rank if self.fault == SHARD_ORDER_REVERSED else rank

    def gather_vocab(self, local: torch.Tensor) -> torch.Tensor:
        self.logits.append(local)
        parts = self.all_gather(local)
        order = sorted(range(self.world), key=self.gather_index)
        return torch.cat([parts[r] for r in order], dim=-1)

    # ---------------------------------------------------------------- taps

    def tap(self, name: str, tensor: torch.Tensor) -> tuple[dict, torch.Tensor]:
        """(layout, this rank's tensor) for boundary tensor `name`, whose whole is `tensor`."""
        if name == "logits" or name.startswith("logits.step."):
            local, self.logits = torch.cat(self.logits), []
            return {"shard": {"axis": local.dim() - 1, "index": self.gather_index(self.rank), "count": self.world}}, local
        m = re.fullmatch(r"attn\.(\d+)", name)
        if m:
            local = torch.cat(self.partials.pop(int(m.group(1))))
            return ({"replicated": True} if self.fault == PARTIAL_AS_REPLICATED else {"partial": "sum"}), local
        return {"replicated": True}, tensor


class ShardedAttention(Attention):
    """The rank's heads; its output all-reduced (the layer sees the whole)."""

    def __init__(self, par: Parallel, *args):
        super().__init__(*args)
        self.par = par

    def __call__(self, x, start, cache, shared):
        partial = super().__call__(x, start, cache, shared)
        self.par.partials.setdefault(self.layer_id, []).append(partial)
        if self.par.fault == PARTIAL_AS_REPLICATED:
            return partial  # wrong: the partial sum taken as the whole
        return self.par.all_reduce(partial)


class ShardedMoE(MoE):
    """The rank's experts and slice of the shared expert; the mixture all-reduced."""

    def __init__(self, par: Parallel, *args, **kw):
        super().__init__(*args, **kw)
        self.par = par

    def __call__(self, x, image_rows=None, forced=None):
        y, weights, ids = super().__call__(x, image_rows, forced)
        return self.par.all_reduce(y), weights, ids


class RankTaps:
    """A recorder for one rank: each boundary tensor recorded as this rank holds it, with its layout."""

    enabled = True

    def __init__(self, rec, par: Parallel):
        self.rec, self.par = rec, par

    def record(self, name, tensor, *, boundary=None):
        layout, value = self.par.tap(name, tensor)
        self.rec.record(name, value, boundary=boundary, layout=layout)

    def update_run(self, **fields):
        self.rec.update_run(**fields)


# ------------------------------------------------------------------------- the rank program

def parse(argv):
    p = argparse.ArgumentParser(prog="torchrun ... -m engine.deepseek_v41_flash.distributed",
                                description="One rank of a tensor- and expert-parallel DeepSeek V4.1 Flash run; "
                                            "writes OUT/rank<r>.")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--weights", default="synthetic:tiny")
    p.add_argument("--image", type=Path, default=None)
    p.add_argument("--prompt", default="Describe <image>.")
    p.add_argument("--chunk", type=int, default=None)
    p.add_argument("--decode", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda (each rank takes cuda:LOCAL_RANK mod the GPUs)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--layers", default=None)
    p.add_argument("--fault", default=None, help="a sharded fault (" + ", ".join(FAULTS) + ") or an engine fault")
    p.add_argument("--dist-backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--force", action="store_true", help="replace this rank's existing dump")
    p.add_argument("-o", dest="extra", action="append", default=[], metavar="NAME=VALUE")
    return p.parse_args(argv)


def main(argv=None) -> int:
    import torch.distributed as dist

    from tensordiff.errors import BadInput
    from tensordiff.pipeline.runs import make_request, run_side

    a = parse(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = a.device
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % max(1, torch.cuda.device_count())}"
    backend = a.dist_backend if a.dist_backend != "auto" else ("nccl" if device.startswith("cuda") else "gloo")
    try:
        if (a.out / "manifest.json").exists():
            raise BadInput(f"{a.out} is a dump; a sharded run writes its rank dumps into a directory of its own")
        # every rank checks every rank's target, so no rank writes into a run another one refuses
        old = sorted(p.name for p in a.out.glob("rank*")) if a.out.is_dir() else []
        stale = [n for n in old if not re.fullmatch(r"rank(0|[1-9][0-9]*)", n) or int(n[4:]) >= world]
        if stale:
            raise BadInput(f"{a.out} holds {stale[0]}, which is no rank of a {world}-rank run; remove it first")
        if old and not a.force:
            raise BadInput(f"{a.out} already holds {', '.join(old)}; refusing to overwrite (--force replaces them)")
        sharded = a.fault if a.fault in FAULTS else None
        # every input checked before any rank waits on another (a bad one exits 2 on every rank)
        adapter, req = make_request("deepseek-v4.1-flash", image=a.image, weights=a.weights, device=device,
                                    dtype=a.dtype, fault=None if sharded else a.fault, prompt=a.prompt,
                                    chunk=a.chunk, decode=a.decode, extra=a.extra, layers=a.layers)
        par = Parallel(rank, world, backend, sharded)
        req.options["parallel"] = par  # read by `language.run.language_model`; never recorded
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(backend, rank=rank, world_size=world)
        from .run import run as engine_run

        def runner(req, rec):
            rec.update_run(parallel={"rank": rank, "world": world, "tp": world, "ep": world, "backend": backend},
                           fault=a.fault)
            t0 = time.perf_counter()
            engine_run(req, RankTaps(rec, par))
            facts = {"run_s": time.perf_counter() - t0,  # and the multicast switches this process saw
                     "env": {k: os.environ.get(k) for k in MULTICAST_ENV}}
            if device.startswith("cuda"):  # this rank's own peak (bench/multi_gpu_sharded.py reads it)
                facts["peak_gpu_mb"] = torch.cuda.max_memory_allocated(torch.device(device)) / 2**20
            rec.update_run(rank_facts=facts)

        out = run_side(dataclasses.replace(adapter, engine=lambda: runner), "engine", req,
                       a.out / f"rank{rank}", overwrite=a.force)
        print(f"rank {rank}/{world}: wrote {out}", flush=True)
        return 0
    except (BadInput, EngineInputError) as e:
        extra = f"; the sharded faults: {', '.join(FAULTS)}" if str(e).startswith("unknown fault") else ""
        print(f"rank {rank}: error: {e}{extra}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
