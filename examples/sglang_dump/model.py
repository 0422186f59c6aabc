"""A tiny decoder laid out like SGLang's Llama (`model.layers.N.self_attn.qkv_proj`,
`mlp.gate_up_proj`, `mlp.act_fn`, ...), with a KV cache, so a prompt and then decode steps run
the way a serving engine runs them (one new token a step, against the cached keys and values).

`bug` plants one fault in the copy a "server" runs:
- `act-swap`: layer 1's SiluAndMul takes the halves of gate_up_proj's output the wrong way round
  (silu(up) * gate), prompt and decode alike;
- `stale-kv`: layer 1's attention, at decode, attends to the cache without the new token's own
  key and value (appended after attending): the prompt is right, every decode step is wrong.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BUGS = ("act-swap", "stale-kv")
VOCAB, HIDDEN, HEADS, INTER, LAYERS = 64, 32, 4, 64, 2


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SiluAndMul(nn.Module):
    def __init__(self, swapped: bool = False):
        super().__init__()
        self.swapped = swapped

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        if self.swapped:
            gate, up = up, gate
        return F.silu(gate) * up


class MLP(nn.Module):
    def __init__(self, swapped: bool = False):
        super().__init__()
        self.gate_up_proj = nn.Linear(HIDDEN, 2 * INTER, bias=False)
        self.act_fn = SiluAndMul(swapped)
        self.down_proj = nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Attention(nn.Module):
    def __init__(self, stale: bool = False):
        super().__init__()
        self.qkv_proj = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.stale = stale
        self.k = self.v = None

    def forward(self, positions, hidden_states):
        t = hidden_states.shape[0]
        q, k, v = (x.view(t, HEADS, -1).transpose(0, 1) for x in self.qkv_proj(hidden_states).chunk(3, dim=-1))
        decode = self.k is not None
        if decode and self.stale:  # the bug: attend first, append the new token's key and value after
            ks, vs = self.k, self.v
        else:
            ks = k if self.k is None else torch.cat([self.k, k], dim=1)
            vs = v if self.v is None else torch.cat([self.v, v], dim=1)
        out = F.scaled_dot_product_attention(q, ks, vs, is_causal=not decode)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=1)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=1)
        return self.o_proj(out.transpose(0, 1).reshape(t, HIDDEN))


class DecoderLayer(nn.Module):
    def __init__(self, bug: str | None = None, planted: bool = False):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention(stale=planted and bug == "stale-kv")
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLP(swapped=planted and bug == "act-swap")

    def forward(self, positions, hidden_states):
        h = hidden_states + self.self_attn(positions, self.input_layernorm(hidden_states))
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, bug: str | None = None):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(DecoderLayer(bug, planted=(i == 1)) for i in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)

    def forward(self, input_ids, positions):
        h = self.embed_tokens(input_ids) + 0.1 * torch.sin(positions[:, None].float())
        for layer in self.layers:
            h = layer(positions, h)
        return self.norm(h)


class ForCausalLM(nn.Module):
    def __init__(self, bug: str | None = None):
        super().__init__()
        self.model = Model(bug)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids, positions):
        return self.lm_head(self.model(input_ids, positions))

    def reset(self) -> None:
        for layer in self.model.layers:
            layer.self_attn.k = layer.self_attn.v = None


def build(seed: int, bug: str | None = None) -> ForCausalLM:
    torch.manual_seed(seed)
    return ForCausalLM(bug).eval()
