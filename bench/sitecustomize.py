"""Imported by Python at start-up in every process the benchmark times (``bench/`` is on their
``PYTHONPATH``): imports lightning first and notes the wall-clock time it finished, so that each
process reports its start-up beyond ``import lightning`` from its own clock. Importing lightning
in a process of its own would measure another process, whose import time varies by seconds with
what the system keeps in its file cache.
"""

import os
import time

if "BENCH_T0" in os.environ:
    import lightning  # noqa: F401

    os.environ["BENCH_LIGHTNING_IMPORTED"] = repr(time.time())
