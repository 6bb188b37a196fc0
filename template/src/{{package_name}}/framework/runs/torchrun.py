"""torchrun, as ``scripts/torchrun.sh`` starts it (``python -m <package>.runs.torchrun``).

When a process fails, torchrun logs which one, then adds a traceback of its own below what the
process printed (the one line of a known error, say) and exits 1; when torchrun itself is sent
SIGTERM or Ctrl-C, it passes the signal on to the processes, waits for them, and ends in a
traceback too. This ends with the failed process's exit status instead (128 + N for signal N),
or 128 + N for the signal torchrun got, and no traceback.
"""

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except ChildFailedError as error:
        status = error.get_first_failure()[1].exitcode
        sys.exit(status if status > 0 else 128 - status)
    except SignalException as error:
        sys.exit(128 + error.sigval)
