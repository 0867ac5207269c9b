"""Command-line layer: argument parsing, progress display and printing. Nothing imports this package."""
