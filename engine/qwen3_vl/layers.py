"""Elementwise pieces of the tower, in fp32 math, returned in the input dtype.

(The backend protocol has no LayerNorm or GELU kernel yet; these are plain torch.)
"""
from __future__ import annotations

import math

import torch

from ..errors import EngineInputError


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    mu = xf.mean(-1, keepdim=True)
    var = (xf - mu).pow(2).mean(-1, keepdim=True)  # biased, as LayerNorm
    y = (xf - mu) * torch.rsqrt(var + eps)
    return (y * weight.float() + bias.float()).to(x.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    y = 0.5 * xf * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (xf + 0.044715 * xf.pow(3))))
    return y.to(x.dtype)


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (0.5 * xf * (1.0 + torch.erf(xf / math.sqrt(2.0)))).to(x.dtype)


ACTIVATIONS = {"gelu_pytorch_tanh": gelu_tanh, "gelu_new": gelu_tanh, "gelu": gelu_erf}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise EngineInputError(f"vision hidden_act {name!r} is not supported ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]
