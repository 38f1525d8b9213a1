"""The ranking kernels compiled for a GPU architecture on a machine without one: each precision at the settings
of ``recserve.train.rank_kernels`` (or --configs), with the shared memory each program needs beside the card's
limit. Triton's front end and ptxas run on the CPU, so a kernel that does not compile, or a setting that would
not launch on an H100 (227 KB) or an A100 (163 KB), is found before any GPU is at hand.

    pip install --target /tmp/triton triton  # a CPU install of PyTorch brings no Triton
    PYTHONPATH=/tmp/triton:src python benchmarks/rank_kernels_compile.py --arch 90
"""

from __future__ import annotations

import argparse
import inspect

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import recserve.train.rank_kernels as kernels

POINTERS = {"target_ptr": "*i64", "users_ptr": "*i64", "items_ptr": "*i64", "above_ptr": "*i32", "bad_ptr": "*i32"}
SHARED_LIMITS = {"H100 / H200": 232_448, "A100": 166_912, "A10G / L4": 101_376}


def compile_kernel(kernel, constants: dict, arch: int, warps: int, stages: int):
    """``kernel`` compiled for sm_``arch`` with ``constants``; its other arguments float32 pointers or int32."""
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {
        name: POINTERS.get(name, "*fp32" if name.endswith("_ptr") else "constexpr" if name.isupper() else "i32")
        for name in names
    }
    source = ASTSource(kernel, signature, {(names.index(k),): v for k, v in constants.items()})
    return triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps, "num_stages": stages}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability as one number: 80, 86, 90")
    parser.add_argument("--hidden", type=int, default=64, help="the model's width (the steps of a tile's product)")
    parser.add_argument(
        "--configs", default="", help="BLOCK/BLOCK_K/warps/stages, comma-separated; empty: the defaults"
    )
    args = parser.parse_args()
    failed = False
    for config in (args.configs or kernels.setting()).split(","):
        try:
            kernels.use_setting(config)
        except ValueError as err:
            parser.error(f"--configs {err}")
        warps, stages = kernels.NUM_WARPS, kernels.NUM_STAGES
        for precision in kernels.PRECISIONS:
            shared = {}
            try:
                count = kernels.count_constants(args.hidden, precision)
                shared["count"] = compile_kernel(kernels._count_kernel, count, args.arch, warps, stages).metadata.shared
                pair = kernels.pair_constants(precision)
                shared["pair"] = compile_kernel(
                    kernels._pair_kernel, pair, args.arch, warps, kernels.PAIR_STAGES
                ).metadata.shared
            except Exception as err:  # Triton's compile errors have no common base class
                failed = True
                print(f"{config} {precision}: does not compile: {str(err)[-600:]}")
                continue
            fits = {card: all(v <= limit for v in shared.values()) for card, limit in SHARED_LIMITS.items()}
            cards = ", ".join(f"{card} {'fits' if ok else 'does not fit'}" for card, ok in fits.items())
            print(f"{config} {precision}: shared, count {shared['count']:,} B, pair {shared['pair']:,} B; {cards}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
