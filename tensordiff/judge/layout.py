"""What an element index means on the picture: patch (y, x), token cell, sequence position."""
from __future__ import annotations


def _grid(run: dict, key: str) -> tuple[int, int] | None:
    g = (run.get("inputs") or {}).get(key)
    if isinstance(g, (list, tuple)) and len(g) == 2 and all(isinstance(v, int) and v > 0 for v in g):
        return int(g[0]), int(g[1])
    return None


def row_position(layout: str, row: int, run: dict) -> tuple[int, int] | None:
    """(y, x) on the patch grid (or cell grid for "cells"/"merged") for a leading-dim row."""
    if layout == "grid":
        g = _grid(run, "grid")
        return divmod(row, g[1]) if g else None
    if layout == "merge":
        g = _grid(run, "grid")
        if not g or g[1] % 2:
            return None
        blk, intra = divmod(row, 4)
        by, bx = divmod(blk, g[1] // 2)
        return by * 2 + intra // 2, bx * 2 + intra % 2
    if layout == "merged":
        g = _grid(run, "grid")
        return divmod(row, g[1] // 2) if g and g[1] >= 2 else None
    if layout == "cells":
        c = _grid(run, "cells")
        return divmod(row, c[1]) if c else None
    return None


def token_type(pos: int, run: dict) -> str | None:
    """TEXT, START, IMAGE cell (y, x), NEWLINE or END for sequence position `pos`, from the run's
    image span (`language.span_start`, `inputs.cells`): [START] + ([IMAGE] * w + [NEWLINE]) * h + [END]."""
    start = (run.get("language") or {}).get("span_start")
    cells = _grid(run, "cells")
    if not isinstance(start, int) or isinstance(start, bool) or cells is None:
        return None
    ch, cw = cells
    k = pos - start
    span = ch * (cw + 1) + 2
    if k < 0 or k >= span:
        return "TEXT"
    if k == 0:
        return "START"
    if k == span - 1:
        return "END"
    y, x = divmod(k - 1, cw + 1)
    return "NEWLINE" if x == cw else f"IMAGE cell (y={y}, x={x})"


def describe(layout: str, index: tuple[int, ...], run: dict) -> str:
    if not index:
        return "scalar"
    row = index[0]
    rest = index[1:]
    pos = row_position(layout, row, run) if len(index) >= 1 else None
    ch = f", channel {rest[-1]}" if rest else ""
    if layout in ("grid", "merge") and pos:
        return f"patch (y={pos[0]}, x={pos[1]}){ch}"
    if layout in ("cells", "merged") and pos:
        return f"token cell (y={pos[0]}, x={pos[1]}){ch}"
    if layout == "tokens":
        tt = token_type(row, run)
        return f"position {row}{f' ({tt})' if tt else ''}{ch}"
    return f"index {list(index)}"
