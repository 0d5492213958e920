"""The `corral` command line (Typer + Rich)."""
