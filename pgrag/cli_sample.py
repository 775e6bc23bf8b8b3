"""``pgrag sample``: load the sample shop (pgrag/sample.py) into the database.

Registered by pgrag/cli.py with ``cli.add_command(sample)``; its error wrapper prints a
PgragError as one line.
"""

from __future__ import annotations

import click

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group("sample", context_settings=CONTEXT_SETTINGS)
def sample() -> None:
    """The sample shop: customers, products, orders and order items in schema shop."""


@sample.command("load")
@click.option(
    "--customers",
    type=int,
    default=1000,
    show_default=True,
    metavar="N",
    help="Customers to generate (200 to 10,000,000); about 10 orders each.",
)
@click.option(
    "--seed",
    type=int,
    default=42,
    show_default=True,
    metavar="S",
    help="Random seed: the same seed and size give the same rows.",
)
@click.option("--no-progress", is_flag=True, help="Do not show a progress bar.")
@click.pass_context
def sample_load(ctx: click.Context, customers: int, seed: int, no_progress: bool) -> None:
    """Drop and recreate schema shop with generated data, in one transaction.

    Triggers on the old shop tables go with them: re-declare document types afterwards.
    """
    from pgrag.db import describe_target, resolve_url
    from pgrag.sample import load_sample, validate

    validate(customers, seed)  # before starting the embedded server
    url = resolve_url(getattr(ctx.obj, "database_url", None))
    stats = load_sample(url, customers=customers, seed=seed, progress=not no_progress)
    click.echo(f"loaded the sample shop into {describe_target(url)} in {stats.elapsed_s:.1f} s")
    click.echo(f"  customers:   {stats.customers:>12,}")
    click.echo(f"  products:    {stats.products:>12,}")
    click.echo(f"  orders:      {stats.orders:>12,}")
    click.echo(f"  order items: {stats.order_items:>12,} ({stats.returned_items:,} returned)")
    click.echo(f"  seed:        {stats.seed:>12}")
