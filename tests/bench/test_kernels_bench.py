"""bench/kernels.py on the CPU: the router cases cover every named route at both sizes and both
dtypes (the one GPU run must measure them all), and `router_best` names the fastest per size."""
from __future__ import annotations

import torch

from bench import kernels as K
from engine.backend.hip_ops import ROUTER_ROUTES


def test_every_route_is_measured_at_both_sizes_and_dtypes():
    names = {c[0] for c in K.cases(torch.Generator())}
    want = {f"moe_route/{t}/{rows}rows@{r}" for r in ROUTER_ROUTES for rows in (1024, 65536) for t in ("f32", "bf16")}
    assert want <= names and len(want) == 4 * len(ROUTER_ROUTES)


def test_router_best_is_the_fastest_route_per_size():
    rows = [{"kernel": "moe_route/f32/65536rows@wave", "hip_us": 266.0},
            {"kernel": "moe_route/f32/65536rows@group16", "hip_us": 388.0},
            {"kernel": "moe_route/bf16/65536rows@group16", "hip_us": 200.0},
            {"kernel": "moe_route/bf16/65536rows@wave", "hip_us": 265.0},
            {"kernel": "moe_route/f32/65536rows", "hip_us": 1.0},  # the default row: not a route
            {"kernel": "moe_route/f32@64t", "hip_us": 0.5}]  # the block route: not named
    best = K.router_best(rows)
    assert set(best) == {"f32/65536rows", "bf16/65536rows"}
    assert best["f32/65536rows"]["route"] == "wave" and best["bf16/65536rows"]["route"] == "group16"
    assert best["f32/65536rows"]["all_us"] == {"wave": 266.0, "group16": 388.0}
