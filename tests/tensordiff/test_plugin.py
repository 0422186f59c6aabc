import shutil
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "dumps"

TEST = """
from pathlib import Path
def test_engine(tensordiff_baseline):
    tensordiff_baseline.check(Path(r"{produced}"), baseline=Path(r"{baseline}"))
"""


def test_missing_baseline_is_written_then_passes(pytester, tmp_path):
    base = tmp_path / "base"
    pytester.makepyfile(TEST.format(produced=SAMPLES / "sample-oracle", baseline=base))
    r = pytester.runpytest()
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*baseline written*"])
    assert (base / "manifest.json").is_file()
    pytester.runpytest().assert_outcomes(passed=1)


def test_divergence_fails_with_the_report(pytester, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(SAMPLES / "sample-oracle", base)
    pytester.makepyfile(TEST.format(produced=SAMPLES / "sample-engine", baseline=base))
    r = pytester.runpytest()
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*DIVERGED: earliest divergence at `rope`*", "*--tensordiff-regen*"])
    assert "Traceback" not in r.stdout.str()


def test_regen_refreshes_the_baseline(pytester, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(SAMPLES / "sample-oracle", base)
    pytester.makepyfile(TEST.format(produced=SAMPLES / "sample-engine", baseline=base))
    pytester.runpytest("--tensordiff-regen").stdout.fnmatch_lines(["*baseline refreshed*"])
    pytester.runpytest().assert_outcomes(passed=1)


def test_default_baseline_location(pytester):
    pytester.makepyfile(test_loc=f"""
from pathlib import Path
def test_a(tensordiff_baseline):
    tensordiff_baseline.check(Path(r"{SAMPLES / 'sample-oracle'}"))
""")
    pytester.runpytest().assert_outcomes(failed=1)
    assert (pytester.path / "test_loc" / "test_a.tensordiff" / "manifest.json").is_file()
