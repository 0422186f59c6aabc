"""The cyclic collector and a command's long-lived heap (the CLI's `check` and `gate`).

Importing torch leaves ~170,000 objects that live as long as the process. CPython runs a full
collection whenever the long-lived generation has grown by a quarter since the last one, and a
full collection walks every object: in `check` on the tiny DeepSeek config two of them came after
torch's import, one while the model code and Pillow were imported (60 ms on the 2-core machine)
and one as the interpreter exited (68 ms), a quarter of the command's work beyond torch's import
(bench/command_time.py; the collector's own timings through `gc.callbacks`).

`freeze_torch()` imports torch with the collector paused, then moves everything alive into the
collector's permanent generation (`gc.freeze`, made for this): later collections walk only what
the command itself creates. Nothing alive then is garbage yet; what of it dies later waits for the process's
exit (modules, classes and torch's registries, which live that long anyway). No result changes:
the collector frees cyclic garbage, it computes nothing.

Only a command's own process is frozen (`own_process()`, called by the console entry point):
`main([...])` inside a test session or a library caller's process keeps its collector as it is,
since frozen objects there (models, weights) would never be collected.
"""
from __future__ import annotations

import gc

_own = False


def own_process() -> None:
    """This process is one `tensordiff` command (the console script, `python -m tensordiff.commands.cli`)."""
    global _own
    _own = True


def freeze_torch() -> bool:
    """In a command's own process, import torch (every `check` and `gate` imports it first thing:
    `runs.make_request` warms its kernels before anything runs) and freeze what is alive; once.
    Returns whether it froze now."""
    if not _own or gc.get_freeze_count():
        return False
    gc.disable()  # nor during the import: it makes those objects and ~7,000 of garbage (a few
    try:  # hundred kB, frozen with them), and the collections it would run walk them all again
        import torch  # noqa: F401
    except ImportError:  # no torch here: the run reports that itself, where it needs torch, as before
        pass
    finally:
        gc.freeze()
        gc.enable()
    return True
