"""Samples the suite makes on first use rather than keeping in git."""
import runpy
from pathlib import Path

IMPORT_DATA = Path(__file__).resolve().parent / "data" / "import"


def sglang_sample() -> Path:
    """tests/data/import/sglang/ (tp1/, tp2/): SGLang dumper files, which are `torch.save` pickles
    and so are written by make_sglang_sample.py when first asked for, not tracked."""
    return runpy.run_path(str(IMPORT_DATA / "make_sglang_sample.py"), run_name="sglang_sample")["ensure"]()
