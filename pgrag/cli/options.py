"""What the command modules share: the options that mean the same everywhere (one
definition each, sqlite-utils style), the database URL, progress bars, summaries.

Names: ``--json`` is a flag (print JSON to stdout); ``--output FILE`` writes to a file;
``--embedder SPEC`` chooses the embedder (``--model`` is its deprecated alias, kept for one
release); ``--seed N`` seeds what is random.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pgrag.config import ENV_EMBEDDER

if TYPE_CHECKING:
    from pgrag.documents import RebuildStats

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

F = TypeVar("F", bound=Callable[..., Any])


class Group(click.Group):
    """A command group whose listing shows each command's first sentence whole, wrapped if
    long: click cuts it at the terminal's width with "...", mid-sentence."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


EMBEDDER_HELP = (
    "Embedder: sentence-transformers (default, all-MiniLM-L6-v2 bundled), "
    "sentence-transformers:PATH, onnx (same model, no PyTorch), onnx:DIR, openai:MODEL. "
    "Env: PGRAG_EMBEDDER. (--model: the same, deprecated.)"
)


def embedder_option(*, required: bool = False, help: str = EMBEDDER_HELP) -> Callable[[F], F]:
    """``--embedder SPEC`` (alias ``--model``), into the parameter ``embedder_spec``."""
    return click.option(
        "--embedder",
        "--model",
        "embedder_spec",
        metavar="SPEC",
        envvar=ENV_EMBEDDER,
        required=required,
        help=help,
    )


def json_option(help: str = "Print JSON.") -> Callable[[F], F]:
    """``--json``: a flag, into ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def output_option(help: str = "Write the result to FILE.") -> Callable[[F], F]:
    """``--output FILE``, into ``output`` (a Path or None)."""
    return click.option(
        "--output",
        "-o",
        "output",
        metavar="FILE",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        help=help,
    )


def seed_option(default: int = 42, help: str = "Random seed.") -> Callable[[F], F]:
    return click.option("--seed", type=int, default=default, show_default=True, help=help)


def no_progress_option() -> Callable[[F], F]:
    """``--no-progress``, into ``no_progress``."""
    return click.option("--no-progress", is_flag=True, help="Do not show progress bars.")


def customers_option(
    default: int = 200, high: int | None = 100_000, help: str = "Sample shop size (customers)."
) -> Callable[[F], F]:
    """``--customers N``: the sample shop's size (about 10 orders each). ``high`` None: any
    number, checked by the library (one line, exit 2)."""
    return click.option(
        "--customers",
        type=int if high is None else click.IntRange(200, high),
        default=default,
        show_default=True,
        metavar="N",
        help=f"{help} About 10 orders each.",
    )


def url_of(ctx: click.Context) -> str:
    """The database URL from the main group's state, else PGRAG_DATABASE_URL / embedded."""
    state = ctx.find_root().obj
    if state is not None and hasattr(state, "url"):
        return str(state.url())
    from pgrag.connection import resolve_url

    return resolve_url(None)


def rebuild_progress(unit: str = "document") -> Callable[[str, int, int], None]:
    """Progress per name (document type, stage), fed by a (name, done, total) callback: a bar
    on a terminal, plain lines elsewhere (``EmbedProgress``)."""
    from pgrag.embed.progress import EmbedProgress

    shown: dict[str, EmbedProgress] = {}

    def update(doc_type: str, done: int, total: int) -> None:
        progress = shown.get(doc_type)
        if progress is None:
            progress = shown[doc_type] = EmbedProgress(total, desc=doc_type, unit=unit)
        progress.advance_to(done)
        if done >= total:
            progress.close()

    return update


def print_rebuild(stats: Iterable[RebuildStats]) -> None:
    for s in stats:
        failed = (
            f"; {s.errors} could not be rendered (`pgrag verify {s.doc_type}` names them)"
            if s.errors
            else ""
        )
        click.echo(
            f"{s.doc_type}: {s.documents} documents, {s.changed} chunks written, "
            f"{s.seconds:.1f} s ({s.per_second:,.0f} docs/s){failed}"
        )
