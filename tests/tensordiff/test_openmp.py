"""The CLI's OpenMP workers sleep between parallel regions (tensordiff/commands/openmp.py): the runtime torch
loads in a CLI process reports no spinning, a user's own policy is kept, and too late is said."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _spin_count(code: str, **env) -> str:
    """GOMP_SPINCOUNT as GNU OpenMP reports it at load (OMP_DISPLAY_ENV) in a fresh process."""
    pytest.importorskip("torch")
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    e.update(PYTHONPATH=str(ROOT), OMP_DISPLAY_ENV="VERBOSE", **env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"GOMP_SPINCOUNT = '(\d+)'", r.stderr)
    if m is None:
        pytest.skip("torch's OpenMP runtime is not GNU OpenMP (no GOMP_SPINCOUNT in its OMP_DISPLAY_ENV)")
    return m.group(1)


def test_a_cli_process_has_sleeping_workers():
    assert _spin_count("import tensordiff.commands.cli, torch; torch.ones(1 << 16).sum()") == "0"


def test_without_it_workers_spin():
    # the fault that proves the check: torch imported before the CLI is too late to ask
    assert _spin_count("import torch, tensordiff.commands.cli; torch.ones(1 << 16).sum()") != "0"


def test_a_users_policy_is_kept():
    assert _spin_count("import tensordiff.commands.cli, torch, os; assert os.environ['OMP_WAIT_POLICY'] == 'ACTIVE'",
                       OMP_WAIT_POLICY="ACTIVE") != "0"


def test_it_says_when_it_is_too_late(monkeypatch):
    from tensordiff.commands import openmp

    monkeypatch.setenv(openmp.VARIABLE, "unset")  # restored (removed) after the test
    monkeypatch.delenv(openmp.VARIABLE)
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    assert openmp.passive_waits() is False
    assert openmp.VARIABLE not in os.environ


def test_it_sets_the_policy_before_torch(monkeypatch):
    from tensordiff.commands import openmp

    monkeypatch.setenv(openmp.VARIABLE, "unset")  # restored (removed) after the test
    monkeypatch.delenv(openmp.VARIABLE)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert openmp.passive_waits() is True
    assert os.environ[openmp.VARIABLE] == "PASSIVE"
