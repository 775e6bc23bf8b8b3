"""Small pieces the click modules share: settings, the database URL, progress bars, summaries."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import click

from pgrag.documents import RebuildStats

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def url_of(ctx: click.Context) -> str:
    """The database URL from the main group's state, else PGRAG_DATABASE_URL / embedded."""
    state = ctx.find_root().obj
    if state is not None and hasattr(state, "url"):
        return str(state.url())
    from pgrag.db import resolve_url

    return resolve_url(None)


def rebuild_progress(unit: str = "doc") -> Callable[[str, int, int], None]:
    """A tqdm bar per name (document type, stage), fed by a (name, done, total) callback."""
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def update(doc_type: str, done: int, total: int) -> None:
        bar = bars.get(doc_type)
        if bar is None:
            bar = bars[doc_type] = tqdm(
                total=total, desc=doc_type, unit=unit, disable=None, leave=True
            )
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

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
