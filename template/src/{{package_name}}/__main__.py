"""Entry point for ``python -m`` runs: fit, validate, test and predict."""

from .cli import main

if __name__ == "__main__":
    main()
