"""The ``pgrag`` command line: one module per command group, shared options in ``options``.

``main`` builds the group (``pgrag.cli.main``) and names the other modules' commands, each module
imported only when one of its commands runs; the commands parse arguments, call the library
and print. Exit codes: ``pgrag.errors`` (each error class's ``exit_code``), listed in
``pgrag --help``; every error, usage errors included, is one line on stderr.
"""

from pgrag.cli.main import cli, main

__all__ = ["cli", "main"]
