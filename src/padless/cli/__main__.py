"""``python -m padless.cli``: the command line."""

from padless.cli import main

raise SystemExit(main())
