"""`python -m fishserve ...` runs the command line."""

from fishserve.cli import main

main()
