"""Running the `tensordiff` command line inside a test: (exit status, stdout, stderr)."""
from __future__ import annotations

import pytest

from tensordiff.commands.cli import main


def run_cli(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err
