"""corral k8s scheduler with queues (issue 25 item 2): in-process tests of the tenancy face."""

from __future__ import annotations

from corral.k8s.scheduler.tenancy import Evictions, NoEvictions


def test_no_evictions_is_the_inert_seam() -> None:
    e: Evictions = NoEvictions()
    assert not e.busy()
    assert e.stopping() == frozenset() and e.protected() == frozenset()
    assert dict(e.held()) == {}
    e.bound("uid")
