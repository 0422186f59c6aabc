"""A generic routed MoE: gate -> per-row biased top-k -> grouped experts + a shared expert.

The interface is the same for a text-only model and a vision-language one: `image_rows` is a
row-level bool mask ([R]) and `bias_vl` an optional second bias; rows flagged True rank experts
with `bias_vl`, the others with `bias`, all in one batch (the backend's `moe_route` selects per
row). A gate with one bias simply passes `bias_vl=None`.

Faults (off by default): `router-text-bias-for-images` ranks every row with `bias`;
`router-biased-weights` takes the mixture weights from the biased scores.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.errors import EngineInputError
from engine.deepseek_v41_flash.faults import ROUTER_BIASED_WEIGHTS, ROUTER_TEXT_BIAS_FOR_IMAGES


@dataclass(frozen=True)
class ExpertBank:
    """Experts stacked: w1, w3 [E, I, D]; w2 [E, D, I] (activation dtype)."""

    w1: torch.Tensor
    w3: torch.Tensor
    w2: torch.Tensor
    first: int = 0  # the id of expert 0 here: an expert-parallel rank holds experts first .. first+n-1

    @property
    def n(self) -> int:
        return self.w1.shape[0]


@dataclass(frozen=True)
class GateWeights:
    weight: torch.Tensor  # [E, D] fp32
    bias: torch.Tensor  # [E] fp32
    bias_vl: torch.Tensor | None  # [E] fp32


class MoE:
    def __init__(self, gate: GateWeights, experts: ExpertBank, shared: ExpertBank, *, topk: int,
                 route_scale: float, gate_temp: float, swiglu_limit: float, score_func: str,
                 norm_topk_prob: bool, backend, fault: str | None = None):
        if score_func != "sqrtsoftplus" or not norm_topk_prob or topk < 2:
            raise EngineInputError("the engine's MoE routes sqrt(softplus) scores normalised over top-k >= 2 only "
                                   f"(score_func={score_func!r}, norm_topk_prob={norm_topk_prob}, topk={topk})")
        self.gate, self.experts, self.shared = gate, experts, shared
        self.topk, self.route_scale, self.gate_temp = topk, route_scale, gate_temp
        self.limit = swiglu_limit
        self.backend = backend
        self.fault = fault

    def route(self, x: torch.Tensor, image_rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [R, D] -> (weights [R, k] fp32, ids [R, k] int64, best first)."""
        logits = self.backend.linear(x.float(), self.gate.weight, None) / self.gate_temp
        rows = None if self.fault == ROUTER_TEXT_BIAS_FOR_IMAGES else image_rows
        weights, ids = self.backend.moe_route(logits, self.gate.bias, self.gate.bias_vl, rows,
                                              self.topk, self.route_scale)
        if self.fault == ROUTER_BIASED_WEIGHTS:
            weights = self._mix(self._biased(logits, rows), ids)
        return weights, ids

    def _mix(self, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        w = scores.gather(-1, ids)
        return w / (w.sum(-1, keepdim=True) + 1e-20) * self.route_scale

    def weights_for(self, x: torch.Tensor, ids: torch.Tensor, image_rows: torch.Tensor | None) -> torch.Tensor:
        """The mixture weights of a GIVEN choice ids [R, k] (local error: the reference's choice,
        so the weights are judged on the same experts after a near-tie flip)."""
        logits = self.backend.linear(x.float(), self.gate.weight, None) / self.gate_temp
        if self.fault == ROUTER_BIASED_WEIGHTS:
            return self._mix(self._biased(logits, image_rows), ids)
        return self._mix(F.softplus(logits.float()).sqrt(), ids)

    def _biased(self, logits: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """sqrt(softplus) scores plus the per-row bias: the key the top-k ranks [R, E] fp32."""
        s = F.softplus(logits.float()).sqrt()
        b = self.gate.bias.expand_as(s)
        if self.gate.bias_vl is not None and rows is not None:
            b = torch.where(rows.view(-1, 1), self.gate.bias_vl.view(1, -1), b)
        return s + b

    def biased_scores(self, x: torch.Tensor, image_rows: torch.Tensor | None) -> torch.Tensor:
        """The scores that decided `route`'s choice for x [R, D] (recorded as `router.L.scores`, so a
        set that differs from the reference's can be told a near-tie or a wrong choice). Computed
        in torch whatever the backend: the kernel's own ranking key is not exposed."""
        logits = self.backend.linear(x.float(), self.gate.weight, None) / self.gate_temp
        rows = None if self.fault == ROUTER_TEXT_BIAS_FOR_IMAGES else image_rows
        return self._biased(logits, rows)

    def _expert(self, bank: ExpertBank, e: int, x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        gate = self.backend.linear(x, bank.w1[e], None).float()
        up = self.backend.linear(x, bank.w3[e], None).float()
        if self.limit > 0:
            gate = gate.clamp(max=self.limit)
            up = up.clamp(-self.limit, self.limit)
        h = F.silu(gate) * up
        if scale is not None:
            h = h * scale
        return self.backend.linear(h.to(x.dtype), bank.w2[e], None)

    def __call__(self, x: torch.Tensor, image_rows: torch.Tensor | None = None,
                 forced: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x: [R, D] -> (y [R, D] in x.dtype, weights [R, k], ids [R, k]). `forced` (local error
        only): (weights, ids) to mix with instead of routing, the reference's choice."""
        weights, ids = self.route(x, image_rows) if forced is None else forced
        r, k = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert, rows ascending
        counts = torch.bincount(flat, minlength=self.experts.n).tolist()
        row_of = order // k
        w_of = weights.reshape(-1)[order].unsqueeze(-1)
        y = torch.zeros(r, x.shape[1], dtype=torch.float32, device=x.device)
        at = 0
        for e, c in enumerate(counts):
            local = e - self.experts.first  # experts another rank holds add nothing here (expert parallel)
            if c and 0 <= local < self.experts.n:
                sel = row_of[at:at + c]
                y.index_add_(0, sel, self._expert(self.experts, local, x[sel], w_of[at:at + c]).float())
            at += c
        y += self._expert(self.shared, 0, x, None).float()
        return y.to(x.dtype), weights, ids
