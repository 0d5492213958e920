"""The explanation's reason counts (engine._counts_primary, _counts_any), now taken from the distinct bitmasks,
equal a count node by node with `reasons_of`."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.placement.engine import _counts_any, _counts_primary
from corral.placement.reasons import ORDER, reasons_of


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, (1 << len(ORDER)) - 1) | st.just(0), min_size=1, max_size=60))
def test_reason_counts_equal_a_count_node_by_node(masks: list[int]) -> None:
    bits = np.array(masks, dtype=np.int64)
    primary = Counter(reasons_of(m)[0] for m in masks if m)
    any_ = Counter(r for m in masks for r in reasons_of(m))
    assert _counts_primary(bits) == tuple(sorted(primary.items(), key=lambda p: (-p[1], p[0].value)))
    assert _counts_any(bits) == tuple((r, any_[r]) for r in ORDER if any_[r])
