"""`python -m floom.cli`: the floom command, as the console script runs it."""

from __future__ import annotations

from floom.cli import main

main()
