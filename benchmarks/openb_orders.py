"""The FGD study's arrival orders for any openb pod list, made as the shared `orders/` files were made.

`../shared/traces/openb/orders/*.order.gz` were produced with Go's own `math/rand` following
`../shared/reference/fgd-experiment.md` sections 2.2 and 7 (C1): `Seed(s)`; one `Int()`; `Shuffle` of the pods
sorted by name; the tuning draws (tune up to 1.3 x the cluster's GPU milli: `Intn(|W|)` with replacement, appended
as `<name>-tuned-<k>`; tune down: remove `Intn(len)` until at most 1.3 x); ten `Int63` draws; `Perm(#nodes)` over the
nodes sorted by name, whose value is each node's tie-break rank. This module is a port of those Go functions
(`math/rand`'s additive lagged Fibonacci source, `Int31n`, the Lemire-style `int31n` of `Shuffle`, `Perm`), checked
by regenerating every shared order file byte for byte (`--check`).

Go's source seeds its state from a table of 607 constants (`rngCooked`, the state after 7.8e12 steps), which is
not copied here: pass Go's `src/math/rand/rng.go` with `--go-rng` (any version; the low 63 bits, all that
`Int63` returns, are the same in the old and the new table).

The pod lists `cpu235`, `cpu250` and `cpu300` are not in ../shared; they are public in alibaba/clusterdata
(`cluster-trace-gpu-v2023/csv/`). `--clusterdata GITDIR` copies them from a clone (a bare git directory is enough)
into `--out`, next to the node list and the orders made for them:

    python -m benchmarks.openb_orders --go-rng rng.go --check                       (the 22 shared files)
    python -m benchmarks.openb_orders --go-rng rng.go --clusterdata <clusterdata>.git --out out/openb_cpu \
        --lists cpu235,cpu250,cpu300 --seeds 42-44

`out/openb_cpu` is then a traces folder for `benchmarks.beyond_fgd --traces out/openb_cpu`.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import re
import shutil
import subprocess
import sys
from pathlib import Path

LEN, TAP = 607, 273
MASK63 = (1 << 63) - 1
MASK64 = (1 << 64) - 1
M31 = (1 << 31) - 1
TUNE_RATIO = 1.3


def read_cooked(rng_go: Path) -> list[int]:
    """The 607 `rngCooked` constants of Go's rng.go (either version), as unsigned 64-bit integers."""
    text = rng_go.read_text()
    start = text.index("{", text.index("ooked"))
    body = text[start + 1 : text.index("}", start)]
    values = [int(v) & MASK64 for v in re.findall(r"-?\d+", body)]
    if len(values) != LEN:
        raise SystemExit(f"{rng_go}: expected {LEN} rngCooked values, found {len(values)}")
    return values


class GoRand:
    """Go's `math/rand.Rand` over its default source, for the calls the FGD simulator makes."""

    def __init__(self, cooked: list[int], seed: int) -> None:
        self.tap = 0
        self.feed = LEN - TAP
        seed %= M31
        if seed < 0:
            seed += M31
        if seed == 0:
            seed = 89482311
        x = seed
        vec = [0] * LEN
        for i in range(-20, LEN):
            x = _seedrand(x)
            if i >= 0:
                u = x << 40
                x = _seedrand(x)
                u ^= x << 20
                x = _seedrand(x)
                u ^= x
                vec[i] = (u ^ cooked[i]) & MASK64
        self.vec = vec

    def int63(self) -> int:
        self.tap -= 1
        if self.tap < 0:
            self.tap += LEN
        self.feed -= 1
        if self.feed < 0:
            self.feed += LEN
        x = (self.vec[self.feed] + self.vec[self.tap]) & MASK64
        self.vec[self.feed] = x
        return x & MASK63

    def int31(self) -> int:
        return self.int63() >> 32

    def uint32(self) -> int:
        return self.int63() >> 31

    def int31n(self, n: int) -> int:
        """`Rand.Int31n` (what `Intn` calls for n < 2^31)."""
        if n & (n - 1) == 0:
            return self.int31() & (n - 1)
        top = M31 - (1 << 31) % n
        v = self.int31()
        while v > top:
            v = self.int31()
        return v % n

    def intn(self, n: int) -> int:
        if n <= 0 or n > M31:
            raise ValueError(n)
        return self.int31n(n)

    def _int31n_lemire(self, n: int) -> int:
        """The unexported `int31n` that `Shuffle` uses."""
        v = self.uint32()
        prod = v * n
        low = prod & 0xFFFFFFFF
        if low < n:
            thresh = ((1 << 32) - n) % n
            while low < thresh:
                v = self.uint32()
                prod = v * n
                low = prod & 0xFFFFFFFF
        return prod >> 32

    def shuffle(self, items: list[str]) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self._int31n_lemire(i + 1)
            items[i], items[j] = items[j], items[i]

    def perm(self, n: int) -> list[int]:
        m = [0] * n
        for i in range(n):
            j = self.intn(i + 1)
            m[i] = m[j]
            m[j] = i
        return m


