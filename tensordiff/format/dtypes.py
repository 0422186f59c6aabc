"""Element types as the dump format names them, and how they live in numpy.

numpy has no bfloat16: bf16 is kept as its raw uint16 bit pattern and widened to float32 by
a 16-bit shift, which is exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # manifest spelling, e.g. "bfloat16"
    st: str  # safetensors header spelling, e.g. "BF16"
    storage: np.dtype  # how the raw bytes are held in numpy (little-endian)
    kind: str  # "float", "int" or "bool"
    bits_mantissa: int = 0  # explicit mantissa bits; unit roundoff is 2**-(bits+1)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    @property
    def unit_roundoff(self) -> float:
        return 2.0 ** -(self.bits_mantissa + 1)


_ALL = [
    DType("float64", "F64", np.dtype("<f8"), "float", 52),
    DType("float32", "F32", np.dtype("<f4"), "float", 23),
    DType("float16", "F16", np.dtype("<f2"), "float", 10),
    DType("bfloat16", "BF16", np.dtype("<u2"), "float", 7),
    DType("int64", "I64", np.dtype("<i8"), "int"),
    DType("int32", "I32", np.dtype("<i4"), "int"),
    DType("int16", "I16", np.dtype("<i2"), "int"),
    DType("int8", "I8", np.dtype("i1"), "int"),
    DType("uint8", "U8", np.dtype("u1"), "int"),
    DType("bool", "BOOL", np.dtype("?"), "bool"),
]
BY_NAME = {d.name: d for d in _ALL}
BY_ST = {d.st: d for d in _ALL}


def by_name(name: str) -> DType:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown dtype {name!r} (known: {', '.join(BY_NAME)})") from None


def to_float64(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Widen stored elements to float64 for metric arithmetic (exact for every float type here)."""
    if dtype.name == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


def narrower(a: DType, b: DType) -> DType:
    """The float type with fewer mantissa bits: its rounding sets tolerance and ULP unit."""
    return a if a.bits_mantissa <= b.bits_mantissa else b
