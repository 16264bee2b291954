"""`bench` is the repository's bench/ folder here (tests import bench.drift, bench.vs_vllm, ...) under a
bare `pytest` too: pytest puts tests/ on sys.path, where tests/bench alone makes a namespace package
`bench` without those modules; `python -m pytest` (the Makefile) has the working directory first."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
