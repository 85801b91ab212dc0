"""Subcommands of the ``lastmile`` command line, one module each (``add_arguments`` + ``main``)."""
