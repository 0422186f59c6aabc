"""tensordiff: tensor-boundary differential testing for multimodal inference engines.

The public surface is small: record tensors (`Recorder`, or `tap` a torch module's submodules
into one), read dumps (`open_dump`), compare them (`compare_dumps`) and load tolerances
(`load_tolerances`). The CLI mirrors it.
"""
from tensordiff.version import VERSION as __version__  # noqa: E402

from tensordiff.format.capture import MemoryRecorder, NullRecorder, Recorder  # noqa: E402
from tensordiff.errors import BadInput  # noqa: E402


def __getattr__(name):  # lazy: importing tensordiff stays cheap (no numpy work, no models)
    if name == "compare_dumps":
        from tensordiff.pipeline.compare import compare_dumps

        return compare_dumps
    if name == "open_dump":
        from tensordiff.format.dump import open_dump

        return open_dump
    if name == "tap":  # torch is imported only when a tap is made
        from tensordiff.format.taps import tap

        return tap
    if name == "load_tolerances":
        from tensordiff.judge.tolerance import load

        return load
    raise AttributeError(name)


__all__ = ["Recorder", "NullRecorder", "MemoryRecorder", "BadInput", "compare_dumps", "open_dump", "load_tolerances",
           "tap"]
