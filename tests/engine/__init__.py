import sys
from pathlib import Path

# The repository root, so that ``tests.apps`` / ``tests.engine`` import as packages
# (tests/ itself has no __init__.py: tests/conftest.py imports ``dbutil`` top-level).
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
