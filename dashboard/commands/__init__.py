"""The ``pgdash`` subcommands, one module per concern: serving (``serve``, ``demo``), history
(``export``, ``import``, ``replay``), database (``db upgrade``), and what they share about
their input (``inputs``). dashboard/cli.py gathers them under the one ``pgdash`` group.
"""
