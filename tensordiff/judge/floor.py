"""Three-way, floor-relative verdicts: is the engine's low-precision error more than the oracle's own?

For a run in a low precision P (bfloat16, float16) three dumps take part:

    R  the oracle in float32 (the reference)
    F  the oracle in P (the floor run): what P costs an implementation that is right
    E  the engine in P (the candidate)

Per tensor the floor is F's error against R; E's error against R is judged as a multiple of it
on four statistics (`RATIOS`):

    rmse      RMSE(E - R) / RMSE(F - R)                     tensor-wide excess error
    row       max row RMSE of E / max row RMSE of F         the worst row against the floor's worst
    cosine    (1 - cos(E, R)) / (1 - cos(F, R))             bulk direction
    outliers  rows whose RMSE exceeds `FloorRule.outlier` × that row's own floor RMSE (floored at
              the floor's median row, so a row the floor happened to get nearly right is not a
              hair trigger); more than `max_outliers` is a divergence even when the rest of the
              tensor is perfect: one wrong patch among 800 is caught here and nowhere else.

Rows shorter than `rows.MIN_ROW_ELEMS` elements (router weights [S, top-k]) are pooled into
blocks of consecutive rows for `row` and `outliers`: a 2-element row's RMSE is too noisy a
sample for a 2x multiplier (`rows.MIN_ROW_ELEMS` says how noisy).

Where F equals R bit for bit (preprocessing, position tables, anything precision does not touch)
the engine must equal R bit for bit too: the floor is zero and so is the allowance.

A profile (`tensordiff calibrate`) adds the clean engine's own ratios per boundary and statistic
over the gate's images: a ratio outside [min - spread, max + spread] (spread = max - min, at least
two images) is flagged, which catches a regression of a few percent that no multiplier sees; and
a tensor the clean engine computed bit-equal to the floor run on every image (the same arithmetic
in P, e.g. a position table) must stay bit-equal to it.

Every tensor also states the smallest relative perturbation it can detect (`detectable`): an
error of relative size δ, independent of the floor's, raises the RMSE ratio to
sqrt(1 + (δ/f)²) for a relative floor f = RMSE(F - R)/RMS(R), so the RMSE rule sees
δ > f·sqrt(m² - 1); the outlier rule sees a one-row error above the median row's relative floor
times sqrt(outlier² - 1).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from tensordiff.errors import BadInput
from tensordiff.format.dtypes import to_float64
from tensordiff.format.dump import Entry
from tensordiff.judge.layout import describe
from tensordiff.judge.rows import RowErrors, rows_per_block, shape_rows

RATIOS = ("rmse", "row", "cosine")  # the continuous statistics a profile records
CHUNK_ROWS_ELEMS = 1 << 20
WORST_ROWS = 3


@dataclass(frozen=True)
class FloorRule:
    """The multipliers: how far above its floor a clean engine's error may go.

    On the CPU (synthetic:tiny, bf16; DeepSeek on 10 pictures, Qwen3-VL on 4) the clean engines'
    ratios are 0.98-1.03 (rmse), 0.87-1.37 (row), 0.96-1.06 (cosine), their worst row at most 1.59x
    its own floor row (128-wide rows: a row's RMSE is a 128-sample estimate); the numeric faults
    sit at 1.5-4.1x. On a GPU (synthetic:full) the clean profile is 0.994-1.002 in RMSE. So the
    multipliers leave the clean engine a margin of ~10% (rmse), ~10% (row), ~20% (cosine), ~25%
    (outlier rows), and `tensordiff calibrate` records the engine's own profile for tighter gates.
    """

    rmse: float = 1.15
    row: float = 1.5
    cosine: float = 1.3
    outlier: float = 2.0
    max_outliers: int = 0
    source: str = field(default="default", compare=False)  # where the multipliers came from (a file's [floor_rule])

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "source"}


DEFAULT_RULE = FloorRule()


def rule_from_mapping(m: dict | None, where: str = "floor rule") -> FloorRule:
    if not m:
        return DEFAULT_RULE
    known = set(FloorRule.__dataclass_fields__) - {"source"}
    out = {}
    for k, v in m.items():
        if k not in known:
            raise BadInput(f"{where}: unknown key {k!r} (known: {', '.join(sorted(known))})")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < (0 if k == "max_outliers" else 1):
            raise BadInput(f"{where}.{k} must be a number >= {0 if k == 'max_outliers' else 1}, not {v!r}")
        out[k] = int(v) if k == "max_outliers" else float(v)
    return FloorRule(**out, source=where)


# ----------------------------------------------------------------------------- one tensor

def _triple(er: Entry, ef: Entry, ec: Entry, n_rows: int, row_len: int) -> tuple[RowErrors, RowErrors, bool]:
    """Stream the three tensors in whole-row chunks: (floor vs ref, candidate vs ref, candidate
    equal to the floor run bit for bit)."""
    floor, cand = RowErrors(n_rows, row_len), RowErrors(n_rows, row_len)
    same = True
    step = max(row_len, (CHUNK_ROWS_ELEMS // row_len) * row_len)
    readers = [e.stored.reader() for e in (er, ef, ec)]
    try:
        n = er.stored.numel
        for s in range(0, n, step):
            e = min(n, s + step)
            r, f, c = (to_float64(rd.read(s, e), ent.dtype) for rd, ent in zip(readers, (er, ef, ec)))
            floor.update(s, r, f)
            cand.update(s, r, c)
            same = same and bool(np.array_equal(f, c, equal_nan=True))
    finally:
        for rd in readers:
            rd.close()
    return floor, cand, same


def _ratio(x: float, floor: float) -> float:
    if floor > 0:
        return x / floor
    return 0.0 if x == 0 else math.inf


def measure(er: Entry, ef: Entry, ec: Entry) -> dict:
    """The floor and the candidate's statistics for one tensor, and their ratios."""
    n_rows, row_len = shape_rows(er.shape)
    fl, ca, same = _triple(er, ef, ec, n_rows, row_len)
    out = {"exact_floor": fl.exact, "equals_floor_run": same, "nonfinite": ca.nonfinite - fl.nonfinite if ca.nonfinite > fl.nonfinite else 0,
           "rows": n_rows, "row_len": row_len, "ref_rms": fl.ref_rms,
           "floor": {"rmse": fl.rmse, "cosine_deficit": fl.cosine_deficit},
           "engine": {"rmse": ca.rmse, "cosine_deficit": ca.cosine_deficit},
           "range": {"a": fl.range_ref, "b": ca.range_oth}}
    # rows of few elements are pooled into blocks (`rows.MIN_ROW_ELEMS`): a 2-sample row RMSE is noise
    per = out["rows_per_block"] = rows_per_block(row_len) if n_rows > 1 else 1
    frow, ref_row = fl.block_rmse(per)
    crow = ca.block_rmse(per)[0]
    med = float(np.median(frow))
    out["floor"]["row_max"] = float(frow.max())
    out["floor"]["row_median"] = med
    out["engine"]["row_max"] = float(crow.max())
    out["ratios"] = {"rmse": _ratio(ca.rmse, fl.rmse), "row": _ratio(float(crow.max()), float(frow.max())),
                     "cosine": _ratio(ca.cosine_deficit, fl.cosine_deficit)}
    # each row against its own floor row, never against less than the floor's median row
    denom = np.maximum(frow, med)
    with np.errstate(divide="ignore", invalid="ignore"):
        local = np.where(crow == 0, 0.0, np.where(denom > 0, crow / np.where(denom > 0, denom, 1.0), np.inf))
    out["row_ratio"] = local
    rel = np.where(ref_row > 0, frow / np.where(ref_row > 0, ref_row, 1.0), np.nan)
    out["floor"]["relative"] = fl.rmse / fl.ref_rms if fl.ref_rms > 0 else 0.0
    out["floor"]["row_relative_median"] = float(np.nanmedian(rel)) if np.isfinite(rel).any() else 0.0
    return out


def detectable(st: dict, rule: FloorRule, upper: float | None = None) -> dict:
    """The smallest relative perturbation each rule can see (see the module docstring)."""
    if st["exact_floor"]:
        return {"tensor": 0.0, "row": 0.0, "note": "bit-exact: any change is seen"}
    m = rule.rmse if upper is None else min(rule.rmse, upper)
    return {"tensor": st["floor"]["relative"] * math.sqrt(max(m * m - 1, 0.0)),
            "row": st["floor"]["row_relative_median"] * math.sqrt(rule.outlier ** 2 - 1)}


def profile_band(prof: dict | None) -> dict[str, tuple[float, float]]:
    """stat -> (low, high) allowed by a clean profile {stat: {min, max, n}} (two images or more:
    `images` where the profile has repeated runs, else `n`). The spread is that of every sample,
    so with `calibrate --repeats` it covers run-to-run variation as well as the images'."""
    out = {}
    for stat, p in (prof or {}).items():
        if stat not in RATIOS or not isinstance(p, dict) or int(p.get("images", p.get("n", 0))) < 2:
            continue
        lo, hi = float(p["min"]), float(p["max"])
        spread = hi - lo
        out[stat] = (lo - spread, hi + spread)
    return out


def verdict(st: dict, rule: FloorRule, band: dict[str, tuple[float, float]] | None = None) -> tuple[bool, str]:
    if st["nonfinite"]:
        return True, f"{st['nonfinite']} elements non-finite in the engine only"
    r = st["ratios"]
    if st.get("must_equal_floor_run") and not st["equals_floor_run"]:
        return True, ("the clean engine equals the oracle in this precision bit for bit here (calibrated), "
                      f"this one does not; RMSE {r['rmse']:.4g}× floor")
    if st["exact_floor"]:
        if st["engine"]["rmse"] > 0:
            return True, ("the oracle is bit-exact across precisions here, so the engine must be too; "
                          f"RMSE {st['engine']['rmse']:.3g}")
        return False, ""
    if "family" in st:  # one more row of a tensor: its row statistic, against that tensor's floor rows
        f = st["family"]
        if f["x_floor"] > rule.row:
            return True, (f"RMSE {f['x_floor']:.3g}× its row floor (limit {rule.row:g}×; the floor: its own "
                          f"{f['own_floor']:.3g}, never below the largest row of `{f['of']}`'s, {f['max_row']:.3g})")
        return False, ""
    for stat in RATIOS:
        lim = getattr(rule, stat)
        if st.get("rows") == 1 and stat != "row":
            # one row (a decode step's logits): the tensor-wide RMSE IS that row's RMSE, a sample
            # as noisy as any row's, so it takes the row multiplier (and the cosine deficit,
            # about the square of the RMSE ratio, its square), not the many-row average's
            lim = rule.row if stat == "rmse" else rule.row ** 2
        if r[stat] > lim:
            what = {"rmse": "RMSE", "row": "max row RMSE", "cosine": "cosine deficit"}[stat]
            w = st["worst_rows"][0] if stat == "row" and st["worst_rows"] else None
            at = f"; worst row {w['row']} ({w['meaning']}) at {w['x_floor']:.3g}× its floor" if w else ""
            return True, f"{what} {r[stat]:.3g}× floor (limit {lim:g}×){at}"
    if st["outliers"] > rule.max_outliers:
        w = st["worst_rows"][0]
        per = st.get("rows_per_block", 1)
        unit = f"blocks of {per} rows" if per > 1 else "rows"
        n = max(1, st["rows"] // per)
        return True, (f"{st['outliers']} of {n} {unit} above {rule.outlier:g}× their floor; worst row "
                      f"{w['row']} ({w['meaning']}) at {w['x_floor']:.3g}× floor")
    for stat, (lo, hi) in (band or {}).items():
        if stat in r and not lo <= r[stat] <= hi:
            return True, (f"{stat} {r[stat]:.4g}× floor departs from the clean engine's profile "
                          f"[{lo:.4g}, {hi:.4g}]")
    return False, ""


def statistics(er: Entry, ef: Entry, ec: Entry, rule: FloorRule, layout: str, run: dict,
                 profile: dict | None = None, family: tuple[str, float] | None = None) -> dict:
    """`family` = (tensor, its floor's largest row RMSE): a one-row tensor that is one more row of
    that tensor (a decode step `logits.step.N` of the prompt's `logits`, `row_family`) is judged
    as the `row` statistic judges that tensor: against max(its own floor, that largest row), with
    the row multiplier."""
    st = measure(er, ef, ec)
    local = st.pop("row_ratio")
    if family is not None and st["rows"] == 1 and not st["exact_floor"]:
        own = st["floor"]["rmse"]
        denom = max(own, family[1])
        x = st["engine"]["rmse"] / denom if denom > 0 else (0.0 if st["engine"]["rmse"] == 0 else math.inf)
        st["family"] = {"of": family[0], "max_row": family[1], "own_floor": own, "x_floor": x}
        local = np.array([x])
    st["outliers"] = int((local > rule.outlier).sum())
    order = np.argsort(-local, kind="stable")[:WORST_ROWS]
    per = st["rows_per_block"]
    st["worst_rows"] = [{"row": int(i) * per, "meaning": _block_meaning(layout, int(i), per, st["rows"], run),
                         "x_floor": float(local[i])} for i in order]
    band = profile_band(profile)
    st["profile"] = {k: list(v) for k, v in band.items()}
    st["must_equal_floor_run"] = bool((profile or {}).get("equals_floor_run", {}).get("all"))
    st["detectable"] = detectable(st, rule, band.get("rmse", (None, None))[1] if band else None)
    st["material"], st["reason"] = verdict(st, rule, band)
    st["_local"] = local
    return st


def _block_meaning(layout: str, block: int, per: int, n_rows: int, run: dict) -> str:
    """What a row statistic's unit is: one row, or a block of `per` rows named by its first."""
    lo = block * per
    what = describe(layout, (lo,), run)
    if per == 1:
        return what
    hi = n_rows - 1 if block == max(1, n_rows // per) - 1 else lo + per - 1  # the last block takes the rest
    return f"rows {lo}-{hi}, from {what}" if what else f"rows {lo}-{hi}"


_STEP = re.compile(r"^(.+)\.step\.\d+$")


def row_family(name: str) -> str | None:
    """The tensor whose rows a one-row tensor continues: a decode step `X.step.N` is the next row
    of the prompt's `X` (both models name their decode steps so: `logits.step.N` after `logits`).
    Its floor is one row's, as noisy as any row's (H200: clean decode steps at 0.10x to 1.33x
    their own floor); and a decode step is the whole network for one token, whose own router and
    indexer choices flip on near-ties unseen (no boundary records them): CPU, chelsea, the bf16
    engine's step 2 on the reference's inputs 8x its own floor, 4x the median prompt row, while
    the prompt's rows that flipped reach 7x their median. So a step is judged as the `row`
    statistic judges that tensor: against the floor run's largest row there (or its own floor
    when larger), with the row multiplier."""
    m = _STEP.match(name)
    return m.group(1) if m else None


def scores_verdict(er: Entry, ef: Entry, ec: Entry, rule: FloorRule) -> tuple[bool, str] | None:
    """The scores behind a top-k choice (`ties`) in the numeric pass: right when the candidate's
    error against the reference, over the entries eligible (finite) on all three runs, is within
    the rule's multiples of the floor run's (tensor-wide RMSE, and the largest row's RMSE against
    the floor's largest row). None where the floor is zero there (precision moves nothing: the
    direct rule judges them, as `Judge.three_way` does a zero-floor tensor)."""
    n_rows, row_len = shape_rows(er.shape)
    r, f, c = (to_float64(_all(e), e.dtype).reshape(n_rows, row_len) for e in (er, ef, ec))
    ok = np.isfinite(r) & np.isfinite(f) & np.isfinite(c)
    with np.errstate(invalid="ignore"):  # -inf - -inf where a candidate is not eligible: masked out
        df, dc = np.where(ok, f - r, 0.0), np.where(ok, c - r, 0.0)
    n = max(int(ok.sum()), 1)
    frow, crow = np.sqrt(np.einsum("ij,ij->i", df, df)), np.sqrt(np.einsum("ij,ij->i", dc, dc))
    f_rmse, c_rmse = math.sqrt(float((df * df).sum()) / n), math.sqrt(float((dc * dc).sum()) / n)
    if f_rmse == 0:
        return None
    ratios = {"rmse": _ratio(c_rmse, f_rmse), "row": _ratio(float(crow.max()), float(frow.max()))}
    for stat, what in (("rmse", "RMSE"), ("row", "max row RMSE")):
        if ratios[stat] > getattr(rule, stat):
            return False, f"{what} {ratios[stat]:.3g}× the floor run's (limit {getattr(rule, stat):g}×)"
    return True, ""


def _all(e: Entry) -> np.ndarray:
    r = e.stored.reader()
    try:
        return r.read(0, e.stored.numel)
    finally:
        r.close()


def family_floor(er: Entry, ef: Entry) -> float:
    """The floor run's largest row RMSE of a tensor (what a row of its family is never judged below)."""
    return float(measure(er, ef, ef)["floor"]["row_max"])


def worst_row_max_abs(er: Entry, ef: Entry) -> float:
    """max |F - R| on the row of the largest RMSE of F - R (streamed in whole rows)."""
    n_rows, row_len = shape_rows(er.shape)
    step = max(row_len, (CHUNK_ROWS_ELEMS // row_len) * row_len)
    best, at = -1.0, 0.0
    readers = [e.stored.reader() for e in (er, ef)]
    try:
        for s in range(0, er.stored.numel, step):
            e = min(er.stored.numel, s + step)
            r, f = (to_float64(rd.read(s, e), ent.dtype).reshape(-1, row_len) for rd, ent in zip(readers, (er, ef)))
            with np.errstate(invalid="ignore"):  # -inf - -inf (ineligible scores): masked out
                d = np.where(np.isfinite(r) & np.isfinite(f), f - r, 0.0)
            sq = np.einsum("ij,ij->i", d, d)
            i = int(np.argmax(sq))
            if sq[i] > best:
                best, at = float(sq[i]), float(np.max(np.abs(d[i])))
    finally:
        for rd in readers:
            rd.close()
    return at


# ----------------------------------------------------------------------------- the engine's profile

# How far above the clean engine's own worst a measured multiplier sits: the default rule's
# margin over a clean ratio of 1 (rmse 1.15, row 1.5, cosine 1.3), and for the outlier rows the
# margin the defaults keep over the worst clean row measured on the CPU (2.0 over ~1.6).
OUTLIER_MARGIN = 1.25


@dataclass
class Profile:
    """The clean engine's ratios to the floor, per tensor and statistic, over a gate's images."""

    ratios: dict = None  # tensor -> stat -> [ratio per image]
    worst_row: dict = None  # tensor -> [worst row's × floor per image]
    same: dict = None  # tensor -> [engine equal to the floor run bit for bit, per image]
    images: int = 0
    failed: list = None  # images whose clean run diverged under the default rule
    by_image: dict = None  # tensor -> stat -> image -> [ratio per run]

    def __post_init__(self):
        self.ratios, self.worst_row, self.failed = self.ratios or {}, self.worst_row or {}, self.failed or []
        self.same = self.same or {}
        self.by_image = self.by_image or {}

    def add(self, report, image: str = "", run: int = 0) -> None:
        """One clean numeric-pass report (`three_way` of the clean engine); `run` > 0 is a repeat
        of an image already added (`calibrate --repeats`): a sample of run-to-run variation."""
        if run == 0:
            self.images += 1
        if report.verdict != "match":
            self.failed.append(f"{image}{f' (run {run + 1})' if run else ''}: "
                               f"{'; '.join(b.reason for b in report.boundaries if b.reason)[:300]}")
        for b in report.boundaries:
            for t in b.tensors:
                if t.mode != "floor" or t.metrics.get("exact_floor"):
                    continue
                self.same.setdefault(t.name, []).append(bool(t.metrics.get("equals_floor_run")))
                per = self.ratios.setdefault(t.name, {})
                per_image = self.by_image.setdefault(t.name, {})
                for stat in RATIOS:
                    v = t.metrics["ratios"][stat]
                    if math.isfinite(v):
                        per.setdefault(stat, []).append(float(v))
                        per_image.setdefault(stat, {}).setdefault(f"{self.images}:{image}", []).append(float(v))
                if t.metrics["worst_rows"]:
                    self.worst_row.setdefault(t.name, []).append(float(t.metrics["worst_rows"][0]["x_floor"]))

    def summary(self) -> dict:
        """tensor -> stat -> {min, median, max, n}: what a calibration file stores as [profile]."""
        out = {name: {stat: {"min": min(v), "median": float(np.median(v)), "max": max(v), "n": len(v),
                             **self._spreads(name, stat)}
                      for stat, v in per.items() if v}
               for name, per in self.ratios.items()}
        # where the clean engine is the oracle's own arithmetic in this precision (a position
        # table computed the same way), it must stay bit-equal to the floor run
        for name, same in self.same.items():
            if same and all(same) and len(same) >= 1 and name in out:
                out[name]["equals_floor_run"] = {"all": True, "n": len(same)}
        return out

    def _spreads(self, name: str, stat: str) -> dict:
        """With repeated runs: the images' spread (max - min of their per-image medians) and the
        run-to-run spread (the largest max - min over one image's runs), recorded apart."""
        runs = self.by_image.get(name, {}).get(stat, {})
        if not runs or all(len(v) < 2 for v in runs.values()):
            return {}
        medians = [float(np.median(v)) for v in runs.values()]
        return {"images": len(runs), "repeats": max(len(v) for v in runs.values()),
                "image_spread": max(medians) - min(medians),
                "run_spread": max(max(v) - min(v) for v in runs.values())}

    def rule(self, base: FloorRule = DEFAULT_RULE) -> FloorRule:
        """Multipliers for this engine: the default, or the default's margin above the engine's
        own worst clean ratio where that is higher (a GPU engine with fused kernels), so the
        clean engine passes its own gate; the profile band then guards the few-percent drifts."""
        worst = {stat: max((max(per[stat]) for per in self.ratios.values() if per.get(stat)), default=0.0)
                 for stat in RATIOS}
        row = max((max(v) for v in self.worst_row.values() if v), default=0.0)
        return FloorRule(**{stat: max(getattr(base, stat), getattr(base, stat) * worst[stat]) for stat in RATIOS},
                         outlier=max(base.outlier, OUTLIER_MARGIN * row), max_outliers=base.max_outliers)
