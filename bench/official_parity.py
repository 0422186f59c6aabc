"""The oracle against the official DeepSeek V4.1 Flash code, tensor for tensor, bit for bit.

    python bench/official_parity.py --official DIR [--out OUT] [--image P ...] [--prompt TEXT]

DIR holds the official `inference/` files the user supplies (model.py, vision.py, engram.py,
image_processor.py and the documented CPU kernel file kernel_cpu.py, as vendored in the public
repository tenstorrent/tt-metal under models/demos/deepseek_v3_d_p/reference/deepseek_v41/);
this bench imports them from there as a package and never downloads anything. Nothing of them
is in this repository.

On `synthetic:tiny-fp8` (the official quantised layout as the release stores it: FP8 dense weights
with block scales, FP4 experts in int8 tensors, `wo_a` FP8 with its block scale, the FP8 Engram
table; converted on load as the official loader converts them) it runs

  - the official pipeline as the official code runs it: `prepare_vl_inputs` (tokens, per-image
    spans, image preprocessing), `Transformer.forward` in bf16 with the kernels' quantisation
    (the only mode the official code has), one prefill; and
  - our oracle (`oracle/deepseek_v41_flash`) in its default official numerics, `--dtype
    bfloat16` so that its vision half runs in bf16 as the official one does,

on the same prompt and images, and compares every tensor the oracle dumps: the vision boundaries
of every image, `embeddings`, and per layer `engram.L.gate`, `index.L.ids` / `index.L.scores`,
`attn.L`, `router.L.ids` / `router.L.weights` / `router.L.scores`, `hidden.L`, then `logits`.
The official tensors are read with forward hooks on the official modules and, for the three
values the official code keeps local (the Engram gate, the indexer's and the router's ranking
keys), a TorchFunctionMode that records the argument of the one `sigmoid` / `topk` call inside
that module. Nothing of the official computation is changed.

The official indexer calls `topk(..., sorted=False)`, whose order among exactly equal scores is
implementation-defined; the oracle keeps the earlier position (`run.semantics.index_ties`). So a
second official pass (`ties=earlier`) replaces that one call by a stable sort that keeps the
earlier position, everything else as is: it tells tie-order differences from any other. For
every `index.L.ids` row that differs, the bench counts whether the official scores hold an exact
tie at the selection threshold.

The user's tokenizer is the synthetic checkpoints' byte tokenizer (the checkpoint carries none):
BOS 0, UTF-8 byte b -> b + 3, `<image>` -> image_token_id; it is handed to the official code as a
tokenizer object (also for the official Engram normaliser, which builds its compressed map from
it).

Writes OUT/official_parity.json and prints one line per tensor: identical, or max |diff| and the
number of differing elements.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PACKAGE = "official_v41"
FILES = ("model.py", "vision.py", "engram.py", "image_processor.py", "kernel_cpu.py")
DEFAULT_PROMPT = "A picture: <image> What does it show?"


def load_official(directory: Path):
    """The official files in `directory` as the package `official_v41` (they import each other
    relatively); returns its `model` module."""
    missing = [f for f in FILES if not (directory / f).is_file()]
    if missing:
        raise SystemExit(f"--official {directory}: missing {', '.join(missing)}")
    spec = importlib.util.spec_from_file_location(PACKAGE, directory / "__init__.py",
                                                  submodule_search_locations=[str(directory)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = pkg  # no __init__.py is needed: the package is only a namespace here
    return importlib.import_module(f"{PACKAGE}.model")


class _Backend:
    """The tokenizers-backend part of the byte tokenizer that the official Engram builder reads."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def id_to_token(self, i: int) -> str:
        b = i - 3
        if i < 3:
            return f"<special{i}>"
        if b >= 256:
            return f"<unused{i}>"
        return f"<0x{b:02X}>" if b >= 128 else chr(b)

    def decode(self, ids, skip_special_tokens=False) -> str:
        (i,) = ids
        b = i - 3
        if 0 <= b < 128:
            return chr(b)
        return "\ufffd" if 0 <= b < 256 else self.id_to_token(i)  # a lone high byte is no character


