"""Errors the engine raises for bad input; the CLI turns them into one line and exit 2."""
from tensordiff.errors import BadInput


class EngineInputError(BadInput):
    pass
