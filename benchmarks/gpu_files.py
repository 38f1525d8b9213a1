"""Files that travel to and from the GPU machine, for scripts/offline_gpu.sh:

- ``histories DATA OUT``: a prepared data folder's histories (all but each user's test item) as one .npz of
  item IDs and offsets, the requests the GPU benchmark sends;
- ``merge FOLDER``: the JSON results in FOLDER gathered into FOLDER/runs.json (by file name) and removed, as
  a call brings back at most 8 files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEEP = ("step.json", "prepared.json", "runs.json")  # results merge leaves where they are


def write_histories(data: Path, out: Path) -> None:
    import numpy as np

    from recserve.data.datasets import load_prepared

    prepared = load_prepared(data)
    seq = prepared.sequences.truncated(1)
    np.savez(out, items=prepared.vocab.to_ids(seq.items), offsets=seq.offsets)


def merge_results(folder: Path) -> Path:
    files = [f for f in sorted(folder.glob("*.json")) if f.name not in KEEP]
    runs = {f.stem: json.loads(f.read_text()) for f in files}
    target = folder / "runs.json"
    target.write_text(json.dumps(runs, indent=1) + "\n")
    for f in files:
        f.unlink()
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    histories = verbs.add_parser("histories", help="a prepared folder's histories as .npz")
    histories.add_argument("data", type=Path)
    histories.add_argument("out", type=Path)
    merge = verbs.add_parser("merge", help="a folder's JSON results into runs.json")
    merge.add_argument("folder", type=Path)
    args = parser.parse_args()
    if args.verb == "histories":
        write_histories(args.data, args.out)
    else:
        print(merge_results(args.folder))


if __name__ == "__main__":
    main()
