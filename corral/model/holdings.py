"""What allocations hold, as columns: the running jobs of a cluster's books (tens of thousands) read once each and
kept between rounds, and given back on a what-if copy of the books with a few numpy sums instead of one `release`
per allocation (corral.tenancy.reservation's probes, corral.tenancy.preemption's search)."""

from __future__ import annotations

from itertools import repeat

import numpy as np
import numpy.typing as npt

from corral.model.resources import MILLI_PER_GPU, Allocation
from corral.model.snapshot import ClusterSnapshot


class Holdings:
    """The running jobs' holdings as columns (node, CPU, memory, tag, and per GPU index its milli and memory), kept
    between rounds: each Allocation object read once into a row of a store that only grows (compacted when mostly
    stale); a round gathers its jobs' rows (a cluster's tens of thousands of jobs, a few new a round). One per face
    (`FastBooker`; the queues' `Tenancy` for its preemption candidates)."""

    def __init__(self) -> None:
        self._slot: dict[int, int] = {}  # id(allocation) -> its row in the store
        self._objs: list[Allocation] = []  # the store's allocations (kept: no id is reused by another object)
        self._store: tuple[npt.NDArray[np.int64], ...] = ()
        self._gpus = -1
        self._last: tuple[list[Allocation], tuple[npt.NDArray[np.int64], ...]] | None = None

    def of(self, allocs: list[Allocation], gpus: int) -> tuple[npt.NDArray[np.int64], ...]:
        """(node, cpu, memory, tag + 1, share owner or not, GPU milli (n x gpus), GPU memory (n x gpus), grants)."""
        last = self._last
        if last is not None and self._gpus == gpus and allocs == last[0]:  # (the same objects: identity, at once)
            return last[1]
        n = len(allocs)
        if self._gpus != gpus or len(self._objs) > 2 * n + 1024:
            self._slot, self._objs, self._gpus = {}, [], gpus
            self._store = (
                tuple(np.zeros(0, dtype=np.int64) for _ in range(5))
                + tuple(np.zeros((0, gpus), dtype=np.int64) for _ in range(2))
                + (np.zeros(0, dtype=np.int64),)
            )
        slot = self._slot
        rows = np.fromiter(map(slot.get, map(id, allocs), repeat(-1)), np.int64, n)  # (no Python loop)
        fresh = np.flatnonzero(rows < 0).tolist()
        if fresh:
            start = len(self._objs)
            k = len(fresh)
            node, cpu, mem, tag, shared, count = (np.zeros(k, dtype=np.int64) for _ in range(6))
            g_milli, g_mem = np.zeros((k, gpus), dtype=np.int64), np.zeros((k, gpus), dtype=np.int64)
            for r, i in enumerate(fresh):
                a = allocs[i]
                slot[id(a)] = start + r
                self._objs.append(a)
                node[r], cpu[r], mem[r], tag[r] = a.node_index, a.cpu_milli, a.memory_mib, a.tag + 1
                shared[r] = bool(a.share_owner)
                count[r] = len(a.gpus)
                for g in a.gpus:
                    g_milli[r, g.index] += g.milli
                    g_mem[r, g.index] += g.memory_mib
            added = (node, cpu, mem, tag, shared, g_milli, g_mem, count)
            if start + k > len(self._store[0]):  # (room grown by doubling: a few new grants a round cost no copy)
                size = max(start + k, 2 * len(self._store[0]), 1024)
                self._store = tuple(_grown(column, size) for column in self._store)
            for column, new in zip(self._store, added, strict=True):
                column[start : start + k] = new
            rows[fresh] = np.arange(start, start + k)
        cols = tuple(column[rows] for column in self._store)
        self._last = (allocs, cols)
        return cols


def _grown(column: npt.NDArray[np.int64], size: int) -> npt.NDArray[np.int64]:
    """`column` with room for `size` rows (the new ones zero)."""
    out = np.zeros((size, *column.shape[1:]), dtype=column.dtype)
    out[: len(column)] = column
    return out


def _summed(cells: npt.NDArray[np.int64], values: npt.NDArray[np.int64], size: int) -> npt.NDArray[np.int64]:
    # np.bincount adds in float64: exact for these integers (each well below 2**53)
    return np.bincount(cells, weights=values, minlength=size).astype(np.int64)


def give_back(
    future: ClusterSnapshot,
    node: npt.NDArray[np.int64],
    cpu: npt.NDArray[np.int64],
    mem: npt.NDArray[np.int64],
    tag: npt.NDArray[np.int64],
    g_milli: npt.NDArray[np.int64],
    g_mem: npt.NDArray[np.int64],
) -> None:
    """What `ClusterSnapshot.release_held` does for these rows of `Holdings` columns (allocations without a share
    owner), with one sum per column: the columns of `future` (a what-if copy) end exactly as after it."""
    n, width = len(future), future.max_gpus
    tags = future.tag_counts.shape[1]
    future.cpu_free += _summed(node, cpu, n)
    future.mem_free += _summed(node, mem, n)
    future.tag_counts -= _summed(node * tags + tag, np.ones(len(node), dtype=np.int64), n * tags).reshape(n, tags)
    cells = (node[:, None] * width + np.arange(width)[None, :]).ravel()
    milli = _summed(cells, g_milli.ravel(), n * width).reshape(n, width)
    future.gpu_milli_free += milli
    future.gpu_mem_free += _summed(cells, g_mem.ravel(), n * width).reshape(n, width)
    future.gpu_free_total += milli.sum(axis=1)
    whole = future.gpu_present & (future.gpu_milli_free == MILLI_PER_GPU) & (future.gpu_mem_free == future.gpu_mem_cap)
    future.gpu_full_free = whole.sum(axis=1).astype(np.int64)
    future.version += _summed(node, np.ones(len(node), dtype=np.int64), n)  # (as release_held: once per allocation)
