"""`python -m fishserve ...` runs the command line."""

from fishserve.cli import main

if __name__ == "__main__":
    main()
