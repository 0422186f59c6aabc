"""Entry points: a third-party package registers a model adapter in the `tensordiff.models`
group and `tensordiff check` runs it. The fixture package (tests/data/adapter_pkg: `tdtoy` and
its .dist-info with entry_points.txt) is put on sys.path, which is what installing it does;
offline and with no pip."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "tests" / "data" / "adapter_pkg"


def tensordiff(*args, tmp_path, extra_path=PKG):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(extra_path)]),
               TENSORDIFF_CACHE=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "tensordiff.commands.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def test_the_installed_adapter_is_listed_and_checked_clean(tmp_path):
    p = tensordiff("faults", "toy-gray", tmp_path=tmp_path)
    assert p.returncode == 0 and "swap-rb" in p.stdout and "-> gray" in p.stdout, p.stderr
    p = tensordiff("check", "toy-gray", "--json", tmp_path / "r.json", tmp_path=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "MATCH: all 2 boundaries" in p.stdout


def test_its_planted_fault_is_caught_where_it_declares(tmp_path):
    p = tensordiff("check", "toy-gray", "--fault", "swap-rb", tmp_path=tmp_path)
    assert p.returncode == 1 and "earliest divergence at `gray`" in p.stdout, p.stdout + p.stderr


def test_without_the_package_the_model_is_unknown(tmp_path):
    p = tensordiff("check", "toy-gray", tmp_path=tmp_path, extra_path=tmp_path)
    assert p.returncode == 2 and "unknown model 'toy-gray'" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_broken_entry_point_is_one_line_naming_the_package(tmp_path):
    bad = tmp_path / "site"
    (bad / "tdbad-0.1.dist-info").mkdir(parents=True)
    (bad / "tdbad-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tdbad\nVersion: 0.1\n")
    (bad / "tdbad-0.1.dist-info" / "entry_points.txt").write_text(
        "[tensordiff.models]\nbad-missing = tdbad_nowhere:ADAPTER\nbad-type = string:ascii_letters\n")
    p = tensordiff("check", "bad-missing", tmp_path=tmp_path, extra_path=bad)
    assert p.returncode == 2 and "reinstall tdbad" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = tensordiff("faults", "bad-type", tmp_path=tmp_path, extra_path=bad)
    assert p.returncode == 2 and "not a tensordiff.pipeline.adapter.ModelAdapter" in p.stderr, p.stderr


def test_a_model_no_distribution_declares_is_absent_without_importlib_metadata(tmp_path):
    code = ("import sys; from tensordiff.pipeline import registry; assert registry.contract('no-such-model') is None; "
            "print('importlib.metadata' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(PKG)]), TENSORDIFF_CACHE=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr


def test_the_fast_negative_never_hides_an_installed_adapter(monkeypatch, tmp_path):
    """Only a "no" is decided without importlib.metadata: a dist-info declaring the name, a zip
    on the path, or another finder of distributions sends the lookup to importlib.metadata."""
    from tensordiff.pipeline import registry

    monkeypatch.syspath_prepend(str(PKG))
    assert registry._may_declare("toy-gray") and not registry._may_declare("no-such-model")
    assert registry.contract("toy-gray") is not None  # the fixture package's adapter, found
    zipped = tmp_path / "site.zip"
    zipped.write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip archive
    monkeypatch.syspath_prepend(str(zipped))
    assert registry._may_declare("no-such-model")

    class Finder:
        @staticmethod
        def find_distributions(context=None):
            return iter(())

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(zipped)])
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder])
    assert registry._may_declare("no-such-model")


def test_entry_points_are_scanned_once_per_sys_path(monkeypatch):
    # in process: a second lookup reuses the scan; a folder added to sys.path (what installing
    # a package into a fresh site dir does) is seen, as the fault of a scan kept too long
    import importlib.metadata

    from tensordiff.pipeline import registry

    scans = []
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: scans.append(kw) or real(**kw))
    monkeypatch.setattr(registry, "_FOUND", {})
    first = registry.names()
    assert registry.names() == first and len(scans) == 1
    assert "toy-gray" not in first
    monkeypatch.syspath_prepend(str(PKG))
    assert "toy-gray" in registry.names() and len(scans) == 2
