"""Compile the fused CfC scan kernels and Mamba2's window kernels for an H100/H200 (sm_90) on a machine without a
GPU, and count what one step of each kernel's loop executes.

    .venv/bin/python bench/triton_asm.py [--kernel _cfc_fwd_row_kernel,...] [--warps 8] [--dump DIR]

Why: the device machine is lent by the minute, and a step of a scan is latency-bound: its barriers (BAR),
shared-memory round trips (LDS/STS), shuffle trees (SHFL) and spills (LDL/STL) show in the SASS without one.
Prints, per kernel, the loop body's instruction count by opcode and the registers and stack; `--dump` keeps the
Triton GPU IR (its layouts) and the SASS. Sizes are the flagship's, fp32: the main trunk's (H 64, U 128, L 64) for
the scans, the encoder's (K 64, 8 heads of P 16, one group, N 16) for the window kernels.
"""

from __future__ import annotations

import argparse
import re
import runpy
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from alpha_core.models import cfc_triton, ssd_triton

BB = 32  # the tiles' rows at the flagship's B=4096
SIZES = {  # per module, the flagship's sizes as a launch sees them (constexprs), and its integer arguments
    cfc_triton: ({"L": 64, "H": 64, "U": 128, "BB": BB, "SAVE": True}, {"B"}),
    ssd_triton: ({"K": 64, "H": 8, "G": 1, "P": 16, "N": 16}, set()),
}


def signature(kernel, sizes: tuple[dict, set], half: bool) -> tuple[dict, dict]:
    """Argument types and constexprs at the flagship's sizes, as a launch at fp32 (or, with `half`, a launch of the
    tiles under a bf16 autocast) would see them; every other argument is an fp32 pointer."""
    given, ints = sizes[0] | {"PRECISION": "tf32", "HALF": half}, sizes[1]
    constexprs = {name: given[name] for name in kernel.arg_names if name in given}
    sig = {name: "constexpr" if name in constexprs else "i32" if name in ints else "*fp32" for name in kernel.arg_names}
    return sig, constexprs


def cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [str(Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"), flag, f.name], capture_output=True, text=True
        ).stdout


def disassemble(cubin: bytes) -> str:
    return cuobjdump(cubin, "-sass")


def loop_stats(sass: str) -> dict:
    """Instructions of the scan's loop body (from the back edge's target to the back edge), by opcode."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+ )?([A-Z0-9_]+)[^;]*?(0x[0-9a-f]+)?\s*;", sass)
    at = {int(addr, 16): i for i, (addr, *_) in enumerate(lines)}
    for i, (addr, _, op, target) in enumerate(lines):
        if op == "BRA" and target and int(target, 16) < int(addr, 16):
            body = [op for _, _, op, _ in lines[at[int(target, 16)] : i + 1]]
            counts = {
                key: body.count(key)
                for key in ("BAR", "SHFL", "LDS", "STS", "LDL", "STL", "LDG", "STG", "MUFU", "FFMA", "FMUL", "FADD")
            }
            return {"instructions": len(body), **counts}
    return {}


def resources(cubin: bytes) -> dict:
    """Registers and spill bytes, from cuobjdump (Triton reads them only when it loads onto a GPU)."""
    usage = cuobjdump(cubin, "--dump-resource-usage")
    found = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return {
        "registers": int(found.get("REG", -1)),
        "local_bytes": int(found.get("LOCAL", 0)),
        "stack": int(found.get("STACK", 0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    kernels = {  # name -> (kernel, its sizes)
        name: (value, sizes)
        for module, sizes in SIZES.items()
        for name, value in vars(module).items()
        if name.endswith("_kernel") and isinstance(value, triton.runtime.JITFunction)
    }
    parser.add_argument("--kernel", default=",".join(kernels), help=f"of {', '.join(kernels)}")
    parser.add_argument("--warps", type=int, default=8)
    parser.add_argument("--dump", type=Path)
    parser.add_argument("--maxnreg", type=int, help="cap the registers per thread (Triton's maxnreg)")
    parser.add_argument("--half", action="store_true", help="the tiles' bf16 operands (a bf16 autocast), 32 rows")
    parser.add_argument("--extra", action="append", default=[], help="candidate kernels from a file: path.py:name")
    args = parser.parse_args()
    for spec in args.extra:
        path, name = spec.split(":")
        kernels[name] = (runpy.run_path(path)[name], SIZES[cfc_triton])
    target = GPUTarget("cuda", 90, 32)
    for name in args.kernel.split(","):
        kernel, sizes = kernels[name]
        sig, constexprs = signature(kernel, sizes, args.half)
        # as a launch specializes them: every pointer 16-byte aligned (torch allocations are)
        attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(kernel.arg_names) if sig[arg].startswith("*")}
        src = ASTSource(
            fn=kernel, signature=sig, attrs=attrs, constexprs={(kernel.arg_names.index(k),): v for k, v in constexprs.items()}
        )
        compiled = triton.compile(
            src,
            target=target,
            options={"num_warps": args.warps, "num_stages": 1} | ({"maxnreg": args.maxnreg} if args.maxnreg else {}),
        )
        sass = disassemble(compiled.asm["cubin"])
        shared = {"shared_bytes": compiled.metadata.shared}
        print(f"{name} w{args.warps}: loop {loop_stats(sass)} {resources(compiled.asm['cubin']) | shared}")
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{name}_w{args.warps}.ttgir").write_text(compiled.asm["ttgir"])
            (args.dump / f"{name}_w{args.warps}.sass").write_text(sass)


if __name__ == "__main__":
    main()
