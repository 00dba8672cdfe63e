"""How far apart the scheduling loop's cycles start (scheduling.py's loop).

Group commit: what arrives while a cycle runs, and in the gap after it, joins the next cycle
(one transaction). The gap follows the cycles' own length: a quiet service (cycles of 2-5 ms)
answers a client who waits for each answer within a few ms, where a fixed 50 ms gave one answer
per 51 ms; under a stream the cycles and their batches grow, and the loop is busy a quarter of
its time at most, the request handlers getting the rest (docs/service.md "Under load"). An
idle loop starts at once.
"""

from __future__ import annotations

CYCLE_GAP = 0.05  # seconds: the gap never grows past this
GAP_PER_CYCLE = 3.0  # the gap after a cycle, in that cycle's lengths (1 gave smaller batches)


def cycle_gap(took: float) -> float:
    """The least time from a cycle's start to the next one's, after a cycle of ``took`` s."""
    return min(CYCLE_GAP, (1 + GAP_PER_CYCLE) * took)
