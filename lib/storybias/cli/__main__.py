"""``python -m storybias.cli``: what the Makefile runs."""

from storybias.cli import entry

raise SystemExit(entry())
