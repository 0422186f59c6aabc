"""The text model's M-RoPE: three-axis position ids -> one cos / sin table per token.

Each of the head_dim/2 frequencies f_j = theta^(-2j/head_dim) is driven by ONE of the three axes
(t, h, w). Qwen3-VL interleaves them: j % 3 == 1 -> h and j % 3 == 2 -> w for j < 3·section[1]
(resp. 3·section[2]), every other j -> t; so with [24, 20, 20] the height and width frequencies
are spread over the whole band instead of taking its lower-frequency end. Qwen2-VL's layout is
the chunked one (the first section[0] frequencies t, the next section[1] h, then w): the planted
fault `mrope-chunked`. Text tokens sit at the same position on all three axes, so the two layouts
differ on image rows only. The angles are computed in fp32 and the table is cat(freqs, freqs)
for rotate_half, cast to the activation dtype (as transformers casts it to the hidden dtype).
"""
from __future__ import annotations

import torch


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def axis_of_frequency(section: tuple[int, ...], interleaved: bool = True) -> torch.Tensor:
    """[head_dim/2] int64: which position axis (0 t, 1 h, 2 w) drives each frequency."""
    n = sum(section)
    axis = torch.zeros(n, dtype=torch.int64)
    if interleaved:
        for a in (1, 2):
            axis[a:section[a] * 3:3] = a
    else:
        axis[section[0]:section[0] + section[1]] = 1
        axis[section[0] + section[1]:] = 2
    return axis


def mrope_tables(positions: torch.Tensor, head_dim: int, theta: float, section: tuple[int, ...],
                 interleaved: bool = True, dtype: torch.dtype = torch.float32):
    """positions [3, S] int -> cos, sin [S, head_dim] in `dtype`."""
    f = inv_freq(head_dim, theta).to(positions.device)
    axis = axis_of_frequency(section, interleaved).to(positions.device)
    pos = positions.float()[axis]  # [hd/2, S]: the axis each frequency reads
    freqs = (pos * f[:, None]).t()  # [S, hd/2]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
