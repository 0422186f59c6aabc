"""bench/real_dims_layers.py on the tiny config (called in this process): it writes a
layer-subset checkpoint (vision symlinked, only the chosen language layers written), both sides
agree in fp32, the planted fault is caught, and the report has the fields the closing note quotes."""
from __future__ import annotations

import json


def test_tiny_layer_subset_report(tmp_path, bench):
    out, work = tmp_path / "out", tmp_path / "work"
    bench("real_dims_layers").main(["--out", str(out), "--config", "tiny", "--layers", "2-5", "--dtype", "float32",
                                    "--cells", "4", "6", "-o", "language_numerics=semantic", "--work", str(work)])
    rep = json.loads((out / "real_dims_layers.json").read_text())
    assert rep["verdict"] == "match" and rep["not_matching"] == [] and rep["boundaries"] > 10
    assert rep["fault_caught"] and rep["fault_earliest"] == ["router.2.weights"]
    assert "router.2.weights" in rep["fault_new_divergences"]
    for k in ("write_checkpoint_s", "oracle_s", "engine_s", "engine-fault_s"):
        assert rep[k] > 0
    index = json.loads((work / "ckpt" / "model.safetensors.index.json").read_text())["weight_map"]
    layers = {int(n.split(".")[1]) for n in index if n.startswith("layers.")}
    assert layers == {2, 3, 4, 5}  # only the subset's tensors exist
    assert all((work / "ckpt" / f).is_symlink() for n, f in index.items() if n.startswith("vision."))
