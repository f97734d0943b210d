"""An app whose import hangs until ``$SLOW_IMPORT_FLAG`` is gone (a worker starting slowly).

It writes ``$SLOW_IMPORT_FLAG.importing`` first, so a test knows the worker is inside
the import before it signals it.
"""

from __future__ import annotations

import os
import time

from agentledger import App

_flag = os.environ["SLOW_IMPORT_FLAG"]
with open(_flag + ".importing", "w") as _f:
    _f.write(str(os.getpid()))
_until = time.monotonic() + 120.0  # never outlives a test
while os.path.exists(_flag) and time.monotonic() < _until:
    time.sleep(0.02)

app = App("slow-import")
