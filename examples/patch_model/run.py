"""The worked example: a reference PyTorch model, a different reimplementation, a contract file,
and tensordiff naming where they part.

    python examples/patch_model/run.py                        # exit 0: every boundary matches
    python examples/patch_model/run.py --bug transposed-grid  # exit 1: names `patches`

The reference is recorded with `tensordiff.tap` into a tensordiff dump (with the patch grid in
its run record, so the report can place rows on the picture); the reimplementation writes a plain
safetensors file under its own names; `tensordiff compare --contract contract.toml` compares them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if str(HERE.parents[1]) not in sys.path:  # run from a checkout without `pip install -e`
    sys.path.insert(1, str(HERE.parents[1]))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import reference  # noqa: E402
import reimplementation  # noqa: E402
import tensordiff  # noqa: E402
from tensordiff.commands.cli import main as tensordiff_main  # noqa: E402
from tensordiff.errors import BadInput  # noqa: E402
from tensordiff.pipeline.case import workspace  # noqa: E402

H, W = 24, 40  # a 3 x 5 patch grid: not square, so a transposed grid is not a relabelling


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bug", choices=reimplementation.BUGS, help="plant a bug in the reimplementation")
    ap.add_argument("--out", type=Path, help="keep the dumps here (a new directory; default: the last run's "
                                              "directory in the tensordiff cache, replaced by the next run)")
    ap.add_argument("--json", type=Path, help="also write the machine report here")
    args = ap.parse_args(argv)
    if args.out is not None and args.out.exists():
        print(f"run.py: error: {args.out} already exists; pick a new --out", file=sys.stderr)
        sys.exit(2)
    if args.out is not None:
        args.out.mkdir(parents=True)
        write_dumps(args.out, args.bug)
        out, kept = args.out, "kept for good"
    else:  # written under a staging name, then swapped into <cache>/last/example/patch_model/ in one step
        try:
            with workspace(None, "example", "patch_model") as ws:
                write_dumps(ws.path, args.bug)
        except BadInput as e:  # that directory is someone else's, or no cache directory can be made
            print(f"run.py: error: {e}", file=sys.stderr)
            sys.exit(2)
        out = ws.final if ws.replaced else ws.path
        kept = "the last run's, replaced by the next; --out DIR keeps them"
    print(f"dumps in {out} ({kept}): reference/ (tensordiff.tap), reimplementation.safetensors (plain)", flush=True)
    cmd = ["compare", str(out / "reference"), str(out / "reimplementation.safetensors"),
           "--contract", str(HERE / "contract.toml")]
    if args.json:
        cmd += ["--json", str(args.json)]
    tensordiff_main(cmd)


def write_dumps(out: Path, bug: str | None) -> None:
    """The reference's dump (through `tensordiff.tap`) and the reimplementation's plain file in `out`."""
    torch.manual_seed(0)
    grid = (H // reference.PATCH, W // reference.PATCH)
    model = reference.PatchModel(grid).eval()
    image = torch.rand(3, H, W)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "weights.safetensors"))

    with torch.no_grad():
        with tensordiff.Recorder(out / "reference", model="patch-model", producer={"name": "reference.py"},
                                 run={"inputs": {"grid": list(grid)}, "dtype": "float32"}) as rec, \
                tensordiff.tap(model, reference.TAPS, rec):
            model(image)
        reimplementation.run(image, str(out / "weights.safetensors"), str(out / "reimplementation.safetensors"),
                             bug=bug)


if __name__ == "__main__":
    main()
