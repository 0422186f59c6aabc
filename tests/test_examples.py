"""Every shell example of README.md and docs/ and every example of each command's `--help` runs as
written from the repository root and exits as it says: a `# exit N` comment on the line, else 0.

The examples run in a scratch directory that links every top-level entry of the repository, so
the paths they read are the repository's and what they write (report.json, out/...) lands in the
scratch directory. A `tensordiff ...` line runs in this process through the CLI's `main` (one torch
import for all of them); any other line runs through bash, with this interpreter's directory first
on PATH. A block whose first line is a comment saying "not run by tests/test_examples.py" (a GPU,
a downloaded checkpoint) is not run. A line that reads only the repository and that already ran
(the README and the help share examples) is not run again.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tensordiff.commands.cli import cli, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
SKIP_LINKS = {".git", ".venv", "venv", "out", "__pycache__", ".pytest_cache", "build"}
SHELL_OPERATORS = {"&&", "||", "|", ";", "&", ">", ">>", "<", "<<", "(", ")"}
EXIT_RE = re.compile(r"\bexit (\d+)\b")
_ran: dict[str, int] = {}  # command line -> exit status, for lines that read only the repository


def split_comment(line: str) -> tuple[str, str]:
    """(the command, its trailing `#` comment), a `#` inside quotes being part of the command."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def commands(lines: list[str]) -> list[tuple[str, int]]:
    """(command, expected exit status) for each command of a block; `\\` continues a line."""
    out, pending = [], ""
    for raw in lines:
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        cmd, comment = split_comment(line)
        if cmd:
            m = EXIT_RE.search(comment)
            out.append((cmd, int(m.group(1)) if m else 0))
    return out


def shell_blocks(doc: Path) -> list[list[str]]:
    """The lines of every ```sh / ```bash block of a Markdown file, in order."""
    blocks, current = [], None
    for line in doc.read_text().splitlines():
        if current is None and re.fullmatch(r"```(sh|bash)\s*", line):
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def help_text(path: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([*path, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0, out
    return out


def help_examples(text: str) -> list[str]:
    """The example lines under a help text's "(from the repository root):" heading."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().endswith("(from the repository root):"))
    block = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        if line.strip().startswith("tensordiff ") or (block and block[-1].rstrip().endswith("\\")):
            block.append(line)
    return block


def command_paths() -> list[list[str]]:
    paths = [[]]
    for name, cmd in sorted(cli.commands.items()):
        paths.append([name])
        if isinstance(cmd, click.Group):
            paths += [[name, sub] for sub in sorted(cmd.commands)]
    return paths


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A scratch directory that reads as the repository root."""
    ws = tmp_path_factory.mktemp("examples")
    for entry in ROOT.iterdir():
        if entry.name not in SKIP_LINKS and not entry.name.endswith(".egg-info"):
            (ws / entry.name).symlink_to(entry)
    (ws / "tmp").mkdir()
    return ws


def run(cmd: str, ws: Path, capsys, monkeypatch) -> tuple[int, str]:
    """Run one example line in the workspace: (exit status, its output)."""
    tokens = list(shlex.shlex(cmd, posix=True, punctuation_chars=True))
    if tokens[0] == "tensordiff" and not SHELL_OPERATORS & set(tokens):
        monkeypatch.chdir(ws)
        capsys.readouterr()
        try:
            main(shlex.split(cmd)[1:])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        finally:
            monkeypatch.undo()
        out = capsys.readouterr()
        return code, out.out + out.err
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "TMPDIR": str(ws / "tmp")}  # torchrun's agent leaves a directory there
    r = subprocess.run(["bash", "-c", cmd], cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def check_all(cmds: list[tuple[str, int]], ws: Path, capsys, monkeypatch) -> None:
    failures = []
    for cmd, want in cmds:
        reads_only = "out/" not in cmd
        if reads_only and cmd in _ran:
            code, output = _ran[cmd], "(ran earlier)"
        else:
            code, output = run(cmd, ws, capsys, monkeypatch)
            if reads_only:
                _ran[cmd] = code
        if code != want:
            failures.append(f"{cmd}\n  exit {code}, documented {want}\n{output[-1500:]}")
    assert not failures, "\n\n".join(failures)


NOT_RUN = "not run by tests/test_examples.py"


def runnable(blocks: list[list[str]]) -> list[tuple[str, int]]:
    return [c for block in blocks if not (block and block[0].strip().startswith("#") and NOT_RUN in block[0])
            for c in commands(block)]


def test_the_readme_opens_with_the_install_and_ci_s_test_command():
    first = commands(shell_blocks(ROOT / "README.md")[0])
    assert [c for c, _ in first] == [
        'pip install torch==2.13.0 && pip install -e ".[test]" && tensordiff check deepseek-v4.1-flash',
        "python -m pytest -q"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == first[1][0]  # CI runs exactly the README's test command


def test_every_readme_shell_example_runs_as_written(workspace, capsys, monkeypatch):
    blocks = shell_blocks(ROOT / "README.md")
    # the opening block: the install is the environment this test runs in, and the suite is this
    # run; what is left to run is the main job at the end of the install line
    cmds = [("tensordiff check deepseek-v4.1-flash", 0)] + runnable(blocks[1:])
    assert len(cmds) > 10
    check_all(cmds, workspace, capsys, monkeypatch)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_shell_example_runs_as_written(doc, workspace, capsys, monkeypatch):
    cmds = runnable(shell_blocks(doc))
    if not cmds:
        pytest.skip(f"{doc.name} has no shell example")
    check_all(cmds, workspace, capsys, monkeypatch)


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "tensordiff")
def test_every_help_example_runs_as_written(path, workspace, capsys, monkeypatch):
    text = help_text(path, capsys)
    cmds = commands(help_examples(text))
    assert cmds, f"`tensordiff {' '.join(path)} --help` shows no example"
    if path:  # a command's help ends with its exit statuses
        last = text.rstrip().split("\n\n")[-1]
        assert last.strip().startswith("Exit status"), last
    check_all(cmds, workspace, capsys, monkeypatch)
