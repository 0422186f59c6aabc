"""bench/kernels.py on the CPU: the router cases cover every named route at both sizes and both
dtypes (the one GPU run must measure them all), `router_best` names the fastest per size, and an
`--only` that would measure nothing (a removed route among them) is one line and exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import kernels as K
from engine.backend.hip_ops import ROUTER_ROUTES
from tests.hip.removed_routes import removed_router_routes

BENCH = Path(K.__file__).resolve()


def test_every_route_is_measured_at_both_sizes_and_dtypes():
    names = {c[0] for c in K.cases(torch.Generator())}
    # a bf16-only route (exact_bf16: on fp32 it runs filter_g16) is measured in bf16 alone
    dtypes = {r: ("bf16",) if r in K.BF16_ONLY_ROUTES else ("f32", "bf16") for r in ROUTER_ROUTES}
    want = {f"moe_route/{t}/{rows}rows@{r}" for r in ROUTER_ROUTES for rows in (1024, 65536) for t in dtypes[r]}
    assert want <= names and len(want) == 2 * sum(map(len, dtypes.values()))
    assert not any(n.startswith("moe_route/f32/") and n.endswith(tuple(f"@{r}" for r in K.BF16_ONLY_ROUTES))
                   for n in names)
    assert set(K.SWEEP_ROUTES) >= set(ROUTER_ROUTES) - {"wave", "wave_lb"}  # every filter-like route swept


def test_router_best_is_the_fastest_route_per_size():
    rows = [{"kernel": "moe_route/f32/65536rows@wave", "hip_us": 266.0},
            {"kernel": "moe_route/f32/65536rows@wave_lb", "hip_us": 388.0},
            {"kernel": "moe_route/bf16/65536rows@wave_lb", "hip_us": 200.0},
            {"kernel": "moe_route/bf16/65536rows@wave", "hip_us": 265.0},
            {"kernel": "moe_route/f32/65536rows", "hip_us": 1.0},  # the default row: not a route
            {"kernel": "moe_route/f32@64t", "hip_us": 0.5}]  # the block route: not named
    best = K.router_best(rows)
    assert set(best) == {"f32/65536rows", "bf16/65536rows"}
    assert best["f32/65536rows"]["route"] == "wave" and best["bf16/65536rows"]["route"] == "wave_lb"
    assert best["f32/65536rows"]["all_us"] == {"wave": 266.0, "wave_lb": 388.0}


@pytest.mark.parametrize("name", [n for n, _ in removed_router_routes()])
def test_a_removed_route_asked_for_is_refused_by_name(name):
    why = K.only_refused(f"moe_route/f32/65536rows@{name}")
    assert why and "\n" not in why
    assert f"{name!r} is not a router route (routes: {', '.join(ROUTER_ROUTES)};" in why
    assert K.only_refused(f"@{name}") == why.replace(f"'moe_route/f32/65536rows@{name}'", f"'@{name}'")


def test_only_that_matches_nothing_is_refused_and_every_case_is_not():
    assert "matches no kernel case" in K.only_refused("no-such-kernel")
    assert "matches no kernel case" in K.only_refused("moe_route/f32@32t")  # a block width it has not
    for name in [c[0] for c in K.cases(torch.Generator())] + [None, "", "moe_route", "@wave_lb", "rms_norm"]:
        assert K.only_refused(name) is None, name


def test_the_cli_says_one_line_and_exits_2_for_a_removed_route():
    name = removed_router_routes()[0][0]
    r = subprocess.run([sys.executable, str(BENCH), "--only", f"moe_route/bf16/1024rows@{name}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"bench/kernels.py: --only 'moe_route/bf16/1024rows@{name}': {name!r} is not a router route")


def test_router_agreement_tells_a_route_that_computes_something_else():
    from engine.backend.torch_ops import TorchBackend

    class Wrong(TorchBackend):  # the top-k in reverse order: the same experts, a wrong ranking
        def moe_route(self, *args):
            w, ids = super().moe_route(*args)
            return w.flip(-1), ids.flip(-1)

    g = torch.Generator().manual_seed(0)
    a = (torch.randn(64, 384, generator=g) * 2, torch.randn(384, generator=g), torch.randn(384, generator=g),
         torch.arange(64) % 2 == 1)
    call = lambda be, a: be.moe_route(a[0], a[1], a[2], a[3], 6, 1.5)  # noqa: E731
    ref = TorchBackend()
    assert K.router_agreement(call, ref, ref, ref, a) == {
        "rows_differing_from_torch": 0, "max_weight_diff_vs_torch": 0.0, "bitwise_equal_wave_route": True}
    bad = K.router_agreement(call, Wrong(), ref, ref, a)
    assert bad["rows_differing_from_torch"] == 64 and not bad["bitwise_equal_wave_route"]
