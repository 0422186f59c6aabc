"""The oracle's language half: transformers' own `Qwen3VLForConditionalGeneration`, hooked.

Nothing of the decoder is re-typed. The boundaries are read off transformers' modules through
tensordiff's generic route (`tensordiff.tap`), as the vision half is (hooks.py):
  - `embeddings`: the `inputs_embeds` the text model receives (after `masked_scatter` put the
    merger rows on the `<|image_pad|>` rows), a forward pre-hook on `language_model`;
  - `text_rope.cos` / `.sin`: `rotary_emb`'s output (interleaved M-RoPE, shared by every layer);
  - `hidden.L`: each decoder layer's output;
  - `deepstack_add.L`: what `_deepstack_process` returns after layer L (the text model calls it
    for L < len(deepstack)), a `@return` tap point: the method is wrapped on the instance, its body
    runs unchanged;
  - `logits` (prefill) and `logits.step.K` (decode step K).
Decode is transformers' own incremental path: its KV cache, and decode positions from the cached
`rope_deltas` (`compute_3d_position_ids`). Greedy; a generated vision special token
(`<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`) stops generation, as the
engine does (it would need a picture the prompt never had).
"""
from __future__ import annotations

from pathlib import Path

import torch

from tensordiff.format.capture import MemoryRecorder
from tensordiff.errors import BadInput
from tensordiff.format.taps import tap

from oracle import shards


def build(cfg, ckpt: Path, dtype: torch.dtype, device: str = "cpu", attn: str = "sdpa"):
    """The whole model, every tensor loaded strictly from the checkpoint (a tied head is the
    embedding table, as from_pretrained ties it)."""
    from transformers import Qwen3VLForConditionalGeneration

    cfg._attn_implementation = attn
    cfg.vision_config._attn_implementation = attn
    cfg.text_config._attn_implementation = attn
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(cfg)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    stored_names = set(shards.weight_map(ckpt))
    missing_text = [k for k in expected if k.startswith("model.language_model.") and k not in stored_names]
    if missing_text:
        raise BadInput(f"{ckpt} has no text model weights (e.g. {missing_text[0]}): the language path needs them")
    unexpected = sorted(stored_names - set(expected))
    if unexpected:
        raise BadInput(f"{ckpt}: tensors that do not fit Qwen3VLForConditionalGeneration ({unexpected[:3]})")
    stored = shards.load(ckpt, list(expected), expected, what="Qwen3-VL")
    state = {k: t.to(dtype) for k, t in stored.items()}
    if tied:
        state["lm_head.weight"] = state["model.language_model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    # non-persistent buffers (both RoPE inverse-frequency tables) were created on meta: rebuild
    # them in fp32, as a from_pretrained load keeps them
    rot = model.model.visual.rotary_pos_emb
    inv, _ = rot.compute_axial_rope_parameters(rot.config)
    rot.inv_freq, rot.original_inv_freq = inv, inv.clone()
    trot = model.model.language_model.rotary_emb
    tinv, _ = trot.compute_default_rope_parameters(trot.config)
    trot.inv_freq, trot.original_inv_freq = tinv, tinv.clone()
    for name, buf in model.named_buffers():
        assert buf.device.type != "meta", f"buffer {name} was not materialised"
    return model.to(device=device).eval()


def points(text_model) -> dict[str, str]:
    """Boundary tensor name -> tap point on the text model (`tensordiff.tap` syntax)."""
    out = {"embeddings": "@input[inputs_embeds]", "text_rope.cos": "rotary_emb[0]", "text_rope.sin": "rotary_emb[1]"}
    out.update({f"hidden.{i}": f"layers.{i}" for i in range(len(text_model.layers))})
    return out


class TextTaps:
    """The text model tapped through `tensordiff.tap`; `tensors` fills during prefill only
    (`prefill = False` pauses both taps for decode). Tensors are batch element 0."""

    def __init__(self, text_model):
        self._rec = MemoryRecorder()
        self._taps = (tap(text_model, points(text_model), self._rec),
                      # called once per injection layer: every_call names them deepstack_add.0, .1, ...
                      tap(text_model, {"deepstack_add": "_deepstack_process@return"}, self._rec, every_call=True))

    @property
    def prefill(self) -> bool:
        return self._taps[0].enabled

    @prefill.setter
    def prefill(self, on: bool) -> None:
        for t in self._taps:
            t.enabled = on

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self._rec.tensors.items()}

    def close(self):
        for t in self._taps:
            t.close()


def stop_ids(cfg) -> set[int]:
    return {cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.image_token_id, cfg.video_token_id}


@torch.inference_mode()
def run(model, cfg, ids: torch.Tensor, mm_types: torch.Tensor, pixel_values, grid_thw, n_images: int,
        decode: int, device: str):
    """-> (prefill taps {name: tensor}, prefill logits [S, V], [logits of step 1..], generated ids, stop)."""
    taps = TextTaps(model.model.language_model)
    try:
        out = model(input_ids=ids.to(device), mm_token_type_ids=mm_types.to(device),
                    pixel_values=pixel_values.repeat(n_images, 1).to(device),
                    image_grid_thw=grid_thw.repeat(n_images, 1).to(device), use_cache=True)
        taps.prefill = False
        tensors = dict(taps.tensors)
        logits = out.logits[0]
        steps, past = [], out.past_key_values
        nxt = int(logits[-1].argmax())
        generated, stop = [nxt], "steps"
        for _ in range(decode):
            if nxt in stop_ids(cfg):
                stop = "vision-token"
                break
            o = model(input_ids=torch.tensor([[nxt]], device=device), past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(o.logits[0])
            nxt = int(o.logits[0, -1].argmax())
            generated.append(nxt)
        else:
            if nxt in stop_ids(cfg):
                stop = "vision-token"
    finally:
        taps.close()
    return tensors, logits, steps, generated, stop
