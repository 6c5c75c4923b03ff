"""`python -m selgate <tool> ...`, the same as the `selgate` console script."""

from selgate.cli import main

main()
