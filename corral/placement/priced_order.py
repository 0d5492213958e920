"""fgd-priced's order among GPUs of equal priced loss: FGD's points before the tightest GPU (issue 16).

    1. loss(u, m), least first                                   (`placement.pricing`, unchanged)
    2. FGD's integer points on that GPU, highest first            (was 3: after the tightest GPU)
    3. u, the GPU's free milli, least first                      (the tightest GPU among equally good ones)
    4. fgd-scarcity's look-ahead tie-break

The loss prices GPU room as if every milli of it could be filled; the tightest-first key then completed a started
configuration wherever it was, even on a node whose CPU the share exhausts, stranding that node's other GPUs. FGD's
points are the one key here that sees the node as a whole (its CPU and every GPU, for the workload's typical pods),
so they now come before the GPU's tightness: a started configuration is still completed before a fresh GPU is
opened when the nodes are equally good to FGD, and not at the price of a node's CPU. Measured (3 seeds, issue 16,
`docs/beyond-fgd.md`): on `cpu300p` (three times `default`'s pods without GPUs) it alone turns a loss to fgd on
one seed into +0.07..+0.51 on all three.

Packing: ((1000 - loss) x 101 + points) x 1001 + (1000 - u) + (score - points), at most about 1.02e8 (below
fgd-priced's 2^28 for kept hosts); the look-ahead's fraction keeps a resolution of about 1.5e-8 there, as before.
The packing is computed per (node, GPU) by `kernels.share_choice` (mode 1), from the constants here.
"""

from __future__ import annotations

from corral.model.resources import MILLI_PER_GPU

#: FGD's points are integers 0..100: one step of the loss key outweighs every point.
POINTS = 101.0
#: The tightness key is 0..1000: one FGD point outweighs every tightness.
TIGHT = float(MILLI_PER_GPU + 1)
