"""Worked example: an SGLang dump compared with a reference dump of the same model, the layer
that goes wrong named.

    python examples/sglang_dump/run.py                   # exit 0: every boundary matches
    python examples/sglang_dump/run.py --bug act-swap    # exit 1: names model.layers.1.mlp.act_fn
    python examples/sglang_dump/run.py --bug stale-kv    # exit 1: names layer 1's attention, at decode step 1

A tiny decoder (model.py) runs a prompt and two decode steps twice: once as the reference, once
as the "server" (the same weights, fed the reference's tokens, with `--bug` planted in layer 1).
Each run is dumped the way SGLang's dumper does in its non-intrusive mode (sglang_style.py:
`non_intrusive__model.layers.1.mlp.act_fn.output`, one .pt file per value, a step per forward).
Then, as you would with dumps from a real SGLang server:

    tensordiff import sglang DUMPS/reference --out reference
    tensordiff import sglang DUMPS/server --out server
    tensordiff compare reference server

The dumps go to a temporary folder removed at the end, unless --out keeps them.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # leave nothing behind in the checkout (no __pycache__ beside the example)
sys.path.insert(0, str(HERE))
if str(HERE.parents[1]) not in sys.path:  # run from a checkout without `pip install -e`
    sys.path.insert(1, str(HERE.parents[1]))

import torch  # noqa: E402

import model as tiny  # noqa: E402
from sglang_style import Dumper  # noqa: E402
from tensordiff.commands.cli import main as tensordiff_main  # noqa: E402

PROMPT = [3, 17, 42, 9, 25]
DECODE_STEPS = 2


def generate(m: tiny.ForCausalLM, dumper: Dumper, feed: list[int] | None = None) -> list[int]:
    """The prompt, then DECODE_STEPS steps of one token each, every forward dumped as one step.
    `feed`: the tokens to decode (the reference's), else this model's own greedy choices."""
    m.reset()
    ids, tokens = torch.tensor(PROMPT), []
    with torch.no_grad(), dumper.non_intrusive(m):
        for k in range(DECODE_STEPS + 1):
            start = len(PROMPT) + k - len(ids)
            logits = m(ids, torch.arange(start, start + len(ids)))
            dumper.step()
            tokens.append(int(logits[-1].argmax()) if feed is None else feed[k])
            ids = torch.tensor(tokens[-1:])
    return tokens


def tensordiff(*args) -> int:
    print("$ tensordiff " + " ".join(str(a) for a in args), flush=True)
    try:
        tensordiff_main([str(a) for a in args])
    except SystemExit as e:
        return e.code or 0
    return 0


def run(work: Path, bug: str | None, json_path: Path | None) -> int:
    reference = tiny.build(seed=0)
    server = tiny.build(seed=0, bug=bug)  # the same weights; the bug changes code, not parameters
    tokens = generate(reference, Dumper(work / "sglang" / "reference", "exp"))
    generate(server, Dumper(work / "sglang" / "server", "exp"), feed=tokens)
    for side in ("reference", "server"):
        code = tensordiff("import", "sglang", work / "sglang" / side, "--out", work / side)
        if code:
            return code
    cmd = ["compare", work / "reference", work / "server"] + (["--json", json_path] if json_path else [])
    return tensordiff(*cmd)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bug", choices=tiny.BUGS, help="plant a bug in layer 1 of the server's copy")
    ap.add_argument("--out", type=Path, help="keep the dumps here (a new directory; default: a temporary one, removed)")
    ap.add_argument("--json", type=Path, help="also write the machine report here")
    args = ap.parse_args(argv)
    if args.out is not None:
        if args.out.exists():
            print(f"run.py: error: {args.out} already exists; pick a new --out", file=sys.stderr)
            sys.exit(2)
        args.out.mkdir(parents=True)
        sys.exit(run(args.out, args.bug, args.json))
    with tempfile.TemporaryDirectory(prefix="tensordiff-sglang-example-") as work:
        code = run(Path(work), args.bug, args.json)
    print("(the dumps were in a temporary folder, now removed; --out DIR keeps them)")
    sys.exit(code)


if __name__ == "__main__":
    main()