class ByteTokenizer:
    """The synthetic checkpoints' tokenizer, as an object the official code can call."""

    PLACEHOLDER = "<image>"

    def __init__(self, vocab_size: int, image_token_id: int):
        self.vocab_size, self.image_token_id = vocab_size, image_token_id
        self.backend_tokenizer = _Backend(vocab_size)
        self.unk_token_id = None

    def __len__(self) -> int:
        return self.vocab_size

    def convert_tokens_to_ids(self, token: str):
        return self.image_token_id if token == self.PLACEHOLDER else None

    def encode(self, text: str) -> list[int]:
        out = [0]  # BOS
        for k, piece in enumerate(text.split(self.PLACEHOLDER)):
            if k:
                out.append(self.image_token_id)
            out += [b + 3 for b in piece.encode("utf-8")]
        return out


def official_args(model_mod, checkpoint: Path):
    raw = json.loads((checkpoint / "config.json").read_text())
    known = set(model_mod.ModelArgs.__dataclass_fields__)
    return model_mod.ModelArgs(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known})


def load_weights(model, checkpoint: Path) -> None:
    """Every parameter from the shards, in place (the quantised ones keep their `.scale` link)."""
    from safetensors import safe_open

    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    params = dict(model.named_parameters())
    missing = [n for n in params if n not in index]
    if missing:
        raise SystemExit(f"the checkpoint lacks {missing[:4]}")
    quantised = (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2)

    def stored(name):
        with safe_open(str(checkpoint / index[name]), "pt") as f:
            return f.get_tensor(name)

    for name, p in params.items():
        t = stored(name)
        # the released shards, converted as the official loader does: the FP8 `wo_a` times its
        # e8m0 block scale (blocks of rows / scale rows by columns / scale columns) in fp32, then
        # bf16; the routed experts' int8 bytes taken as float4_e2m1fn_x2
        scale = name[: -len("weight")] + "scale"
        if name.endswith(".attn.wo_a.weight") and t.dtype == torch.float8_e4m3fn and scale in index:
            s = stored(scale).float()
            r, c = t.size(0) // s.size(0), t.size(1) // s.size(1)
            t = (t.float().view(s.size(0), r, s.size(1), c) * s.view(s.size(0), 1, s.size(1), 1)).view(t.shape)
            t = t.to(torch.bfloat16)
        elif ".ffn.experts." in name and t.dtype == torch.int8 and p.dtype == torch.float4_e2m1fn_x2:
            t = t.view(torch.float4_e2m1fn_x2)
        if p.dtype in quantised or t.dtype in quantised:
            assert t.dtype == p.dtype and t.shape == p.shape, (name, t.dtype, p.dtype, t.shape, p.shape)
            p.data = t
        else:
            assert t.shape == p.shape, (name, t.shape, p.shape)
            p.data = t.to(p.dtype)


class Spy(TorchFunctionMode):
    """While active, records each `torch.sigmoid` result and each `topk` input (the ranking
    key); with `earlier`, every `topk` is answered by a stable descending sort, which keeps the
    earlier of exactly equal scores (the oracle's stated rule), in sorted order. Nothing else is
    touched."""

    def __init__(self, earlier: bool = False):
        super().__init__()
        self.earlier, self.sigmoid, self.topk = earlier, [], []

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.topk:
            score, k = args[0], args[1] if len(args) > 1 else kwargs["k"]
            self.topk.append(score.detach().clone())
            if self.earlier:
                dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
                order = torch.sort(score, dim=dim, descending=True, stable=True)
                return torch.return_types.topk((order.values.narrow(dim, 0, k), order.indices.narrow(dim, 0, k)))
        out = func(*args, **kwargs)
        if func is torch.sigmoid:
            self.sigmoid.append(out.detach().clone())
        return out


