"""Compiled HIP kernels behind the `Backend` protocol (`--backend hip`).

The kernel sources live in `hip/` at the repository root, one `.hip` file per family. On a
ROCm torch the extension loader hands them to hipcc; on a CUDA torch it compiles the one-line
`.cu` shims in `hip/cuda/`, which include the same `.hip` files, with nvcc. The module is built
once per source digest (and torch build) and cached by torch's extension loader.

No GPU, or a CPU-only torch: `HipBackend()` raises EngineInputError saying so (exit 2 at the
CLI). The engine never falls back to the torch ops behind the user's back.

Semantics are those of `torch_ops.TorchBackend`; `linear` stays on the vendor GEMM and
`patch_linear` runs the tiled HIP kernel that needs K % 16 == 0 (the reason for the 588 -> 592
padding at preparation), unless the backend is built with `patch_gemm="vendor"`.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.deepseek_v41_flash.faults import ROUTER_TEXT_BIAS_FOR_IMAGES

from ..errors import EngineInputError

HIP_DIR = Path(__file__).resolve().parents[2] / "hip"
FAMILIES = ("rms_norm", "rope", "patch_gemm", "aligner_gather", "moe_route", "embed_scatter", "status")
KERNEL_FAULTS = {
    ROUTER_TEXT_BIAS_FOR_IMAGES: "the router kernel ranks image rows with the text bias instead of bias_vl",
}
_FLOATS = (torch.float32, torch.bfloat16)
_MAX_TOPK = 8
_MAX_EXPERTS = 1024
# the router kernel's named routes, as hip/moe_route.hip codes them (threads_per_row < 0); 0 is its
# default (default_route: filter_redux, from a dtype's row count on filter_g16 (f32) / exact_bf16 (bf16)), 64 / 128 / 256 one row per block of that many threads. The codes are what the
# kernel dispatches on: a removed route's code stays unused, never reassigned (hip/README.md).
# filter / filter_redux: a fast bound on every expert, the exact score for the candidates only;
# filter_g16: the same, a row a group of 16 lanes
# exact_bf16: bf16 only (fp32 logits run filter_g16): exact keys from a table of the scores of bf16's
# values, filter_g16's steps on them, persistent blocks
ROUTER_ROUTES = {"wave": -1, "wave_lb": -2, "filter": -6, "filter_redux": -7, "filter_g16": -11, "exact_bf16": -13}
_ROUTER_BLOCK_THREADS = (64, 128, 256)

_lock = threading.Lock()
_module = None


def unavailable_reason() -> str | None:
    """Why the kernels cannot run here, or None."""
    if torch.version.cuda is None and torch.version.hip is None:
        return (f"torch {torch.__version__} is a CPU-only build; the hip backend needs a CUDA or ROCm "
                "build of torch and a GPU (use --backend torch)")
    if not torch.cuda.is_available():
        return "no GPU is visible to torch (torch.cuda.is_available() is False; use --backend torch)"
    if not (HIP_DIR / "bindings.cpp").is_file():
        return f"the kernel sources are not at {HIP_DIR} (run from a source checkout)"
    return None


def sources_digest() -> str:
    """Digest of every kernel source and header: a changed file gives a new module name, so a
    stale cached build is never loaded (the loader tracks only the files it is handed)."""
    h = hashlib.sha256()
    for p in sorted(HIP_DIR.rglob("*")):
        if p.is_file() and p.suffix in (".hip", ".h", ".cpp", ".cu"):
            h.update(str(p.relative_to(HIP_DIR)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def load_kernels(verbose: bool | None = None):
    """The compiled extension module (built on first use). Raises EngineInputError when the
    kernels cannot be built or run here."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        why = unavailable_reason()
        if why:
            raise EngineInputError(f"backend 'hip' is not available: {why}")
        from torch.utils.cpp_extension import load

        if verbose is None:
            verbose = os.environ.get("TENSORDIFF_HIP_VERBOSE") == "1"
        if torch.version.hip is not None:
            kernels = [HIP_DIR / f"{f}.hip" for f in FAMILIES]
        else:
            kernels = [HIP_DIR / "cuda" / f"{f}.cu" for f in FAMILIES]
        try:
            _module = load(
                name=f"tensordiff_hip_{sources_digest()[:12]}",
                sources=[str(HIP_DIR / "bindings.cpp"), *map(str, kernels)],
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3"],
                verbose=verbose,
            )
        except Exception as e:  # compiler, ninja or loader failure: say so, never fall back
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise EngineInputError(
                f"backend 'hip': building the kernels failed: {first} "
                "(TENSORDIFF_HIP_VERBOSE=1 shows the compiler log)") from None
        return _module


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def _on_device(t: torch.Tensor):
    """Kernels launch on the current device: switch to the tensor's when they differ."""
    if t.device.index is None or t.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(t.device)


