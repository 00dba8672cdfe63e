"""Phase 6, reclaim (docs/scheduling.md "Reclaim"): a pending job under its deserved share
takes back what borrowers hold.

- ``driver``: the phase: which blocked jobs reclaim, capacity already on its way, the decisions;
- ``victims``: who may lose (Reclaim 1 within deserved, Reclaim 3 borrowers only);
- ``order``: in which order they lose (Reclaim 4), one named rule per function;
- ``search``: how many of them are needed (Reclaim 5: room search and least loss).
"""

from .driver import reclaim

__all__ = ["reclaim"]
