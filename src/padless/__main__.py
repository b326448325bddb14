"""``python -m padless``: the command line."""

from padless.cli import main

raise SystemExit(main())
