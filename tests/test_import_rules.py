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

    code = ("import sys, tensordiff.pipeline.compare\n"
            "bad = [m for m in ('torch', 'transformers', 'oracle', 'engine') if m in sys.modules]\n"
            "assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr


def test_compare_works_without_model_code():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['oracle'] = None; sys.modules['engine'] = None\n"
            "from tensordiff.pipeline.compare import compare_dumps\n"
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
    code = ("import sys\nfrom tensordiff.commands.cli import cli\n"
            f"sys.argv = ['tensordiff', 'compare', r'{ROOT}/dumps/sample-oracle', r'{ROOT}/dumps/sample-engine']\n"
            "try:\n    cli()\nexcept SystemExit:\n    pass")
    loaded = _modules_after(code)
    assert "tensordiff" in loaded and "numpy" in loaded  # the probe saw the run
    bad = sorted(loaded & set(HEAVY))
    assert not bad, f"`tensordiff compare` imports {bad}"


def test_the_heavy_import_check_sees_a_heavy_import():
    # the fault that proves the check above: a run that imports one of them is caught
    assert "scipy" in _modules_after("import scipy")


# ----------------------------------------------------------------------------- the core's layers

# Each layer of the core imports only the layers below it (and the base modules). `models/` sits
# beside `pipeline/`: a model's adapter, contract, faults and options are built from the layers
# below and from the pipeline's adapter, option and fault types.
LAYERS = {"format": 1, "judge": 2, "reports": 3, "pipeline": 4, "models": 4, "commands": 5}
BASE = {"errors", "cache", "warmup", "version"}  # tensordiff/<name>.py, importable from every layer
# What oracle/ and engine/ may import of the toolkit: the format they record through, the errors,
# and a model's one table of fault and option names. The DeepSeek torchrun entry writes each rank's
# dump through the pipeline's `run_side`, so every rank carries the core's provenance.
MODEL_CODE_MAY_IMPORT = ("tensordiff.errors", "tensordiff.format", "tensordiff.models.deepseek_v41_flash.faults",
                         "tensordiff.models.deepseek_v41_flash.options", "tensordiff.models.qwen3_vl.faults",
                         "tensordiff.models.qwen3_vl.options")
MODEL_CODE_EXCEPTIONS = {("engine/deepseek_v41_flash/distributed.py", "tensordiff.pipeline.runs")}


def module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def edges(pkg: str, root: Path | None = None) -> list[tuple[str, str, str, bool, str]]:
    """Every import of a tensordiff module under `pkg`: (file, importer, imported, at top level, name)."""
    root = root or ROOT
    out = []
    for p in sorted((root / pkg).rglob("*.py")):
        tree = ast.parse(p.read_text())
        mod = module_of(p, root)
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [(a.name, "") for a in node.names]
            else:
                continue
            for t, name in targets:
                if t.split(".")[0] == "tensordiff":
                    out.append((str(p.relative_to(root)), mod, t, id(node) in top, name))
    return out


def layer(mod: str) -> int | None:
    parts = mod.split(".")
    if len(parts) == 1:
        return 9  # the package's face re-exports the public surface
    return 0 if parts[1] in BASE else LAYERS.get(parts[1])


def upward(root: Path | None = None) -> list[str]:
    bad = []
    for f, mod, t, _, _ in edges("tensordiff", root):
        lm, lt = layer(mod), layer(t)
        if lm is None or lt is None:
            bad.append(f"{f}: {mod} or {t} is in no layer")
        elif lt > lm:
            bad.append(f"{f} imports {t} (layer {lt} above {lm})")
    return bad


def test_the_core_imports_only_downward():
    assert not upward(), upward()


def test_the_layer_rule_sees_an_upward_import(tmp_path):
    # the fault that proves the rule: a judge module importing a report is caught
    (tmp_path / "tensordiff" / "judge").mkdir(parents=True)
    (tmp_path / "tensordiff" / "judge" / "leak.py").write_text("from tensordiff.reports.text import render_text\n")
    assert upward(tmp_path) == ["tensordiff/judge/leak.py imports tensordiff.reports.text (layer 3 above 2)"]


def test_no_module_imports_a_private_name_of_another():
    bad = [f"{f}: {t}.{n}" for f, _, t, _, n in edges("tensordiff") + edges("oracle") + edges("engine")
           if n.startswith("_")]
    assert not bad, bad


def test_the_core_imports_its_own_modules_at_the_top():
    # the lazy doors are torch, transformers and model code; the package's face stays cheap
    bad = [f"{f}: {t}" for f, _, t, at_top, _ in edges("tensordiff") if not at_top and f != "tensordiff/__init__.py"]
    assert not bad, bad


def test_the_core_has_no_import_circle():
    graph: dict[str, set[str]] = {}
    mods = {module_of(p, ROOT) for p in (ROOT / "tensordiff").rglob("*.py")}
    for _, mod, t, _, name in edges("tensordiff"):
        target = f"{t}.{name}" if f"{t}.{name}" in mods else t
        graph.setdefault(mod, set()).add(target)
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError(f"import circle: {' -> '.join(path[path.index(m):] + [m])}")
        if state.get(m) == 2:
            return
        state[m] = 1
        for n in graph.get(m, ()):
            if n != m and not m.startswith(n + "."):  # a package's own face is not a circle
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_oracle_and_engine_reach_the_toolkit_only_through_its_declared_doors():
    bad = [f"{f}: {t}" for f, _, t, _, _ in edges("oracle") + edges("engine")
           if not t.startswith(MODEL_CODE_MAY_IMPORT) and (f, t) not in MODEL_CODE_EXCEPTIONS]
    assert not bad, bad


def test_few_modules_stand_directly_in_the_core():
    direct = sorted(p.name for p in (ROOT / "tensordiff").glob("*.py"))
    assert len(direct) <= 10, direct
