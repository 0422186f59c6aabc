"""The house rules of the design card, checked on the source tree."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports(pkg: str) -> dict[str, set[str]]:
    out = {}
    for p in (ROOT / pkg).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        out[str(p.relative_to(ROOT))] = names
    return out


def test_engine_never_imports_oracle():
    bad = [f for f, n in imports("engine").items() if "oracle" in n]
    assert not bad, f"engine imports oracle: {bad}"


def test_oracle_never_imports_engine():
    bad = [f for f, n in imports("oracle").items() if "engine" in n]
    assert not bad, f"oracle imports engine: {bad}"


def test_core_never_imports_model_code():
    # adapters name their runners as strings (`adapter.lazy`) and their oracle sources as module
    # names found without importing (`provenance.source_files`): no file of the core imports them
    bad = [f for f, n in imports("tensordiff").items() if n & {"oracle", "engine"}]
    assert not bad, f"core modules import model code: {bad}"


def test_the_rule_sees_an_import(tmp_path, monkeypatch):
    # the fault that proves the rule: a core file importing the oracle is caught
    pkg = tmp_path / "tensordiff"
    pkg.mkdir()
    (pkg / "leak.py").write_text("def f():\n    from oracle.deepseek_v41_flash import run\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert imports("tensordiff") == {"tensordiff/leak.py": {"oracle"}}


def test_importing_compare_loads_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = ("import sys, tensordiff.compare\n"
            "bad = [m for m in ('torch', 'transformers', 'oracle', 'engine') if m in sys.modules]\n"
            "assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr


def test_compare_works_without_model_code():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['oracle'] = None; sys.modules['engine'] = None\n"
            "from tensordiff.compare import compare_dumps\n"
            f"r = compare_dumps(r'{ROOT}/dumps/sample-oracle', r'{ROOT}/dumps/sample-engine')\n"
            "assert r.earliest == ['rope'], r.earliest")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


HEAVY = ("torch", "scipy", "sympy", "transformers", "rich", "h5py", "safetensors")


def _modules_after(code: str) -> set[str]:
    import json
    import subprocess
    import sys

    probe = code + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stdout.strip().splitlines()[-1]))


def test_the_compare_command_imports_nothing_heavy():
    # `tensordiff compare` on the sample dumps, piped (no terminal: no rich), as CI runs it
    code = ("import sys\nfrom tensordiff.cli import cli\n"
            f"sys.argv = ['tensordiff', 'compare', r'{ROOT}/dumps/sample-oracle', r'{ROOT}/dumps/sample-engine']\n"
            "try:\n    cli()\nexcept SystemExit:\n    pass")
    loaded = _modules_after(code)
    assert "tensordiff" in loaded and "numpy" in loaded  # the probe saw the run
    bad = sorted(loaded & set(HEAVY))
    assert not bad, f"`tensordiff compare` imports {bad}"


def test_the_heavy_import_check_sees_a_heavy_import():
    # the fault that proves the check above: a run that imports one of them is caught
    assert "scipy" in _modules_after("import scipy")
