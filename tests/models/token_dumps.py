"""Dumps of a generated token and the logits around it, for the token tie rule's tests (both
language contracts judge `token.step.K` alike: tensordiff/models/decode_tokens.py)."""
from __future__ import annotations

import torch

from tensordiff.format.capture import Recorder


def token_dumps(tmp_path, cand_margin: float, floor_err: float = 0.05, cand_token=None, lead=0.02, width=4096,
                worst_row_err: float = 0.0, model: str = "deepseek-v4.1-flash"):
    """Three dumps (reference fp32, floor run and candidate bf16) of prompt logits [4, width], the
    token fed to step 1 and step 1's logits. The reference leads token 5 over token 9 by `lead`;
    the floor run errs by `floor_err` (max |F - R| over the row); the candidate's row leads 9
    over 5 by `cand_margin` and feeds `cand_token` (its argmax by default), its step 1 therefore
    another token's logits entirely; the floor run's prompt row 0 errs by `worst_row_err` more;
    another token's logits entirely. (Wide rows: two elements off are within the logits' own rule
    there, as they are in a real vocabulary of 129k.)"""
    g = torch.Generator().manual_seed(0)
    lg = torch.randn(4, width, generator=g)
    lg[-1, 5], lg[-1, 9] = 6.0, 6.0 - lead
    step = torch.randn(1, width, generator=g)
    noise = lambda x, s: x + s * torch.randn(x.shape, generator=g).clamp(-1, 1)  # noqa: E731
    fl = noise(lg, floor_err)
    fl[0] = noise(fl[0], worst_row_err) if worst_row_err else fl[0]
    fl[-1, 5], fl[-1, 9] = 6.0 + floor_err, 6.0 - lead - floor_err
    cl = noise(lg, floor_err)
    cl[-1, 5], cl[-1, 9] = 6.0, 6.0 + cand_margin
    tok = int(cl[-1].argmax()) if cand_token is None else cand_token
    out = []
    for name, logits, t, s, dt in (("ref", lg, 5, step, "float32"), ("floor", fl, 5, noise(step, floor_err), "bfloat16"),
                                   ("cand", cl, tok, torch.randn(1, width, generator=g), "bfloat16")):
        rec = Recorder(tmp_path / name, model=model, producer={"name": name}, run={"dtype": dt})
        rec.record("logits", logits)
        rec.record("token.step.1.ids", torch.tensor([[t]]), boundary="token.step.1")
        rec.record("token.step.1.scores", logits[-1:].clone(), boundary="token.step.1")
        rec.record("logits.step.1", s, boundary="logits.step.1")
        out.append(rec.close())
    return out
