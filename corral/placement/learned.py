"""The target workload learned online from the requests a scheduler sees (issue 16: the extender's workload).

fgd and fgd-priced measure fragmentation against a target workload: the request shapes to come and their
probabilities, plus the rare large ones (`TargetWorkload.tail`, for which `placement.reserve` keeps hosts). A face
that does not know its future pods (the Kubernetes extender) learns them from the pods it has seen so far:

    observe(uid, request, now) --once per uid--> decayed count of its shape (cpu milli, GPU milli, GPU count, models)
         |                                        (at most `max_shapes`; the lightest is dropped for a new one)
         +-- every `check_pods` pods, or `check_seconds` after the last check with a new pod in between:
               candidate = TargetWorkload.from_shapes(counts)        (the simulator's `target_workload` code path)
               adopt it if the weight seen >= `min_pods` and its shape distribution moved >= `min_change`
               (total variation) from the workload in use
    workload  -> the adopted TargetWorkload, or None (the engine's DEFAULT_WORKLOAD) until the first adoption

Why these parts:

- Counted once per UID: kube-scheduler filters an unschedulable pod again and again; counting each try would make
  the pods that fit nowhere the workload. UIDs are remembered for the last `max_uids` pods (a pod seen again after
  that many others counts twice: harmless at that distance).
- Decayed (each new pod weighs 2^(1/half_life) times the one before): the workload follows a change of what is
  submitted within about one half-life, while a burst of one shape cannot replace a long history at once.
- Adopted rarely: the engine keys its caches by `workload.key` (compiled types, per-node fragmentation, hosts kept
  for multi-GPU types), so each new workload makes it recompute them for every node. A candidate is built at most
  every `check_pods` pods (or `check_seconds`), and adopted only when it differs enough, so caches stay useful once
  the learned statistics have settled.
- Bounded: at most `max_shapes` distinct shapes and `max_uids` UIDs; a request no node could ever hold in one piece
  (more than `max_gpu_count` GPUs, more than `max_models` models or a model name longer than `max_model_chars`) is
  not counted at all, so a stream of hostile pods with odd requests churns at most the lightest shape's slot. (The
  extender also leaves out pods its cluster can never serve: a GPU model it lacks, more GPUs than any node has.)

Pure: the caller passes the time (`now`), so the simulator replays the same rule the extender runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from corral.model.errors import InvalidRequest
from corral.model.resources import Request
from corral.placement.workload import TargetType, TargetWorkload

Shape = tuple[int, int, int, str]  # cpu milli, GPU milli per GPU, GPU count, models sorted and joined by "|"

#: Rescale the counts when the weight of the next pod passes this (2^(pods / half_life) grows without end).
_RESCALE_AT = 2.0**500


@dataclass(frozen=True, slots=True)
class LearnerConfig:
    """How the learner counts and when it adopts a new workload (see the module docstring)."""

    half_life_pods: float = 4000.0  # a pod's weight halves after this many newer pods (math.inf: never)
    min_pods: int = 200  # pods seen (decayed weight) before the learned workload replaces the default
    check_pods: int = 256  # build a candidate after this many new pods...
    check_seconds: float = 60.0  # ...or this long after the last check, if any pod came meanwhile
    min_change: float = 0.05  # adopt a candidate whose shape distribution moved at least this (total variation)
    max_shapes: int = 1024
    max_uids: int = 65536
    max_gpu_count: int = 64
    max_models: int = 16
    max_model_chars: int = 128

    def __post_init__(self) -> None:
        checks = {
            "half_life_pods": self.half_life_pods > 0,
            "min_pods": self.min_pods >= 1,
            "check_pods": self.check_pods >= 1,
            "check_seconds": self.check_seconds > 0,
            "min_change": 0 <= self.min_change <= 1,
            "max_shapes": self.max_shapes >= 1,
            "max_uids": self.max_uids >= 1,
            "max_gpu_count": self.max_gpu_count >= 1,
            "max_models": self.max_models >= 1,
            "max_model_chars": self.max_model_chars >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise InvalidRequest(f"workload.{name}", f"out of range: {getattr(self, name)!r}")


def shape_of(request: Request) -> Shape:
    """The shape a request is counted as: the key `TargetWorkload.from_requests` gives it (memory is not part of
    it; a request without GPUs has GPU milli 0 and no models whatever it says)."""
    if request.gpu_count == 0:
        return (request.cpu_milli, 0, 0, "")
    models = "|".join(sorted(request.gpu_models)) if request.gpu_models else ""
    return (request.cpu_milli, request.gpu_milli, request.gpu_count, models)


def distance(a: Mapping[Shape, float], b: Mapping[Shape, float]) -> float:
    """Total variation distance between two shape distributions (each given by weights, normalised here)."""
    ta, tb = sum(a.values()), sum(b.values())
    if ta <= 0 or tb <= 0:
        return 1.0
    return 0.5 * sum(abs(a.get(k, 0.0) / ta - b.get(k, 0.0) / tb) for k in a.keys() | b.keys())


class WorkloadLearner:
    """Decayed counts of the request shapes seen, and the TargetWorkload they make (see the module docstring).

    Not thread-safe: the extender calls it under its state's lock."""

    def __init__(self, config: LearnerConfig | None = None) -> None:
        self.config = config or LearnerConfig()
        self._counts: dict[Shape, float] = {}
        self._uids: OrderedDict[str, None] = OrderedDict()
        self._step = 2.0 ** (1.0 / self.config.half_life_pods)  # inf half-life: 1.0, plain counts
        self._weight = 1.0  # the next pod's weight
        self._seen_weight = 0.0  # decayed number of pods counted (the same scale as the counts)
        self.pods = 0  # pods counted (not decayed)
        self.ignored = 0  # requests not counted (odd shape)
        self.rebuilds = 0  # workloads adopted
        self._since_check = 0
        self._last_check: float | None = None
        self._adopted: dict[Shape, float] = {}  # the counts the workload in use was built from
        self._adopted_at = 0  # self.pods then
        self.workload: TargetWorkload | None = None

    # ------------------------------------------------------------------ counting
    def countable(self, request: Request) -> bool:
        """Whether a request's shape is counted (see the module docstring's "Bounded")."""
        c = self.config
        if request.gpu_count > c.max_gpu_count:
            return False
        models = request.gpu_models if request.gpu_count else None
        return not models or (len(models) <= c.max_models and max(map(len, models)) <= c.max_model_chars)

    def observe(self, uid: str, request: Request, now: float) -> bool:
        """Count one pod's request (once per `uid`); returns whether the workload in use changed."""
        if uid in self._uids:
            return False
        self._uids[uid] = None
        if len(self._uids) > self.config.max_uids:
            self._uids.popitem(last=False)
        if not self.countable(request):
            self.ignored += 1
            return False
        self._count(shape_of(request))
        self._since_check += 1
        if self._last_check is None:
            self._last_check = now
        return self._maybe_check(now)

    def tick(self, now: float) -> bool:
        """Check on time alone (a quiet cluster): returns whether the workload in use changed."""
        return self._maybe_check(now)

    def _count(self, shape: Shape) -> None:
        counts = self._counts
        if shape not in counts and len(counts) >= self.config.max_shapes:
            # The lightest shape makes room: with decay it is the rarest lately; a shape that keeps coming regains
            # its weight within a half-life.
            lightest = min(counts, key=counts.__getitem__)
            self._seen_weight -= counts.pop(lightest)
        counts[shape] = counts.get(shape, 0.0) + self._weight
        self._seen_weight += self._weight
        self.pods += 1
        self._weight *= self._step
        if self._weight > _RESCALE_AT:
            # Scale everything down together: the distribution (all that is ever used) is unchanged.
            scale = self._weight
            for k in counts:
                counts[k] /= scale
            for k in self._adopted:
                self._adopted[k] /= scale
            self._seen_weight /= scale
            self._weight = 1.0

    @property
    def sample(self) -> float:
        """The decayed number of pods the counts stand for (in pods of the newest one's weight)."""
        return self._seen_weight / self._weight * self._step if self._seen_weight else 0.0

    # ------------------------------------------------------------------ adopting
    def _maybe_check(self, now: float) -> bool:
        if self._since_check == 0:
            return False
        due = self._since_check >= self.config.check_pods or (
            self._last_check is not None and now - self._last_check >= self.config.check_seconds
        )
        if not due:
            return False
        self._since_check = 0
        self._last_check = now
        return self._consider()

    def _consider(self) -> bool:
        if not self._counts or self.sample + 1e-9 < self.config.min_pods:
            return False
        if self.workload is not None and distance(self._adopted, self._counts) < self.config.min_change:
            return False
        self.workload = self.candidate()
        self._adopted = dict(self._counts)
        self._adopted_at = self.pods
        self.rebuilds += 1
        return True

    def candidate(self) -> TargetWorkload:
        """The workload the current counts make: `TargetWorkload.from_shapes`, the code path of the simulator's
        `target_workload`, given the decayed weights (it counts its input with a Counter, which takes a mapping's
        weights as counts); with no decay, the very workload `from_requests` builds from the pods seen."""
        if not self._counts:
            raise InvalidRequest("workload", "no pods seen yet")
        return TargetWorkload.from_shapes(self._counts)

    def describe(self) -> dict[str, object]:
        """What /status shows: the workload in use and how it was learned."""
        w = self.workload
        return {
            "source": "learned" if w is not None else "default (learning)",
            "pods_seen": self.pods,
            "pods_ignored": self.ignored,
            "sample": round(self.sample, 1),
            "min_pods": self.config.min_pods,
            "shapes": len(self._counts),
            "rebuilds": self.rebuilds,
            "adopted_at_pod": self._adopted_at if w is not None else None,
            "types": len(w.types) if w is not None else 0,
            "tail": len(w.tail) if w is not None else 0,
            "top": [describe_type(t) for t in w.types[:5]] if w is not None else [],
        }


def describe_type(t: TargetType) -> str:
    """One target type in words, e.g. "2x1000m GPU [V100] + 8000m CPU: 12.5 %"."""
    if not t.gpu_count:
        gpu = "no GPU"
    elif t.gpu_milli:
        gpu = f"{t.gpu_count}x{t.gpu_milli}m GPU"
    else:  # a share by GPU memory only: the shape (as the simulator's) does not count the memory
        gpu = f"{t.gpu_count}x GPU memory share"
    models = f" [{','.join(sorted(t.models))}]" if t.models else ""
    return f"{gpu}{models} + {t.cpu_milli}m CPU: {100 * t.probability:.1f} %"


def summary(workload: TargetWorkload | None, source: str) -> str:
    """One log line naming the workload in use."""
    if workload is None:
        return f"workload: {source}: the engine's DEFAULT_WORKLOAD"
    top = "; ".join(describe_type(t) for t in workload.types[:3])
    return f"workload: {source}: {len(workload.types)} typical types, {len(workload.tail)} rare; top: {top}"
