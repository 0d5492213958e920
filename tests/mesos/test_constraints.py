"""Marathon constraints evaluated over the fields of one machine's slots (checklist item 8 and the operators)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.mesos.constraints import check, parse_constraints
from corral.mesos.errors import Problems
from corral.mesos.model import ConstraintOperator, ServiceConstraint

Op = ConstraintOperator


def rule(field: str, op: Op, value: str | None = None) -> list[ServiceConstraint]:
    return [ServiceConstraint(field, op, value)]


def gpu(i: int, model: str = "H100", numa: int = 0) -> dict[str, str]:
    return {"hostname": "box", "gpu": str(i), "gpu_model": model, "numa": str(numa)}


def test_max_per_never_places_a_third_instance_on_one_rack() -> None:
    racks = [{"hostname": f"n{i}", "rack": f"r{i % 2}"} for i in range(6)]
    placed: list[dict[str, str]] = []
    for candidate in racks:
        if not check(rule("rack", Op.MAX_PER, "2"), candidate, placed):
            placed.append(candidate)
    assert Counter(p["rack"] for p in placed) == {"r0": 2, "r1": 2}
    (why,) = check(rule("rack", Op.MAX_PER, "2"), racks[4], placed)
    assert str(why) == "constraint rack MAX_PER 2: rack r0 already has 2 instances (at most 2)"


@settings(max_examples=40, deadline=None)
@given(
    limit=st.integers(1, 4),
    order=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=30),
)
def test_max_per_holds_for_any_arrival_order(limit: int, order: list[str]) -> None:
    placed: list[dict[str, str]] = []
    for rack in order:
        if not check(rule("rack", Op.MAX_PER, str(limit)), {"rack": rack}, placed):
            placed.append({"rack": rack})
    counts = Counter(p["rack"] for p in placed)
    assert max(counts.values()) <= limit
    assert all(counts[r] == min(limit, order.count(r)) for r in set(order))


def test_agents_lacking_the_field_are_refused_except_by_unlike() -> None:
    bare = {"hostname": "n1"}
    for op, value in [(Op.UNIQUE, None), (Op.MAX_PER, "2"), (Op.LIKE, "r.*"), (Op.IS, "r1"), (Op.GROUP_BY, None)]:
        (why,) = check(rule("rack", op, value), bare, [])
        assert why.reason == "rack is not set here"
    assert check(rule("rack", Op.CLUSTER, "r1"), bare, [])
    assert check(rule("rack", Op.UNLIKE, "r1"), bare, []) == []


def test_unique_over_gpus() -> None:
    placed = [gpu(0), gpu(1)]
    assert check(rule("gpu", Op.UNIQUE), gpu(2), placed) == []
    (why,) = check(rule("gpu", Op.UNIQUE), gpu(1), placed)
    assert why.reason == "an instance already runs where gpu is 1"


def test_hostname_and_at_hostname_are_one_field() -> None:
    assert check(rule("@hostname", Op.UNIQUE), {"hostname": "box"}, [{"hostname": "box"}])
    assert check(rule("hostname", Op.IS, "box"), {"@hostname": "box"}, []) == []


def test_cluster_with_and_without_a_value() -> None:
    assert check(rule("gpu_model", Op.CLUSTER, "A100"), gpu(0, "H100"), [])
    assert check(rule("gpu_model", Op.CLUSTER, "A100"), gpu(0, "A100"), []) == []
    assert check(rule("numa", Op.CLUSTER), gpu(0, numa=1), []) == []  # the first instance picks
    (why,) = check(rule("numa", Op.CLUSTER), gpu(3, numa=0), [gpu(1, numa=1)])
    assert why.reason == "numa is 0, instances are kept on 1"


def test_like_unlike_and_is() -> None:
    assert check(rule("gpu_model", Op.LIKE, "A100.*"), gpu(0, "A100-80GB"), []) == []
    assert check(rule("gpu_model", Op.LIKE, "A100"), gpu(0, "A100-80GB"), [])  # the whole value must match
    assert check(rule("gpu_model", Op.UNLIKE, "T4"), gpu(0, "H100"), []) == []
    assert check(rule("gpu_model", Op.UNLIKE, "H.*"), gpu(0, "H100"), [])
    assert check(rule("mem", Op.IS, "16"), {"mem": "16.0004"}, []) == []  # scalars equal to 0.001
    assert check(rule("mem", Op.IS, "16"), {"mem": "16.01"}, [])
    assert check(rule("zone", Op.IS, "a"), {"zone": "b"}, [])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 20), gpus=st.integers(1, 8))
def test_group_by_with_known_values_spreads_evenly(n: int, gpus: int) -> None:
    """Greedy placement, taking the first slot the rule accepts, keeps the per-value counts within one."""
    slots = [gpu(i) for i in range(gpus)]
    domains = {"gpu": [str(i) for i in range(gpus)]}
    placed: list[dict[str, str]] = []
    for _ in range(n):
        ok = [s for s in slots if not check(rule("gpu", Op.GROUP_BY), s, placed, domains)]
        assert ok, "some value always has the fewest instances"
        placed.append(ok[0])
    counts = Counter(p["gpu"] for p in placed)
    values = [counts.get(str(i), 0) for i in range(gpus)]
    assert max(values) - min(values) <= 1


def test_group_by_without_known_values_uses_the_minimum_group_count() -> None:
    placed = [{"rack": "a"}, {"rack": "a"}]
    # Only rack a is known: Marathon's rule lets it pile up there.
    assert check(rule("rack", Op.GROUP_BY), {"rack": "a"}, placed) == []
    # Asking for 2 groups: until a second value is used, only a new value is accepted.
    (why,) = check(rule("rack", Op.GROUP_BY, "2"), {"rack": "a"}, placed)
    assert why.reason == "rack a has 2 instances, another value has 0"
    assert check(rule("rack", Op.GROUP_BY, "2"), {"rack": "b"}, placed) == []


def test_several_constraints_report_every_failure() -> None:
    rules = [*rule("gpu", Op.UNIQUE), *rule("gpu_model", Op.LIKE, "A100")]
    assert [r.constraint.operator for r in check(rules, gpu(0, "H100"), [gpu(0)])] == [Op.UNIQUE, Op.LIKE]


def test_parse_constraints_keeps_the_good_and_reports_the_bad() -> None:
    problems = Problems()
    got = parse_constraints([["gpu", "unique"], ["r", "MAX_PER", "x"], "nope"], "/constraints", problems)
    assert got == (ServiceConstraint("gpu", Op.UNIQUE),)
    assert bool(problems)
