"""The collector and a command's long-lived heap: frozen after torch's import in a command's own
process, never in a test session's or a library caller's."""
import gc
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from tensordiff import BadInput
from tensordiff.commands import heap
from tensordiff.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_outside_a_commands_own_process_nothing_is_frozen(monkeypatch):
    monkeypatch.setattr(heap, "_own", False)
    before = gc.get_freeze_count()
    assert heap.freeze_torch() is False
    assert gc.get_freeze_count() == before and gc.isenabled()


def test_in_a_commands_own_process_torch_is_imported_and_frozen_out_of_the_collector():
    code = ("import gc, sys\n"
            "from tensordiff.commands import heap\n"
            "heap.own_process()\n"
            "assert heap.freeze_torch() is True and heap.freeze_torch() is False\n"  # once
            "frozen = gc.get_freeze_count()\n"
            "print(frozen, len(gc.get_objects()), 'torch' in sys.modules, gc.isenabled())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout.split()
    frozen, tracked = int(out[0]), int(out[1])
    # torch's objects are in the permanent generation: a full collection walks a few percent of them
    assert frozen > 50_000 and tracked < frozen / 10, out
    assert out[2:] == ["True", "True"]  # torch imported, the collector running again


def test_only_the_console_entry_point_marks_its_process_as_the_command(monkeypatch, capsys):
    monkeypatch.setattr(heap, "_own", False)
    run_cli(["faults"], capsys)  # main([...]): a test, or a caller's process
    assert heap._own is False
    monkeypatch.setattr(sys, "argv", ["tensordiff", "faults"])
    with pytest.raises(SystemExit):
        main()  # the console script
    assert heap._own is True  # monkeypatch puts False back: this test session stays unfrozen


@pytest.mark.parametrize("command", ["check", "gate"])
def test_check_and_gate_freeze_before_they_run(command, monkeypatch, capsys, tmp_path):
    import tensordiff.commands.cli as cli

    calls = []
    monkeypatch.setattr(heap, "freeze_torch", lambda: calls.append("freeze"))

    def run(*a, **k):
        calls.append("run")
        raise BadInput("stop here")

    monkeypatch.setattr(cli, "run_check", run)  # the case and the gate as the CLI calls them
    monkeypatch.setattr(cli, "run_gate", run)
    if command == "check":
        args = ["check", "deepseek-v4.1-flash"]
    else:
        g = tmp_path / "g.toml"
        g.write_text('[gate]\nname = "g"\n[[model]]\nname = "deepseek-v4.1-flash"\nweights = "synthetic:tiny"\n')
        args = ["gate", str(g), "-q"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "stop here" in err
    assert calls == ["freeze", "run"]
