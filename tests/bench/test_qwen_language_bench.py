"""bench/qwen_language.py runs end to end on the tiny weights on the CPU (a smoke test, in this
process: the GPU run is the measurement; no timing is asserted). Two photographs run the first
check and the second gate; two faults, one of the prefill and one of decode."""
from __future__ import annotations

import json

import tensordiff.models.qwen3_vl.faults as QF


def test_bench_smoke_writes_its_report(tmp_path, bench, capsys):
    rc = bench("qwen_language").main(["--out", str(tmp_path), "--weights", "synthetic:tiny", "--device", "cpu",
                                      "--photos", "2", "--faults", f"{QF.DEEPSTACK_EVERY_ROW},{QF.DECODE_NO_DELTA}"])
    assert rc == 0, capsys.readouterr().out[-3000:]
    rep = json.loads((tmp_path / "qwen_language.json").read_text())
    assert rep["ok"] and not rep["false_alarms"] and len(rep["clean"]) == 2
    assert all(c["numeric"] == "match" and c["semantic"] == "match" for c in rep["clean"])  # the three-way pass ran
    assert {f["fault"] for f in rep["faults"]} == {QF.DEEPSTACK_EVERY_ROW, QF.DECODE_NO_DELTA}
    assert all(f["caught_at_boundary"] and f["exit"] == 1 for f in rep["faults"])
    assert rep["one_check_seconds"] > 0 and (tmp_path / "qwen_language.md").is_file()
