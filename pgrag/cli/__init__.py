"""The ``pgrag`` command line: one module per command group, shared options in ``options``.

``main`` builds the group and registers every command (``pgrag.cli.main``); the commands parse
arguments, call the library and print. Exit codes: ``pgrag.errors`` (each error class's
``exit_code``), listed in ``pgrag --help``.
"""

from pgrag.cli.main import cli, main

__all__ = ["cli", "main"]
