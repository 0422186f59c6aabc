"""Errors a user can act on.

`BadInput` is anything wrong with what the user handed us (files, images, options): the CLI
prints its message as one line and exits 2. Everything else is a bug in tensordiff and keeps
its traceback.
"""


class BadInput(ValueError):
    """Bad input or usage: one clear line, exit status 2."""


class IncomparableDumps(BadInput):
    """Two dumps that cannot be compared at all (different models, same directory)."""
