"""Entry point for ``python -m`` runs: fit, validate, test and predict.

The command line's modules are imported with Python's garbage collector off, and what they made is
then frozen, out of every later collection. Importing torch and Lightning leaves half a million
objects, all of them kept, which the collector would otherwise go over in full 7 times while they
import and again while the process ends: ``python -c "import lightning"`` took 8.2 s with those
passes and 5.2 s without them (2 cores; bench/startup.py times the commands). Objects made after
the imports are collected as usual. The scripts in ``scripts/`` import ``main`` from here, to
start the same way.
"""

import gc

gc.disable()
try:
    from .framework.cli import main
finally:
    gc.freeze()
    gc.enable()

if __name__ == "__main__":
    main()
