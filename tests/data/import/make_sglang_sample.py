"""Writes sglang/tp1/ and sglang/tp2/ beside this script: SGLang dumper files (the layout of
`sglang.srt.debug_utils.dumper`, written by examples/sglang_dump/sglang_style.py) of one MLP
layer run as a prompt of 3 tokens and one decode step, on one rank (tp1) and tensor-parallel over
two ranks (tp2), with the same weights. The dumper's files are `torch.save` pickles, so the sample
is not kept in git: the tests, the README and `--help` make it first (it is written once, into a
temporary folder renamed into place, so concurrent runs never see half of it):
    python tests/data/import/make_sglang_sample.py

Per step, every rank dumps (`layer_id=0` as a tag, dims as the dumper's `dims=`):
    rids                  the request ids (a list of strings: not a tensor)
    input_ids             [t]                  no dims (the same on every rank)
    embed                 [t, h]      "t h"
    mlp_up                [t, i/tp]   "t i[tp]"            column-parallel: rank r holds columns r
    mlp_down_partial      [t, h]      "t h[tp:partial]"    row-parallel: the sum over ranks is the output
    mlp_out               [t, h]      "t h # tp:replicated" after the all-reduce
"""
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "examples" / "sglang_dump"))
from sglang_style import Dumper  # noqa: E402

VOCAB, H, I, STEPS = 11, 4, 6, ([2, 7, 5], [9])


def weights():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(VOCAB, H, generator=g), torch.randn(I, H, generator=g) / 2, torch.randn(H, I, generator=g) / 2)


def run(root: Path, tp: int) -> None:
    emb, w_up, w_down = weights()
    dumpers = [Dumper(root, "exp", rank=r, world_size=tp, tp_rank=r, tp_size=tp) for r in range(tp)]
    for ids in STEPS:
        ids = torch.tensor(ids)
        x = emb[ids]
        partials = []
        for r, d in enumerate(dumpers):
            cols = slice(r * I // tp, (r + 1) * I // tp)
            d.dump("rids", ["req-0"])
            d.dump("input_ids", ids)
            d.dump("embed", x, dims="t h")
            up = x @ w_up[cols].T
            d.dump("mlp_up", up, dims="t i[tp]", layer_id=0)
            partials.append(F.silu(up) @ w_down[:, cols].T)
            d.dump("mlp_down_partial", partials[-1], dims="t h[tp:partial]", layer_id=0)
        out = torch.stack(partials).sum(0)  # the all-reduce
        for d in dumpers:
            d.dump("mlp_out", out, dims="t h # tp:replicated", layer_id=0)
            d.step()


def ensure(target: Path = HERE / "sglang") -> Path:
    """The sample at `target`, written if it is not there yet."""
    if target.is_dir():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".sglang-", dir=target.parent))
    try:
        for tp in (1, 2):
            run(tmp / f"tp{tp}", tp)
        tmp.rename(target)
    except OSError:
        if not target.is_dir():  # another run's rename won only if it finished
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(ensure())
