"""Runs the tensordiff command line with some files unreadable, for a process that runs as root
(root reads every file whatever its mode bits, so chmod cannot make one unreadable to it).

    python unreadable.py ARGS...     (environment TD_UNREADABLE: the paths, one per line)

Every open of one of those paths (io.open, os.open) raises PermissionError(EACCES), as the
kernel does for a user without read permission; anything else is untouched. The command then
runs as the console script does (`tensordiff.commands.cli.main()`).
"""
import builtins
import errno
import io
import os
import sys

from tensordiff.commands.cli import main

BLOCKED = {os.path.realpath(p) for p in os.environ.get("TD_UNREADABLE", "").splitlines() if p}


def _denied(path) -> bool:
    try:
        return isinstance(path, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(path)) in BLOCKED
    except (TypeError, ValueError):
        return False


def _guard(real):
    def opener(file, *args, **kw):
        if _denied(file):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(file))
        return real(file, *args, **kw)
    return opener


io.open = builtins.open = _guard(io.open)
os.open = _guard(os.open)

if __name__ == "__main__":
    sys.argv = ["tensordiff", *sys.argv[1:]]
    main()
