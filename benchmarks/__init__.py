"""Side-by-side measurements; each writes JSON and prints a table."""