@contextmanager
def hooked(model, out: dict, index_topk: int, earlier: bool):
    """Forward hooks on the official modules: the tensors the oracle dumps, under its names."""
    handles, image = [], {"k": -1}

    def prefix():
        return "" if image["k"] == 0 else f"image.{image['k']}."

    def add(h):
        handles.append(h)

    if model.vision is not None:
        def patches_in(_m, args):
            image["k"] += 1  # one encode_image call per image, in prompt order
            out[prefix() + "patches"] = args[0].flatten(1).to(torch.bfloat16)

        def rope_in(_m, args):
            out[prefix() + "rope.cos"], out[prefix() + "rope.sin"] = args[1].squeeze(1), args[2].squeeze(1)

        add(model.vision.patch_embed.register_forward_pre_hook(patches_in))
        add(model.vision.blocks[0].register_forward_pre_hook(rope_in))
        add(model.vision.blocks[0].register_forward_hook(lambda _m, _a, o: out.__setitem__(prefix() + "block0", o)))
        add(model.vision.norm.register_forward_hook(lambda _m, _a, o: out.__setitem__(prefix() + "final_norm", o)))
        add(model.aligner.register_forward_hook(lambda _m, _a, o: out.__setitem__(prefix() + "aligner", o)))

    first = model.layers[0].engram or model.layers[0]
    add(first.register_forward_pre_hook(lambda _m, args: out.__setitem__("embeddings", args[0][0, :, 0].clone())))
    spies: dict = {}

    def spy_on(module, key, ties_earlier=False):
        def pre(_m, _a):
            spies[key] = Spy(ties_earlier)
            spies[key].__enter__()

        def post(_m, _a, _o):
            spies[key].__exit__(None, None, None)

        add(module.register_forward_pre_hook(pre))
        add(module.register_forward_hook(post))

    for i, layer in enumerate(model.layers):
        if layer.engram is not None:
            spy_on(layer.engram, f"engram.{i}")

            def gate(_m, args, _o, i=i):
                (g,) = spies[f"engram.{i}"].sigmoid  # the gate, before the official mask
                mask = args[2]
                out[f"engram.{i}.gate"] = (g if mask is None else g.masked_fill(~mask.unsqueeze(-1), 0))[0]
            add(layer.engram.register_forward_hook(gate))
        if layer.attn.indexer is not None:
            # `earlier` reaches both top-k calls of an indexer: the candidate blocks and the groups
            spy_on(layer.attn.indexer, f"index.{i}", earlier)

            def chosen(_m, args, idxs, i=i):
                offset = args[4]
                ids = torch.where(idxs >= 0, idxs - offset, -1).long()[0]
                ids = torch.nn.functional.pad(ids, (0, index_topk - ids.size(-1)), value=-1)
                out[f"index.{i}.ids"] = ids.sort(dim=-1).values
                out[f"index.{i}.scores"] = spies[f"index.{i}"].topk[-1][0].float()  # the groups' key
                if len(spies[f"index.{i}"].topk) > 1:  # a candidate source: the blocks' key too
                    out[f"index.{i}.block_scores"] = spies[f"index.{i}"].topk[0][0].float()
            add(layer.attn.indexer.register_forward_hook(chosen))
        add(layer.attn.register_forward_hook(lambda _m, _a, o, i=i: out.__setitem__(f"attn.{i}", o[0])))
        spy_on(layer.ffn.gate, f"router.{i}")  # the router's top-k keeps torch's order: the oracle's too

        def routed(_m, _a, o, i=i):
            weights, ids = o
            ids_sorted, order = ids.sort(dim=-1)
            out[f"router.{i}.ids"], out[f"router.{i}.weights"] = ids_sorted, weights.gather(-1, order)
            (out[f"router.{i}.scores"],) = spies[f"router.{i}"].topk
        add(layer.ffn.gate.register_forward_hook(routed))
        add(layer.register_forward_hook(lambda _m, _a, o, i=i: out.__setitem__(f"hidden.{i}", o[0][0])))
    # the official head keeps the last position; the oracle dumps every position's logits
    add(model.norm.register_forward_hook(
        lambda _m, _a, o: out.__setitem__("logits", model.head(o, full_logits=True)[0])))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def run_official(model_mod, checkpoint: Path, prompt: str, images: list[Path], earlier: bool):
    """(tensors by oracle name, tokens, token types, span starts) of one official prefill."""
    ip = sys.modules[f"{PACKAGE}.image_processor"]
    args = official_args(model_mod, checkpoint)
    tok = ByteTokenizer(args.vocab_size, args.image_token_id)
    sys.modules.setdefault("encoding", types.SimpleNamespace(IMAGE_PLACEHOLDER=ByteTokenizer.PLACEHOLDER))
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as the official generate.py runs it
    try:
        model = model_mod.Transformer(args, tok)
        load_weights(model, checkpoint)
        model.eval()
        tokens, token_types, image_inputs = ip.prepare_vl_inputs(prompt, [{"url": str(p)} for p in images], tok, args)
        out: dict = {}
        with hooked(model, out, args.index_topk, earlier):
            model(torch.tensor([tokens]), 0, [image_inputs] if image_inputs else None, torch.tensor([token_types]))
    finally:
        torch.set_default_dtype(prev)
    starts = [img.start for img in image_inputs or ()]
    return out, torch.tensor(tokens), torch.tensor(token_types), starts


