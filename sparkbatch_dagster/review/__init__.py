"""The review round trip through Label Studio: a job's review queue exported as a project's
tasks, the finished annotations read back as the job's human labels. ``cli.review`` reads the
arguments (``sparkbatch review export`` / ``import``).

Modules:

- :mod:`.label_studio`: the connection (its SDK), the project and the export;
- :mod:`.label_studio_import`: the finished annotations read back as human labels;
- :mod:`.queue`: the rows an export sends, and the note of the last export.

May import: ``run`` and every room below it; never ``cli`` (which imports it) or ``serve``.
"""
