"""Times `recserve data` on a generated log: 10 million interactions, 1 million users, 100,000 items.

Prints wall time and peak memory (resident set, this process and its children).
Usage: python benchmarks/prepare_large.py [--interactions 10000000] [--users 1000000] [--items 100000]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from recserve.bench.synthetic import write_zipf_log
from recserve.data.datasets import prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interactions", type=int, default=10_000_000)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.parquet"
        write_zipf_log(log, args.users, args.items, max(1, args.interactions // args.users))
        start = time.perf_counter()
        info = prepare(str(log), Path(tmp) / "out")
        wall_s = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"interactions in: {args.interactions:,}; kept: {info['interactions']:,} "
        f"({info['users']:,} users, {info['items']:,} items)"
    )
    print(f"wall_s: {wall_s:.1f}  peak_rss_mib: {peak_mib:.0f} (generation included)")


if __name__ == "__main__":
    main()
