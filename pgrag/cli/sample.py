"""``pgrag sample``: load the sample shop (pgrag/lab/sample.py) into the database.

Registered by pgrag/cli/main.py with ``cli.add_command(sample)``; its error wrapper prints a
PgragError as one line.
"""

from __future__ import annotations

import click

from pgrag.cli.options import CONTEXT_SETTINGS, Group, customers_option, no_progress_option


@click.group("sample", cls=Group, context_settings=CONTEXT_SETTINGS)
def sample() -> None:
    """The sample shop: customers, products, orders and order items in schema shop."""


@sample.command("load")
@customers_option(1000, None, "Customers to generate (200 to 10,000,000).")
@click.option(
    "--seed",
    type=int,
    default=42,
    show_default=True,
    metavar="S",
    help="Random seed: the same seed and size give the same rows.",
)
@no_progress_option()
@click.option(
    "--documents/--no-documents",
    default=True,
    help="Declare the shop's document types (customer_profile, order_detail) and render "
    "them (default).",
)
@click.option(
    "--recent-orders",
    type=click.IntRange(0, 100),
    default=5,
    show_default=True,
    help="Orders listed in full in a customer profile before '... and K more orders'.",
)
@click.option(
    "--comparisons",
    is_flag=True,
    help="Also declare the benchmark's comparison types table_row and join_row.",
)
@click.pass_context
def sample_load(
    ctx: click.Context,
    customers: int,
    seed: int,
    no_progress: bool,
    documents: bool,
    recent_orders: int,
    comparisons: bool,
) -> None:
    """Load the sample shop into schema shop, then declare and render its documents.

    Drops and recreates schema shop with generated data, in one transaction. Triggers on the
    old shop tables go with them; the document types are declared again.
    """
    from pgrag.connection import describe_target, resolve_url
    from pgrag.lab.sample import load_sample, validate

    validate(customers, seed)  # before starting the embedded server
    url = resolve_url(getattr(ctx.obj, "database_url", None))
    stats = load_sample(url, customers=customers, seed=seed, progress=not no_progress)
    click.echo(f"loaded the sample shop into {describe_target(url)} in {stats.elapsed_s:.1f} s")
    click.echo(f"  customers:   {stats.customers:>12,}")
    click.echo(f"  products:    {stats.products:>12,}")
    click.echo(f"  orders:      {stats.orders:>12,}")
    click.echo(f"  order items: {stats.order_items:>12,} ({stats.returned_items:,} returned)")
    click.echo(f"  seed:        {stats.seed:>12}")
    if documents:
        from pgrag.cli.options import print_rebuild, rebuild_progress
        from pgrag.db import connect
        from pgrag.lab.sample_documents import declare_sample_documents

        with connect(url) as client:
            client.require_schema()
            with client.connection() as conn:
                types = declare_sample_documents(
                    conn, recent_orders=recent_orders, comparisons=comparisons
                )
            click.echo(f"declared {', '.join(types)}")
            print_rebuild(client.rebuild(progress=None if no_progress else rebuild_progress()))