def run_oracle(prompt: str, images: list[Path]):
    from tensordiff.format.capture import MemoryRecorder
    from tensordiff.pipeline.runs import make_request

    adapter, req = make_request("deepseek-v4.1-flash", image=images[0], more_images=tuple(images[1:]),
                                weights="synthetic:tiny-fp8", dtype="bfloat16", prompt=prompt)
    rec = MemoryRecorder()
    adapter.runner("oracle")(req, rec)
    return rec.tensors, rec.run, req


def _as_float(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t.long()


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return {"identical": False, "why": f"shape/dtype {list(a.shape)} {a.dtype} vs {list(b.shape)} {b.dtype}"}
    # bit for bit: equal bit patterns (so -0.0 != 0.0; NaNs equal only with equal payloads)
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}
    differ = a.view(bits[a.dtype]) != b.view(bits[b.dtype]) if a.is_floating_point() else a != b
    if not bool(differ.any()):
        return {"identical": True}
    fa, fb = _as_float(a)[differ], _as_float(b)[differ]
    d = torch.where(fa == fb, 0.0, (fa - fb).abs())  # equal values of other bits (+-0) count 0
    d = torch.nan_to_num(d, nan=float("inf"), posinf=float("inf"))
    rows = int(differ.reshape(differ.shape[0], -1).any(-1).sum()) if differ.ndim else 0
    return {"identical": False, "max_abs_diff": float(d.max()), "elements_differ": int(differ.sum()),
            "elements": differ.numel(), "rows_differ": rows}


def computation_order(names) -> list[str]:
    """The oracle's tensor names in the order they are computed: an index source's choice is
    recorded after its layer, but made before that layer's attention."""
    names = list(names)
    out = [n for n in names if not n.startswith("index.")]
    for n in (n for n in names if n.startswith("index.")):
        layer = n.split(".")[1]
        out.insert(out.index(f"attn.{layer}") if f"attn.{layer}" in out else len(out), n)
    return out


