"""``python -m simulator`` is the ``lastmile`` command."""

from .cli import main

raise SystemExit(main())
