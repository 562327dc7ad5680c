"""`python -m legion ...` is the `legion` command (and `torchrun -m legion train ...` works)."""

from legion.cli import main

main()
