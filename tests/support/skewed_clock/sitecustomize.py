"""A process whose wall clock is off: `time.time()` and `time.time_ns()` shifted by
A2A_TEST_CLOCK_OFFSET seconds (`time.monotonic()` untouched, as on a host whose NTP is wrong).

Python imports `sitecustomize` at start from the first directory of `sys.path` that has one,
so a test puts this directory on PYTHONPATH for one process only (see tests/support/replicas.py).
"""

import os
import time

_offset = float(os.environ.get("A2A_TEST_CLOCK_OFFSET", "0") or 0)

if _offset:
    _time, _time_ns = time.time, time.time_ns
    _offset_ns = int(_offset * 1_000_000_000)

    def _skewed_time() -> float:
        return _time() + _offset

    def _skewed_time_ns() -> int:
        return _time_ns() + _offset_ns

    time.time = _skewed_time
    time.time_ns = _skewed_time_ns