def _gpu(t: torch.Tensor, what: str) -> None:
    if t.device.type != "cuda":
        raise EngineInputError(f"backend 'hip' runs on the GPU, but {what} is on {t.device} (use --device cuda)")


def _float(t: torch.Tensor, what: str) -> None:
    if t.dtype not in _FLOATS:
        raise EngineInputError(f"backend 'hip': {what} is {t.dtype}; the kernels take float32 or bfloat16")


def _check_router_threads(router_threads) -> None:
    """A route the kernel has (by name, or 0 / 64 / 128 / 256), else one line saying which it has.
    Checked before anything is built, so a removed or misspelt route fails the same on any machine.
    A named route's negative code is refused as a number: the codes are the kernel's, not the user's."""
    if router_threads not in (0, *_ROUTER_BLOCK_THREADS, *ROUTER_ROUTES):
        raise EngineInputError(f"router_threads {router_threads!r} is not a router route: the routes are "
                               f"{', '.join(ROUTER_ROUTES)} (by name), 0 (the kernel's default route) or "
                               f"{', '.join(map(str, _ROUTER_BLOCK_THREADS))} (one row per block of that many "
                               "threads); removed routes are listed in hip/README.md")


class HipBackend:
    name = "hip"

    def __init__(self, faults=(), patch_gemm: str = "tiled", rope_access_bytes: int = 0,
                 router_threads: int | str = 0):
        unknown = set(faults) - set(KERNEL_FAULTS)
        if unknown:
            raise EngineInputError(f"unknown kernel fault(s) {sorted(unknown)} (known: {sorted(KERNEL_FAULTS)})")
        if patch_gemm not in ("tiled", "vendor"):
            raise EngineInputError(f"patch_gemm must be 'tiled' or 'vendor', not {patch_gemm!r}")
        if rope_access_bytes not in (0, 4, 8, 16):
            raise EngineInputError(f"rope_access_bytes must be 0 (widest), 4, 8 or 16, not {rope_access_bytes}")
        _check_router_threads(router_threads)
        self.router_threads = router_threads
        self._router_code = ROUTER_ROUTES.get(router_threads, router_threads)
        self.faults = frozenset(faults)
        self.patch_gemm = patch_gemm
        self.rope_access_bytes = rope_access_bytes
        self._k = load_kernels()

    def with_faults(self, faults) -> "HipBackend":
        """The same kernels with planted faults (see KERNEL_FAULTS)."""
        return HipBackend(faults, self.patch_gemm, self.rope_access_bytes, self.router_threads)

    def rms_norm(self, x, weight, eps):
        _gpu(x, "x")
        _float(x, "x")
        w = weight.to(device=x.device, dtype=torch.float32).contiguous()
        with _on_device(x):
            return self._k.rms_norm(x.contiguous(), w, float(eps), _stream(x))

    def rope_rotate_half(self, x, cos, sin):
        _gpu(x, "x")
        _float(x, "x")
        if x.dim() < 3:
            raise EngineInputError(f"rope: x must be [..., N, H, head_dim], got {tuple(x.shape)}")
        n_pos, heads, hd = x.shape[-3:]
        width = cos.shape[-1]
        if width not in (hd, hd // 2) or hd % 2 or cos.numel() != n_pos * width or sin.shape != cos.shape:
            raise EngineInputError(f"rope: cos/sin {tuple(cos.shape)} do not fit x {tuple(x.shape)} "
                                   "([N, head_dim/2] blocked or [N, head_dim] cat(rot, rot))")
        c = cos.to(device=x.device, dtype=torch.float32).reshape(n_pos, width).contiguous()
        s = sin.to(device=x.device, dtype=torch.float32).reshape(n_pos, width).contiguous()
        with _on_device(x):
            return self._k.rope_rotate_half(x.contiguous(), c, s, n_pos, heads, self.rope_access_bytes, _stream(x))

    def linear(self, x, weight, bias):
        return F.linear(x, weight, bias)

    def patch_linear(self, x, weight, bias):
        k = x.shape[-1]
        if k % 16 or weight.shape[-1] != k:
            raise ValueError(f"patch_linear: operands must be prepared (K % 16 == 0, pad_columns): "
                             f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
        if self.patch_gemm == "vendor":
            return F.linear(x, weight, bias)
        _gpu(x, "x")
        _float(x, "x")
        if weight.dtype != x.dtype:
            raise EngineInputError(f"patch_linear: x is {x.dtype}, weight {weight.dtype}")
        b = None if bias is None else bias.to(device=x.device, dtype=torch.float32).contiguous()
        x2 = x.reshape(-1, k).contiguous()
        with _on_device(x):
            y = self._k.patch_gemm(x2, weight.contiguous(), b, _stream(x))
        return y.reshape(*x.shape[:-1], weight.shape[0])

    def aligner_gather(self, x, index):
        _gpu(x, "x")
        if x.dim() != 2 or index.dim() != 2 or index.shape[1] != 9:
            raise EngineInputError(f"aligner_gather: x [n, C] and index [T, 9], got {tuple(x.shape)}, {tuple(index.shape)}")
        if x.element_size() not in (2, 4):
            raise EngineInputError(f"aligner_gather: {x.dtype} is not a 2- or 4-byte type")
        idx = index.to(device=x.device, dtype=torch.int32).contiguous()
        with _on_device(x):
            return self._k.aligner_gather(x.contiguous(), idx, _stream(x))

    def moe_route(self, logits, bias, bias_vl, image_rows, topk, route_scale):
        _gpu(logits, "logits")
        _float(logits, "logits")
        if logits.dim() != 2:
            raise EngineInputError(f"moe_route: logits must be [rows, experts], got {tuple(logits.shape)}")
        experts = logits.shape[1]
        if not 1 <= topk <= min(_MAX_TOPK, experts) or experts > _MAX_EXPERTS:
            raise EngineInputError(f"moe_route: the kernel takes top-k 1..{_MAX_TOPK} (<= experts) and at most "
                                   f"{_MAX_EXPERTS} experts; got k={topk}, {experts} experts")
        dev = logits.device
        b = bias.to(device=dev, dtype=torch.float32).contiguous()
        bvl = img = None
        if bias_vl is not None and image_rows is not None:
            bvl = bias_vl.to(device=dev, dtype=torch.float32).contiguous()
            img = image_rows.to(device=dev, dtype=torch.bool).contiguous().view(torch.uint8)
        fault = ROUTER_TEXT_BIAS_FOR_IMAGES in self.faults
        with _on_device(logits):
            w, ids = self._k.moe_route(logits.contiguous(), b, bvl, img, int(topk), float(route_scale), fault,
                                       self._router_code, _stream(logits))
        return w, ids

    def router_score_bound_violations(self, start: int = 0, count: int = 1 << 32,
                                      margin_scale: float = 1.0) -> tuple[int, int]:
        """The filter routes' bound on sqrt(softplus(l)) held against the exact score for the fp32 bit
        patterns start .. start + count - 1 (all of them by default), on the current GPU: (how many
        fall outside it, the bit pattern of one of them). margin_scale < 1 narrows the routes'
        margin: how a test shows the check has teeth."""
        if not (0 <= start and 0 < count and start + count <= 1 << 32):
            raise EngineInputError(f"bit patterns {start}..{start + count - 1} are not within 0..2^32-1")
        dev = torch.device("cuda", torch.cuda.current_device())
        bad, example = self._k.moe_route_score_bound(int(start), int(count), float(margin_scale), 1 << 20,
                                                     torch.cuda.current_stream(dev).cuda_stream)
        n = int(bad.sum())
        return n, (int(example[bad.argmax()]) & 0xFFFFFFFF) if n else 0

    def router_table_mismatches(self) -> tuple[int, int]:
        """exact_bf16's table of scores against the exact score for every bf16 bit pattern, on the
        current GPU: (how many differ bit for bit, the bits of one of them)."""
        dev = torch.device("cuda", torch.cuda.current_device())
        bad, example = self._k.moe_route_table_check(torch.cuda.current_stream(dev).cuda_stream)
        n = int(bad.sum())
        return n, (int(example[bad.argmax()]) & 0xFFFF) if n else 0

    def embed_scatter(self, emb, rows, src):
        _gpu(emb, "emb")
        _float(emb, "emb")
        _float(src, "src")
        if not emb.is_contiguous() or emb.dim() != 2:
            raise EngineInputError("embed_scatter: emb must be a contiguous [n, d] tensor (written in place)")
        r = rows.to(device=emb.device, dtype=torch.int64).contiguous()
        s = src.to(device=emb.device).contiguous()
        with _on_device(emb):
            self._k.embed_scatter(emb, r, s, _stream(emb))
        return emb
