"""DeepSeek V4.1 Flash: what a checkpoint directory holds, before a long oracle run (`tensordiff
inspect CKPT`). Only the index, config.json and the shards' headers are read, never tensor data.

    view = describe(Path("DeepSeek-V4.1-Flash"), layers="2")   # None for another model's directory
    print("\\n".join(view.lines())); view.problems               # [] when a run can read it

It states: the model and its config; the units present (vision tower, aligner, image markers,
embedding, head, final norm, language layers and what each holds, draft layers); how each tensor
group is stored (bf16, fp32, FP8 + block scale, FP4 in int8, FP4 as float4); what a run converts
on load (the release's FP8 `wo_a` dequantised to bf16, its int8-stored experts viewed as FP4);
what is missing (shards, tensors, scales); and the bytes a run with `--layers` reads.

The expected names are the official layout's (`synthetic_language`), the
stored formats the shards' own headers. No torch here.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tensordiff.errors import BadInput
from tensordiff.format.checkpoint import INDEX, weight_map as checkpoint_weight_map
from tensordiff.format.storage import read_safetensors_layout
from tensordiff.models.deepseek_v41_flash.synthetic import FULL, vision_tensor_names
from tensordiff.models.deepseek_v41_flash.synthetic_language import language_shapes, storage_format

MODEL = "deepseek-v4.1-flash"
# keys of the official inference config that no other model's config has together
SIGNATURE = ("hc_mult", "o_lora_rank", "compress_ratios", "n_routed_experts")

WORDS = {"BF16": "bf16", "F32": "fp32", "F16": "fp16", "F64": "fp64", "F8_E4M3": "FP8 (e4m3)",
         "F8_E5M2": "FP8 (e5m2)", "F8_E8M0": "e8m0", "I8": "int8", "U8": "uint8", "F4": "FP4 as float4",
         "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}
BYTES_PER = {"F4": 0.5}  # header shapes count logical FP4 values, two a byte

ROUTED = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.w[123]\.weight$")
WO_A = re.compile(r"^layers\.(\d+)\.attn\.wo_a\.weight$")


@dataclass
class Tensor:
    name: str
    shard: str
    dtype: str | None = None  # the header's; None when the shard could not be read
    shape: tuple[int, ...] = ()
    nbytes: int = 0


@dataclass
class CheckpointView:
    path: Path
    model: str
    config: dict
    tensors: dict[str, Tensor]
    run_layers: tuple[int, ...]  # the layers a run reads (--layers, or all)
    groups: dict[str, Counter] = field(default_factory=dict)  # group -> format -> tensors
    conversions: dict[str, int] = field(default_factory=dict)
    present_layers: tuple[int, ...] = ()
    draft_layers: tuple[int, ...] = ()
    units: dict[str, str] = field(default_factory=dict)  # unit -> what it holds
    layer_units: dict[int, str] = field(default_factory=dict)
    missing_shards: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    reads: dict[str, int] = field(default_factory=dict)  # part -> bytes a run reads
    hashed: int = 0  # bytes of the shards the weights digest hashes for that run

    def lines(self) -> list[str]:
        c, out = self.config, []
        out.append(f"checkpoint {self.path}: {self.model} (config.json: {c.get('n_layers')} language layers, dim "
                   f"{c.get('dim')}, {c.get('n_routed_experts')} routed experts, dtype {c.get('dtype')}, "
                   f"experts {c.get('expert_dtype') or c.get('dtype')})")
        total = sum(t.nbytes for t in self.tensors.values())
        shards = {t.shard for t in self.tensors.values()}
        out.append(f"  {len(self.tensors)} tensors in {len(shards)} shards, {_size(total)}")
        out.append("units:")
        out += [f"  {unit}: {what}" for unit, what in self.units.items()]
        n = c.get("n_layers", 0)
        out.append(f"  language layers: {_ids(self.present_layers) or 'none'} of 0-{n - 1}"
                   + (f" ({n - len(self.present_layers)} absent)" if len(self.present_layers) < n else ""))
        for ids, what in _grouped(self.layer_units):
            out.append(f"    {'layer' if len(ids) == 1 else 'layers'} {_ids(ids)}: {what}")
        if self.draft_layers:
            out.append(f"  draft layers: {_ids(self.draft_layers)} (neither side reads them)")
        out.append("stored formats:")
        for group, formats in self.groups.items():
            text = ", ".join(f"{fmt} ({k})" for fmt, k in formats.most_common())
            out.append(f"  {group}: {text}")
        out.append("converted on load (both sides, each its own code):")
        if self.conversions:
            out += [f"  {what}: {k} tensors" for what, k in self.conversions.items()]
        else:
            out.append("  nothing: every tensor is read as stored (plain floats cast to the run's dtype)")
        out.append(f"a run with --layers {_ids(self.run_layers) or 'none'} reads:")
        out += [f"  {part}: {_size(b)}" for part, b in self.reads.items()]
        out.append("  each side reads these once: the oracle into host memory (its language half runs on the "
                   "CPU), the engine onto --device")
        out.append(f"  the weights digest hashes the shards holding them once: {_size(self.hashed)} "
                   "(remembered by file stat afterwards)")
        if self.problems:
            out.append(f"problems ({len(self.problems)}):")
            out += [f"  {p}" for p in self.problems]
        else:
            out.append("complete and readable for that run")
        return out


def _size(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def _ids(ids) -> str:
    """(0, 1, 2, 5) -> "0-2, 5"."""
    ids, parts, i = sorted(ids), [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(parts)


def _grouped(per_layer: dict[int, str]):
    """Consecutive layers with the same description together."""
    out: list[tuple[list[int], str]] = []
    for i in sorted(per_layer):
        if out and out[-1][1] == per_layer[i] and out[-1][0][-1] == i - 1:
            out[-1][0].append(i)
        else:
            out.append(([i], per_layer[i]))
    return out


def parse_layers(spec: str | None, n_layers: int) -> tuple[int, ...]:
    if spec in (None, ""):
        return tuple(range(n_layers))
    ids: set[int] = set()
    for piece in str(spec).split(","):
        first, dash, last = piece.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise BadInput(f"--layers {spec!r}: write layer ids and ranges such as 0-2 or 0,2")
        a, b = int(first), int(last if dash else first)
        if not a <= b < n_layers:
            raise BadInput(f"--layers {spec!r}: {piece.strip()} is not inside 0-{n_layers - 1}")
        ids.update(range(a, b + 1))
    return tuple(sorted(ids))


def _config(path: Path) -> dict | None:
    f = path / "config.json"
    if not f.is_file():
        return None
    try:
        cfg = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BadInput(f"{f} is not readable JSON ({e})") from None
    return cfg if isinstance(cfg, dict) and all(k in cfg for k in SIGNATURE) else None


def _headers(path: Path, wmap: dict[str, str]) -> tuple[dict[str, Tensor], list[str], list[str]]:
    """Every indexed tensor with its header facts; the missing shards; problems."""
    tensors = {n: Tensor(n, s) for n, s in wmap.items()}
    missing, problems = [], []
    for shard in sorted(set(wmap.values())):
        rel = PurePosixPath(shard)
        if rel.is_absolute() or ".." in rel.parts or rel.suffix != ".safetensors":
            raise BadInput(f"{path / INDEX} names {shard!r}, which is not a .safetensors file inside "
                           "the checkpoint (tensordiff never unpickles)")
        f = path / rel
        if not f.is_file():
            missing.append(shard)
            continue
        try:
            layout, _ = read_safetensors_layout(f)
        except BadInput as e:
            problems.append(f"shard {shard} is unreadable: {str(e).removeprefix(str(f) + ': ')}")
            continue
        for n, t in tensors.items():
            if t.shard != shard:
                continue
            if n not in layout:
                problems.append(f"{n}: the index places it in {shard}, which does not hold it")
                continue
            dtype, shape, b, e = layout[n]
            t.dtype, t.shape, t.nbytes = dtype, shape, e - b
    return tensors, missing, problems


def _group(name: str) -> str:
    parts = name.split(".")
    if parts[0] in ("vision", "aligner"):
        return "vision tower and aligner"
    if parts[0] in ("embed", "head"):
        return "embedding and head"
    if name.startswith("image_"):
        return "image markers"
    if parts[0] == "mtp":
        return "draft layers"
    if parts[0] != "layers":
        return "final norm" if parts[0] == "norm" else "other"
    sub = ".".join(parts[2:-1])
    if ROUTED.match(name) or (sub.startswith("ffn.experts.") and parts[-1] == "scale"):
        return "routed experts"
    if sub.startswith("ffn.shared_experts"):
        return "shared expert"
    if sub == "attn.wo_a":
        return "attention output wo_a"
    if sub.startswith("engram.embed"):
        return "Engram table"
    if sub.startswith("engram"):
        return "Engram projection and gates"
    if sub.startswith("ffn.gate"):
        return "router gate"
    if parts[2].startswith("hc_"):
        return "hyper-connection mixes"
    if sub.endswith("norm"):
        return "norms"
    if sub.startswith("attn.compressor"):
        return "compressor"
    if sub in ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_b", "attn.indexer.wq_b"):
        return "attention projections (wq_a, wq_b, wkv, wo_b, indexer wq_b)"
    if sub.startswith("attn.indexer"):
        return "indexer weights_proj and wk"
    return "attention sink" if parts[-1] == "attn_sink" else "other"


def _format(t: Tensor, tensors: dict[str, Tensor]) -> str | None:
    """How one tensor is stored, in words; None for a scale (it is part of its weight's format)."""
    if t.name.endswith(".scale"):
        return None
    if t.dtype is None:
        return "unreadable"
    scale = tensors.get(t.name[: -len("weight")] + "scale") if t.name.endswith(".weight") else None
    if t.dtype == "F8_E4M3":
        return "FP8 + e8m0 scale" if scale is not None else "FP8 without its scale"
    if t.dtype == "I8" and ROUTED.match(t.name):
        return "FP4 in int8 + scale" if scale is not None else "FP4 in int8 without its scale"
    if t.dtype == "F4":
        return "FP4 as float4 + scale" if scale is not None else "FP4 without its scale"
    word = WORDS.get(t.dtype, t.dtype)
    return word + (" + scale" if scale is not None else "")


def _expected(cfg: dict) -> dict[str, bool]:
    """Every official language tensor name the config gives -> whether a run needs a `.scale`
    beside it (FP8 / FP4 storage); the layout's own statement (`synthetic_language`)."""
    out = {}
    for name in language_shapes(cfg):
        out[name] = storage_format(cfg, name) is not None
    return out


def _layer_unit(cfg: dict, i: int, present: set[str]) -> str:
    p, a = f"layers.{i}.", f"layers.{i}.attn."
    ratio = cfg["compress_ratios"][i] if i < len(cfg["compress_ratios"]) else 0
    attn = "attention" + (f" (compressed KV, ratio {ratio})" if ratio else " (window only)")
    extras = [w for w, key in (("compressor", "compressor.wkv.weight"), ("indexer", "indexer.wq_b.weight"))
              if a + key in present]
    if extras:
        attn += " with " + " and ".join(extras)
    experts = len({int(m.group(2)) for n in present if (m := ROUTED.match(n)) and int(m.group(1)) == i})
    moe = f"MoE (gate, {experts} of {cfg['n_routed_experts']} routed experts" + \
          (", shared expert)" if p + "ffn.shared_experts.w1.weight" in present else ", no shared expert)")
    parts = [attn, moe] + (["Engram table"] if p + "engram.embed.weight" in present else [])
    return ", ".join(parts)


def describe(path: Path, layers: str | None = None) -> CheckpointView | None:
    """The view of a DeepSeek V4.1 Flash checkpoint directory, or None when its config.json is
    not one. Unreadable input (config, index, a shard outside the directory) is BadInput."""
    path = Path(path)
    cfg = _config(path)
    if cfg is None:
        return None
    if not isinstance(cfg.get("n_layers"), int) or not isinstance(cfg.get("compress_ratios"), list):
        raise BadInput(f"{path / 'config.json'}: n_layers / compress_ratios are not a DeepSeek V4.1 Flash config")
    cfg = {**FULL, **cfg}
    wmap = checkpoint_weight_map(path)
    tensors, missing, problems = _headers(path, wmap)
    run = parse_layers(layers, cfg["n_layers"])
    view = CheckpointView(path, MODEL, cfg, tensors, run, missing_shards=missing)
    names = set(tensors)

    # units
    vision = vision_tensor_names(cfg)
    blocks = len({n.split(".")[2] for n in names if n.startswith("vision.blocks.")})
    view.units["vision tower"] = f"{blocks} of {cfg['vision_n_layers']} blocks" + (
        ", patch embedding, final norm" if {"vision.patch_embed.proj.weight", "vision.norm.weight"} <= names else "")
    view.units["aligner"] = "present" if "aligner.w1.weight" in names else "absent"
    view.units["image markers"] = f"{len([n for n in ('image_start', 'image_end', 'image_newline') if n in names])} of 3"
    for unit, key in (("embedding", "embed.weight"), ("head", "head.weight"), ("final norm", "norm.weight")):
        view.units[unit] = "present" if key in names else "absent"
    present = sorted({int(n.split(".")[1]) for n in names if n.startswith("layers.")})
    view.present_layers = tuple(present)
    view.draft_layers = tuple(sorted({int(n.split(".")[1]) for n in names if n.startswith("mtp.")}))
    view.layer_units = {i: _layer_unit(cfg, i, names) for i in present}

    # formats
    for t in tensors.values():
        fmt = _format(t, tensors)
        if fmt is not None:
            view.groups.setdefault(_group(t.name), Counter())[fmt] += 1
    wo_a = [t for t in tensors.values() if WO_A.match(t.name)]
    experts = [t for t in tensors.values() if ROUTED.match(t.name)]
    conv = {"wo_a FP8 + e8m0 block scale, dequantised to bf16 (scale dropped)":
            sum(t.dtype == "F8_E4M3" and t.name[: -len("weight")] + "scale" in names for t in wo_a),
            "routed experts' int8 bytes viewed as FP4 (two e2m1 values a byte, unchanged)":
            sum(t.dtype == "I8" for t in experts)}
    view.conversions = {k: v for k, v in conv.items() if v}
    if any(t.dtype == "I8" for t in experts) and any(t.dtype == "F4" for t in experts):
        problems.append("routed experts are stored both as int8 (the release) and as float4 (converted): "
                        "a mix of two downloads?")

    # missing: shards, then tensors and scales of what is present or asked for
    for shard in missing:
        held = sorted(n for n, s in wmap.items() if s == shard)
        lays = sorted({int(n.split(".")[1]) for n in held if n.startswith("layers.")})
        where = f" (layers {_ids(lays)})" if lays else ""
        problems.append(f"shard {shard} is missing: {len(held)} tensors{where}, e.g. {held[0]}")
    expected = _expected(cfg)
    for i in sorted(set(run)):
        if i not in present:
            problems.append(f"layer {i} is asked for (--layers) but the checkpoint holds none of its tensors")
            continue
        want = [n for n in expected if n.startswith(f"layers.{i}.")]
        lacking = [n for n in want if n not in names]
        if lacking:
            problems.append(f"layer {i} lacks {len(lacking)} tensors, e.g. {lacking[0]}")
    lacking = [n for n in vision if n not in names]
    if lacking:
        problems.append(f"the vision path lacks {len(lacking)} tensors, e.g. {lacking[0]}")
    for n in ("embed.weight", "head.weight", "norm.weight"):
        if n not in names:
            problems.append(f"{n} is absent: the language half cannot run")
    for n, t in sorted(tensors.items()):
        scaled = t.dtype in ("F8_E4M3", "F4") or (t.dtype == "I8" and ROUTED.match(n))
        if scaled and n.endswith(".weight") and n[: -len("weight")] + "scale" not in names:
            problems.append(f"{n} is stored as {WORDS.get(t.dtype, t.dtype)} without its scale "
                            f"{n[: -len('weight')]}scale")
        elif t.dtype == "I8" and not ROUTED.match(n):
            problems.append(f"{n} is stored as int8, which only the routed experts' packed FP4 may be")
    view.problems = problems

    # what a run reads: the vision path, then (with a prompt) the language tensors of its layers
    keep = set(run)

    def language(n: str) -> bool:
        if n.startswith("layers."):
            return int(n.split(".")[1]) in keep
        return n in ("embed.weight", "head.weight", "norm.weight")

    vision_read = sum(tensors[n].nbytes for n in vision if n in tensors)
    markers = sum(tensors[n].nbytes for n in ("image_start", "image_end", "image_newline") if n in tensors)
    lang = [n for n in tensors if language(n)]
    experts_read = sum(tensors[n].nbytes for n in lang if ".ffn.experts." in n)
    view.reads = {"vision path (an image alone)": vision_read + markers,
                  "language half (with --prompt): routed experts": experts_read,
                  "language half: everything else": sum(tensors[n].nbytes for n in lang) - experts_read}
    read = set(vision) | {"image_start", "image_end", "image_newline"} | set(lang)
    shards = {tensors[n].shard for n in read if n in tensors}
    view.hashed = sum((path / s).stat().st_size for s in shards if (path / s).is_file())
    return view
