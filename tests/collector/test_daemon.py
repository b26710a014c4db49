"""The serving process's heap settings (collector/daemon.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from fedldp.collector.daemon import GC_YOUNG_THRESHOLD


def test_settle_heap_freezes_startup_objects_and_raises_the_young_threshold() -> None:
    """In a fresh interpreter (GC settings are per process): everything alive at the
    call is frozen, the young threshold is raised, and cyclic garbage made later is
    still collected."""
    script = """
import gc, json, weakref
from fedldp.collector.daemon import settle_heap
before = gc.get_threshold()
settle_heap()
frozen = gc.get_freeze_count()
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
probe = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": frozen,
                  "cycle_collected": probe() is None}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout
    got = json.loads(out)
    assert got["frozen"] > 1000  # the modules, classes and functions loaded so far
    assert got["after"] == [GC_YOUNG_THRESHOLD, *got["before"][1:]]
    assert got["cycle_collected"]
