"""The two sides of toy-gray: a numpy oracle and a loop-based engine (a planted R/B swap)."""
import json
from pathlib import Path

import numpy as np
from PIL import Image


def _coeffs(req):
    return np.array(json.loads((Path(req.weights_dir) / "config.json").read_text())["luma"], dtype=np.float32)


def _pixels(req):
    img = Image.open(req.image).convert("RGB")
    img.thumbnail((32, 32))
    return np.asarray(img, dtype=np.float32) / 255.0


def oracle(req, rec):
    px = _pixels(req)
    gray = px @ _coeffs(req)
    rec.record("gray", gray)
    rec.record("stats", np.stack([gray.mean(1), gray.max(1)], 1).astype(np.float32))


def engine(req, rec):
    px = _pixels(req)
    if req.fault == "swap-rb":
        px = px[..., ::-1]
    c = _coeffs(req)
    gray = np.zeros(px.shape[:2], np.float32)
    for k in range(3):
        gray += px[..., k] * c[k]
    rec.record("gray", gray)
    rec.record("stats", np.stack([gray.mean(1), gray.max(1)], 1).astype(np.float32))
