"""bench/bf16_verdict.py runs on the CPU (tiny, one picture) and writes its table: the clean
engine passes the numeric pass, each numeric fault is caught there at its boundary and the
approximation fault by the semantic pass (it is a smoke test of the H200 script, called in this
process: its command line is argparse's)."""
from __future__ import annotations

import json

import tensordiff.models.deepseek_v41_flash.faults as D


def test_bf16_verdict_tiny_writes_its_table(tmp_path, bench, capsys):
    rc = bench("bf16_verdict").main(["--out", str(tmp_path), "--models", "deepseek-v4.1-flash", "--quick",
                                     "--pictures", "1", "--fault-images", "1"])
    assert rc == 0, capsys.readouterr().out[-3000:]
    res = json.loads((tmp_path / "bf16_verdict.json").read_text())
    m = res["models"]["deepseek-v4.1-flash"]
    (clean,) = m["clean"].values()
    assert clean["verdict"] == "match"
    assert set(clean["ratios"]) == {"block0", "final_norm", "aligner"}
    expect = {D.RESIDUAL_SCALE: "block0", D.TAIL_ROW_SCALE: "block0", D.NORM_EPS: "final_norm",
              D.SPLITK_BF16: "aligner"}
    for fault, boundary in expect.items():
        (one,) = m["faults"][fault].values()
        assert one["earliest"] == [boundary], (fault, one)
    (sem,) = m["semantic"][D.GELU_TANH].values()
    assert sem["earliest"] == ["aligner"]
    md = (tmp_path / "bf16_verdict.md").read_text()
    assert "| block0 |" in md and "clean rmse min/med/max" in md
