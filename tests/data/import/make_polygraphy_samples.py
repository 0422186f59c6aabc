"""Writes polygraphy/: Polygraphy's own saved results of a tiny ONNX graph run with ONNX-Runtime.
Needs polygraphy, onnx and onnxruntime (a scratch venv, not the project's):
    python -m venv --system-site-packages /tmp/venv-pg && /tmp/venv-pg/bin/pip install polygraphy onnx onnxruntime
    cd tests/data/import && /tmp/venv-pg/bin/python make_polygraphy_samples.py

outputs.json   `polygraphy run tiny.onnx --onnxrt --onnx-outputs mark all --save-outputs` (every
               intermediate; ONNX names such as /proj/MatMul_output_0; float32, float16, int64)
inputs.json    the same run's --save-inputs
two_runners.json  RunResults of two ONNX-Runtime runners, two iterations each (Comparator.run)
torch.json     RunResults holding a torch tensor: Polygraphy encodes it with torch.save (a pickle);
               written by `python make_polygraphy_samples.py torch` with an interpreter that has
               torch and polygraphy (e.g. the project's, with polygraphy's directory on PYTHONPATH)
"""
import subprocess
import sys
from pathlib import Path

import numpy as np

OUT = Path("polygraphy")
OUT.mkdir(exist_ok=True)
if sys.argv[1:] == ["torch"]:
    import torch
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    res = RunResults()
    res.append(("torch-runner", [IterationResult({"t": torch.ones(2)}, runner_name="torch-runner")]))
    res.save(str(OUT / "torch.json"))
    sys.exit(0)

import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

rng = np.random.default_rng(0)
W = numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "W")
B = numpy_helper.from_array(rng.standard_normal((6,)).astype(np.float32), "B")
nodes = [
    helper.make_node("MatMul", ["x", "W"], ["/proj/MatMul_output_0"], name="/proj/MatMul"),
    helper.make_node("Add", ["/proj/MatMul_output_0", "B"], ["/proj/Add_output_0"], name="/proj/Add"),
    helper.make_node("Relu", ["/proj/Add_output_0"], ["hidden"], name="/act/Relu"),
    helper.make_node("Softmax", ["hidden"], ["probs"], name="/head/Softmax", axis=-1),
    helper.make_node("Cast", ["probs"], ["probs_fp16"], name="/head/Cast", to=TensorProto.FLOAT16),
    helper.make_node("ArgMax", ["probs"], ["ids"], name="/head/ArgMax", axis=-1, keepdims=0),
]
graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [2, 3, 6]),
                           helper.make_tensor_value_info("probs_fp16", TensorProto.FLOAT16, [2, 3, 6]),
                           helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])], [W, B])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, OUT / "tiny.onnx")
polygraphy = Path(sys.executable).with_name("polygraphy")
subprocess.run([str(polygraphy), "run", str(OUT / "tiny.onnx"), "--onnxrt", "--onnx-outputs", "mark", "all",
                "--seed", "1", "--save-outputs", str(OUT / "outputs.json"), "--save-inputs", str(OUT / "inputs.json")],
               check=True)

from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx  # noqa: E402
from polygraphy.comparator import Comparator, DataLoader  # noqa: E402

runners = [OnnxrtRunner(SessionFromOnnx(str(OUT / "tiny.onnx")), name=n) for n in ("ort-a", "ort-b")]
Comparator.run(runners, data_loader=DataLoader(seed=2, iterations=2)).save(str(OUT / "two_runners.json"))
