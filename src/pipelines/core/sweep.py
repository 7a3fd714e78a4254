"""`kedro sweep`: a pipeline over a grid of parameter overrides (placeholder, being written)."""
from __future__ import annotations

import click


@click.command("sweep")
def sweep() -> None:
    """Run a pipeline over a grid of settings (not yet implemented)."""
    raise click.ClickException("kedro sweep is not implemented yet")