def index_ties(scores: torch.Tensor, ids_a: torch.Tensor, ids_b: torch.Tensor) -> dict:
    """For the rows whose chosen sets differ: how many hold an exact tie at the threshold (the
    k-th best score equals the (k+1)-th, among the visible ones)."""
    differ = [r for r in range(ids_a.shape[0]) if set(ids_a[r].tolist()) != set(ids_b[r].tolist())]
    tied = 0
    for r in differ:
        s = scores[r][torch.isfinite(scores[r])]
        k = int((ids_a[r] >= 0).sum())
        if 0 < k < s.numel():
            top = torch.sort(s, descending=True).values
            tied += bool(top[k - 1] == top[k])
    return {"rows_differ": len(differ), "rows_with_exact_tie_at_threshold": tied}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--official", type=Path, required=True, help="directory of the official inference files")
    ap.add_argument("--out", type=Path, default=None, help="write official_parity.json here")
    ap.add_argument("--image", type=Path, action="append", default=None,
                    help="an image (repeat for several, one <image> each; default: the bundled picture)")
    ap.add_argument("--prompt", default=None)
    a = ap.parse_args(argv)
    from tensordiff.pipeline.inputs import default_image_path
    from tensordiff.models.deepseek_v41_flash.synthetic import resolve

    images = a.image or [default_image_path()]
    prompt = a.prompt or (DEFAULT_PROMPT if len(images) == 1 else
                          " and ".join(["<image>"] * len(images)) + ": what differs?")
    model_mod = load_official(a.official.resolve())
    checkpoint = resolve("synthetic:tiny-fp8")
    ours, run, req = run_oracle(prompt, images)
    from oracle.deepseek_v41_flash.config import ModelArgs
    from oracle.deepseek_v41_flash.image_processor import num_image_tokens
    from oracle.deepseek_v41_flash.tokens import build_prompt

    cells = [tuple(i["cells"]) for i in (run["inputs"].get("images") or [run["inputs"]])]
    ids, types_, starts = build_prompt(prompt, ModelArgs.from_dir(checkpoint), cells)
    report = {"prompt": prompt, "images": [str(p) for p in images], "weights": "synthetic:tiny-fp8",
              "oracle": {"dtype": req.dtype, "language_numerics": run.get("language_numerics"),
                         "semantics": run.get("semantics")}, "passes": {}}
    for ties in ("as-is", "earlier"):
        theirs, tokens, token_types, off_starts = run_official(model_mod, checkpoint, prompt, images, ties == "earlier")
        rows = {}
        for name in computation_order(ours):
            if name.startswith("plan.") or (images and name.split(".")[0] == "image" and ".plan." in name):
                continue  # the plan is the oracle's record of integer decisions; the official code keeps none
            rows[name] = compare(theirs[name], ours[name]) if name in theirs else {"identical": False,
                                                                                 "why": "not captured"}
            if name.endswith(".ids") and name.startswith("index.") and not rows[name]["identical"] and name in theirs:
                rows[name]["ties"] = index_ties(theirs[name.replace(".ids", ".scores")], theirs[name], ours[name])
        p = {"tokens_identical": torch.equal(tokens, ids), "token_types_identical": torch.equal(token_types, types_),
             "span_starts": {"official": off_starts, "oracle": starts},
             "spans": [num_image_tokens(*c) for c in cells],
             # the first tensor, in the oracle's recording order (the computation's), that differs
             "first_difference": next((n for n, r in rows.items() if not r["identical"]), None),
             "identical": sorted(n for n, r in rows.items() if r["identical"]),
             "not_identical": {n: r for n, r in rows.items() if not r["identical"]}}
        report["passes"][ties] = p
        print(f"== official pass, indexer ties {ties}: tokens {'identical' if p['tokens_identical'] else 'DIFFER'}, "
              f"types {'identical' if p['token_types_identical'] else 'DIFFER'}, span starts "
              f"{off_starts} vs {starts}")
        print(f"   {len(p['identical'])} of {len(rows)} tensors bit-identical; first difference: "
              f"{p['first_difference']}")
        for n, r in p["not_identical"].items():
            print(f"   {n:<22} {json.dumps(r)}")
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "official_parity.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {a.out / 'official_parity.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
