"""``python -m tests.worker.gated_worker ARGS``: ``agentledger ARGS`` once ``$GATE`` exists.

Workers started one by one open the database a process start-up apart (a second or
more), which hides a race between their first migrations. Started through this gate,
each loads its code, says so (a file ``$GATE.PID.ready``) and waits; touching the gate
file then lets them all open the database at the same moment.
"""

from __future__ import annotations

import os
import sys
import time

from agentledger.cli._main import main

if __name__ == "__main__":
    gate = os.environ["GATE"]
    open(f"{gate}.{os.getpid()}.ready", "w").close()  # loaded: waiting at the gate
    while not os.path.exists(gate):
        time.sleep(0.001)
    sys.argv = ["agentledger", *sys.argv[1:]]
    main()