def _seedrand(x: int) -> int:
    hi, lo = divmod(x, 44488)
    x = 48271 * lo - 3399 * hi
    return x + M31 if x < 0 else x


def _pods(path: Path) -> list[tuple[str, int, int]]:
    """(name, num_gpu, gpu milli clamped to [0, 1000]) per row; gpu milli counts only when num_gpu > 0."""
    out = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            count = int(row["num_gpu"])
            milli = min(max(int(row["gpu_milli"] or 0), 0), 1000) if count else 0
            out.append((row["name"], count, milli))
    return out


def _node_names(path: Path) -> tuple[list[str], int]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return sorted(r["sn"] for r in rows), sum(int(r["gpu"]) for r in rows) * 1000


def make_order(cooked: list[int], pods_csv: Path, nodes_csv: Path, seed: int) -> str:
    """The text of `<list>.seed<seed>.order` (before gzip)."""
    pods = sorted(_pods(pods_csv), key=lambda p: p[0].encode())
    by_name = {p[0]: p for p in pods}
    nodes, node_total = _node_names(nodes_csv)
    rng = GoRand(cooked, seed)
    rng.int63()  # Int() evaluated for a debug log call
    order = [p[0] for p in pods]
    rng.shuffle(order)
    total = sum(c * m for _, c, m in pods)
    target = TUNE_RATIO * node_total
    if total < target:
        k = 0
        while True:
            name, count, milli = pods[rng.intn(len(pods))]
            if total + milli > target:
                break
            order.append(f"{name}-tuned-{k}")
            k += 1
            total += count * milli
    elif total > target:
        while total > target:
            i = rng.intn(len(order))
            _, count, milli = by_name[order.pop(i)]
            total -= count * milli
    for _ in range(10):
        rng.int63()
    ranks = rng.perm(len(nodes))
    lines = [f"NODE {ranks[i]:04d}-{name}" for i, name in enumerate(nodes)]
    lines += [f"POD {i} {name}" for i, name in enumerate(order)]
    return "\n".join(lines) + "\n"


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--go-rng", type=Path, required=True, help="Go's src/math/rand/rng.go (for rngCooked)")
    ap.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared/traces/openb")
    ap.add_argument("--check", action="store_true", help="regenerate every order file in TRACES/orders and compare")
    ap.add_argument("--clusterdata", type=Path, help="a clone (or bare git dir) of alibaba/clusterdata")
    ap.add_argument("--out", type=Path, help="traces folder to make: pod lists, node list, orders/")
    ap.add_argument("--lists", default="cpu235,cpu250,cpu300")
    ap.add_argument("--seeds", default="42-44")
    args = ap.parse_args(argv)
    cooked = read_cooked(args.go_rng)
    nodes_csv = args.traces / "openb_node_list_gpu_node.csv"
    if args.check:
        bad = 0
        files = sorted((args.traces / "orders").glob("*.order.gz"))
        for f in files:
            stem, _, seed = f.name.removesuffix(".order.gz").rpartition(".seed")
            with gzip.open(f, "rt") as fh:
                want = fh.read()
            got = make_order(cooked, args.traces / f"{stem}.csv", nodes_csv, int(seed))
            ok = got == want
            bad += not ok
            print(f"{f.name}: {'identical' if ok else 'DIFFERENT'}", flush=True)
        print(f"{len(files) - bad} of {len(files)} order files identical")
        return 1 if bad else 0
    if args.out is None:
        ap.error("--out is needed (or --check)")
    out: Path = args.out
    (out / "orders").mkdir(parents=True, exist_ok=True)
    for name in ("openb_node_list_gpu_node.csv", "openb_node_list_all_node.csv"):
        if (args.traces / name).exists():
            shutil.copyfile(args.traces / name, out / name)
    for lst in args.lists.split(","):
        csv_name = f"openb_pod_list_{lst}.csv"
        if args.clusterdata is not None:
            text = subprocess.run(
                ["git", f"--git-dir={args.clusterdata}", "show", f"HEAD:cluster-trace-gpu-v2023/csv/{csv_name}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            (out / csv_name).write_text(text)
        elif not (out / csv_name).exists():
            shutil.copyfile(args.traces / csv_name, out / csv_name)
        for seed in _seeds(args.seeds):
            text = make_order(cooked, out / csv_name, nodes_csv, seed)
            path = out / "orders" / f"openb_pod_list_{lst}.seed{seed}.order.gz"
            with gzip.open(path, "wt") as fh:
                fh.write(text)
            print(path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
