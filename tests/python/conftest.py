"""pytest set-up for the attnjit Python tests (run by scripts/setup.sh test
in its virtual environment; see docs/python.md).  The kernel cache stays in
memory, as in the C tests, unless AJ_CACHE says otherwise: the README's
test command gives the pytest workers and the ranks they spawn one disk
directory (AJ_CACHE=disk, AJ_CACHE_DIR), so a kernel is compiled once."""
import os
import sys

os.environ.setdefault("AJ_CACHE", "memory")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
