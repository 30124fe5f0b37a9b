"""Tools that are not benchmarks: the docs tables, the code-shape counts, dummy model folders, install times."""
