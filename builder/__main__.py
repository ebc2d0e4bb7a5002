"""`python -m builder ...` works without nox."""

from builder.cli import main

raise SystemExit(main())
