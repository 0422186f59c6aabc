"""The adapter: a contract, one fault, two runners named lazily, a weights resolver."""
from pathlib import Path

from tensordiff.pipeline.adapter import ModelAdapter, lazy
from tensordiff.judge.contract import Boundary, Contract
from tensordiff.errors import BadInput
from tensordiff.pipeline.faults import Fault


def weights(spec: str) -> Path:
    if spec != "synthetic:tiny":
        raise BadInput(f"toy-gray has only synthetic:tiny weights, not {spec!r}")
    return Path(__file__).resolve().parent / "weights"


CONTRACT = Contract("toy-gray", (
    Boundary("gray", meaning="luma per pixel, rows of the picture", layout="plain"),
    Boundary("stats", inputs=("gray",), meaning="mean and max per row"),
))

ADAPTER = ModelAdapter(
    name="toy-gray", contract=CONTRACT,
    faults=(Fault("swap-rb", "gray", "the engine reads the picture as BGR"),),
    oracle=lazy("tdtoy.sides:oracle"), engine=lazy("tdtoy.sides:engine"), weights=weights,
    description="a toy third-party model: grayscale conversion",
)
