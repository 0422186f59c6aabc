"""How torch's OpenMP threads wait between parallel regions, set once per CLI process.

torch's CPU wheels use GNU OpenMP. Left alone, libgomp keeps each intra-op worker spinning after
every parallel region (GOMP_SPINCOUNT, about 300,000 spins) so that the next region starts at
once. That is right on a machine whose cores are all ours; on a shared one (CI runners, a
developer box, this 2-core machine under other work) a spinning worker burns the time slice the
thread it waits for needs, and every small op pays a scheduler round trip. On the DeepSeek tiny
tower (3,774 patches, bench/command_time.py's gate, 2 cores under load 5-8) the engine's forward
took 1.2-1.9 s wall and 0.5-0.75 s CPU with spinning workers, 0.33-0.39 s wall
and 0.2 s CPU with passive ones, the same as one thread; an elementwise op of 483k floats went
from 9 ms to 0.3 ms.

`OMP_WAIT_POLICY=PASSIVE` makes a worker sleep at once (a futex wake, tens of microseconds, per
region). Thread counts, work partitioning and so every result stay the same: it changes only how
idle workers wait, so no dump or verdict changes. libgomp reads it once, when torch loads it, so
it must be set before the first `import torch`; a policy the user set is kept.
"""
from __future__ import annotations

import os
import sys

VARIABLE = "OMP_WAIT_POLICY"


def passive_waits() -> bool:
    """Ask for sleeping OpenMP workers unless the environment says otherwise. Returns whether
    the setting reaches torch's OpenMP: False when torch is already imported (too late) or the
    user chose a policy of their own."""
    if VARIABLE in os.environ or "torch" in sys.modules:
        return False
    os.environ[VARIABLE] = "PASSIVE"
    return True
