"""The comparator's optional compiled kernel: all float metrics of a chunk in one pass.

numpy needs ~25 passes over a chunk for the float metrics; `float_metrics.c` does them in one,
vectorised, so comparing runs near the speed of reading. It is built on first use with the
system C compiler (`$CC`, else `cc`) into the tensordiff cache, keyed by the source, the flags,
the compiler and the CPU, and loaded with ctypes (calls release the GIL, so worker threads run
in parallel). With no compiler, or `TENSORDIFF_NATIVE=0`, `float_kernel()` is None and the numpy
path in `metrics.py` (the reference semantics) runs instead; both give the same numbers. On a CPU
with AVX-512 F/BW/DQ the kernel's blocks run an intrinsics path (the build is -march=native on the
machine that runs it, so the compiler's feature macros are that CPU's); elsewhere, or with
`TENSORDIFF_NATIVE=generic`, the portable loop the compiler vectorises itself.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path

from tensordiff.errors import BadInput
from tensordiff.cache import cache_root

SOURCE = Path(__file__).with_name("float_metrics.c")
# -mprefer-vector-width=512: where the CPU has 512-bit vectors (-march=native is this machine's, and
# the build cache is keyed by the CPU), the kernel's ~50 vector ops per element group halve; on a
# CPU without them the option is a no-op. Measured 1.9x on the kernel alone (bench/compare_throughput.py).
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp-simd", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC"]

_lock = threading.Lock()
_kernel: object = None  # None: not tried yet; False: unavailable
status = "not loaded"  # why the native kernel is or is not in use (the benchmark reports it)


def _cpu_key() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _build() -> Path:
    cc = os.environ.get("CC") or "cc"
    path = shutil.which(cc)
    if not path:
        raise OSError(f"no C compiler ({cc})")
    # the compiler by its resolved file and stamp: no subprocess on the cached path
    real = os.path.realpath(path)
    st = os.stat(real)
    stamp = f"{real}:{st.st_size}:{st.st_mtime_ns}"
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), stamp, _cpu_key()]).encode()).hexdigest()[:16]
    out = cache_root() / "native" / f"float_metrics-{key}.so"
    if out.is_file():
        return out
    import subprocess  # only to build: the cached path above spawns nothing and imports less
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        try:
            r = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120)
        except subprocess.SubprocessError as e:  # a compiler that hangs: no kernel, the numpy path
            raise OSError(f"{cc} did not finish: {e}") from None
        if r.returncode:
            raise OSError(f"{cc} failed: {r.stderr.strip()[:300]}")
        os.replace(tmp, out)  # atomic: a concurrent process sees the old or the whole new file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


_lib = None  # the loaded library (float_kernel() loads it)


def set_generic(on: bool) -> bool:
    """Run the kernel's generic path (on=True) or its AVX-512 path where the CPU has one; returns
    whether the AVX-512 path now runs. Tests compare the two; `TENSORDIFF_NATIVE=generic` sets it
    for a whole run. Process-wide: not for use while a comparison runs."""
    global status
    if float_kernel() is None:
        return False
    wide = bool(_lib.td_set_generic(int(on)))
    status = "native" + (" (AVX-512)" if wide else " (generic)")
    return wide


def set_no_hist(on: bool) -> bool:
    """Benchmark only: the AVX-512 blocks skip the ULP histogram (every other statistic as
    always), so bench/compare_throughput.py can measure what the histogram costs. Returns whether
    that path runs (False without the kernel or AVX-512). Process-wide; never set in a comparison."""
    if float_kernel() is None:
        return False
    return bool(_lib.td_set_no_hist(int(on)))


def library():
    """The loaded ctypes library, or None (for tests of its other entry points)."""
    return _lib if float_kernel() is not None else None


_batch: list = [None]  # td_float_batch, loaded with the kernel
_cuts: list = [None]  # td_float_update_cuts, loaded with the kernel


def float_cuts():
    """The ctypes function `td_float_update_cuts`, or None when the kernel cannot be built here."""
    return _cuts[0] if float_kernel() is not None else None


def float_batch():
    """The ctypes function `td_float_batch`, or None when the kernel cannot be built here."""
    return _batch[0] if float_kernel() is not None else None


def float_kernel():
    """The ctypes function `td_float_update`, or None when it cannot be built here."""
    global _kernel, status
    if _kernel is None:
        with _lock:
            if _kernel is None:
                if os.environ.get("TENSORDIFF_NATIVE", "1") == "0":
                    _kernel, status = False, "numpy (native kernel disabled by TENSORDIFF_NATIVE=0)"
                elif sys.byteorder != "little":  # the kernel reads the dump's little-endian bytes as they are
                    _kernel, status = False, "numpy (native kernel needs a little-endian host)"
                else:
                    try:
                        lib = ctypes.CDLL(str(_build()))
                        f = lib.td_float_update
                        p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
                        f.argtypes = [p, ctypes.c_int, p, ctypes.c_int, i64, i64, f32, f32, f32, f32,
                                      p, i64, p, i64, i64, p, p]
                        f.restype = ctypes.c_int
                        global _lib
                        _lib = lib
                        c = lib.td_float_update_cuts  # a large tensor's percentiles by cuts (metrics.py)
                        c.argtypes = [p, ctypes.c_int, p, ctypes.c_int, i64, i64, f32, f32, f32, f32,
                                      i64, p, i64, i64, p, p, p, i64, p]
                        c.restype = ctypes.c_int
                        _cuts[0] = c
                        g = lib.td_float_batch  # many small tensors in one call (tensordiff/judge/batch.py)
                        g.argtypes = [i64, p, p, p, p, p, i64]
                        g.restype = ctypes.c_int
                        _batch[0] = g
                        wide = lib.td_set_generic(int(os.environ.get("TENSORDIFF_NATIVE") == "generic"))
                        _kernel, status = f, "native" + (" (AVX-512)" if wide else " (generic)")
                    except (OSError, BadInput) as e:  # BadInput: an unusable cache
                        _kernel, status = False, f"numpy (native kernel unavailable: {e})"
    return _kernel or None
