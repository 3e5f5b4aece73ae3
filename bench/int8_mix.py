#!/usr/bin/env python3
"""The instruction mix of the int8 panel kernels' block loops, read from the compiled object (objdump -d -C).

    python3 bench/int8_mix.py [build/CMakeFiles/clef_ops.dir/src/ops/int8_kernels.cpp.o]

For every full-size tile instantiation (src/ops/int8_kernels.cpp: tile<Isa, R, V, kBits> with the instruction set's
own R and V) of every Highway target, the loop over blocks (the backward jump whose range holds the most
multiply-add instructions; one iteration = one block of 32 k, R rows x V vectors) is counted by instruction, and
per multiply-add: instructions in all, the multiply-add instructions themselves, loads and the fp32 epilogue.
docs/PERFORMANCE.md ("Int8 kernel yardstick") quotes its output.
"""
import collections
import re
import subprocess
import sys

obj = sys.argv[1] if len(sys.argv) > 1 else "build/CMakeFiles/clef_ops.dir/src/ops/int8_kernels.cpp.o"
asm = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", obj], capture_output=True, text=True,
                     check=True).stdout.split("\n")

DOT = ("vpdpbusd", "{vex}", "vpmaddubsw", "vpmaddwd", "vpsignb", "vpaddd", "vpaddw")
EPILOGUE = ("vcvtdq2ps", "vmulps", "vfmadd", "vbroadcastss")
FUNC = re.compile(r"<void clef::ops::i8::N_(\w+)::tile<clef::ops::i8::N_\w+::(\w+), (\d+), (\d+), (\d+)>\(")

# (target, isa) -> the instruction set's own R and V (int8_kernels.cpp: kRows, kVecs), and lanes per vector.
funcs = {}
for i, line in enumerate(asm):
    m = FUNC.search(line)
    if m and line.endswith(">:"):
        funcs[(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)))] = i

for key in sorted(funcs):
    target, isa, rows, vecs, bits = key
    # Only the widest tile of each instruction set and kind (the one a full tile takes).
    if any(k[:2] == key[:2] and k[4] == bits and (k[2], k[3]) > (rows, vecs) for k in funcs):
        continue
    ins = []
    for line in asm[funcs[key] + 1:]:
        if not line.strip():
            break
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if m:
            op = m.group(2) + (" " + m.group(3).split()[0] if m.group(2) == "{vex}" else "")
            ins.append((int(m.group(1), 16), op, m.group(3)))
    best = None
    for a, op, arg in ins:
        m = re.match(r"([0-9a-f]+) <", arg)
        if op.startswith("j") and m and int(m.group(1), 16) < a:
            body = [x for x in ins if int(m.group(1), 16) <= x[0] <= a]
            n = sum(1 for x in body if x[1].startswith(DOT[:4]))
            if best is None or n > best[0]:
                best = (n, body)
    if best is None:
        continue
    body = best[1]
    lanes = 16 if (target.startswith("AVX3") and isa == "Vnni") else 8
    macs = rows * vecs * lanes * 32
    count = collections.Counter(x[1] for x in body)
    dot = sum(v for k, v in count.items() if k.startswith(DOT))
    loads = sum(1 for x in body if "(" in x[2] and not x[1].startswith(EPILOGUE) and "rsp" not in x[2])
    epi = sum(v for k, v in count.items() if k.startswith(EPILOGUE))
    spill = sum(1 for x in body if "rsp" in x[2])
    kind = "signed" if bits == 0 else f"{bits}-bit levels"
    print(f"{target} {isa} {kind}: {rows} rows x {vecs} vectors of {lanes} columns; per block "
          f"{len(body)} instructions for {macs} multiply-adds = {len(body) / macs * 64:.2f} per 64 "
          f"(multiply-add instructions {dot / macs * 64:.2f}, loads {loads / macs * 64:.2f}, fp32 epilogue "
          f"{epi / macs * 64:.2f}, stack {spill / macs * 64:.2f})")
    print("    " + ", ".join(f"{v} {k}" for k, v in count.most_common()))
