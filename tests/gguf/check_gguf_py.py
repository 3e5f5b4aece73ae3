#!/usr/bin/env python3
"""GGUF interop checks with llama.cpp's own Python GGUF package (gguf-py: numpy, not our code).

  check_gguf_py.py dequant QUANT.gguf F32.gguf
      F32.gguf is `clef convert --type f32` of QUANT.gguf: gguf-py's dequantisation of every tensor of
      QUANT.gguf (gguf.quants.dequantize) must equal the fp32 tensor of the same name bit for bit, and the
      metadata must be the same apart from general.file_type and general.alignment.
  check_gguf_py.py types FILE.gguf TYPE=COUNT ...
      gguf-py reads FILE.gguf (header, metadata, every tensor's data and shape) and the file holds COUNT tensors
      of each ggml TYPE named (llama.cpp's names: F32, Q8_0, Q4_K, IQ2_XXS, ...), and no others.
  check_gguf_py.py imatrix FILE.gguf OUT.dat
      Writes an importance matrix in llama.cpp's legacy format (llama-imatrix's .dat: i32 entry count; per
      entry i32 name length, name, i32 ncall, i32 nval, f32 values; i32 chunk count, dataset name) with a
      positive weight per column of every matrix of FILE.gguf, so `clef convert --imatrix` can write the
      types that need one.

Run with PYTHONPATH pointing at llama.cpp's gguf-py (tests/gguf/run_gguf_py_check.sh fetches it).
Exit status 1 on the first difference, with a line saying what differs.
"""
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def metadata(reader):
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.file_type", "general.alignment"):
            continue
        out[name] = [bytes(field.parts[i].tobytes()) for i in field.data]
    return out


def dequant(quant_path, f32_path):
    q, f = GGUFReader(quant_path), GGUFReader(f32_path)
    if metadata(q) != metadata(f):
        fail("metadata differs")
    f_by_name = {t.name: t for t in f.tensors}
    if len(f_by_name) != len(q.tensors):
        fail(f"{len(q.tensors)} tensors in {quant_path}, {len(f_by_name)} in {f32_path}")
    types, failures = {}, []
    for t in q.tensors:
        o = f_by_name.get(t.name)
        if o is None:
            fail(f"{t.name} missing from {f32_path}")
        if o.tensor_type != GGMLQuantizationType.F32:
            fail(f"{t.name} is {o.tensor_type.name} in {f32_path}, not F32")
        ref = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        got = np.ascontiguousarray(o.data, dtype=np.float32)
        if ref.size != got.size or list(t.shape) != list(o.shape):
            fail(f"{t.name}: shape {list(t.shape)} vs {list(o.shape)}")
        a, b = ref.reshape(-1).view(np.uint32), got.reshape(-1).view(np.uint32)
        bad = np.nonzero(a != b)[0]
        if bad.size:
            i = int(bad[0])
            failures.append(f"{t.name} ({t.tensor_type.name}): {bad.size} values differ, first at {i}: "
                            f"gguf-py {ref.reshape(-1)[i]!r} clef {got.reshape(-1)[i]!r}")
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    if failures:
        fail(quant_path + ":\n  " + "\n  ".join(failures))
    print("ok:", quant_path, " ".join(f"{k}={v}" for k, v in sorted(types.items())))


def imatrix(path, out):
    entries = [(t.name, int(t.shape[0])) for t in GGUFReader(path).tensors if len(t.shape) == 2]
    with open(out, "wb") as f:
        f.write(np.int32(len(entries)).tobytes())
        for k, (name, cols) in enumerate(entries):
            f.write(np.int32(len(name)).tobytes() + name.encode())
            ncall = 4  # values are stored times ncall
            values = 0.25 + ((np.arange(cols) * 7 + k) % 13).astype(np.float32) / 4
            f.write(np.int32(ncall).tobytes() + np.int32(cols).tobytes())
            f.write((values * ncall).astype(np.float32).tobytes())
        f.write(np.int32(1).tobytes() + np.int32(4).tobytes() + b"test")
    print("ok:", out, len(entries), "entries")


def types(path, expected):
    r = GGUFReader(path)
    counts = {}
    for t in r.tensors:
        n = int(np.prod(t.shape))
        d = dequantize(t.data, t.tensor_type)
        if d.size != n:
            fail(f"{t.name}: {d.size} values for shape {list(t.shape)}")
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    want = {}
    for e in expected:
        k, v = e.split("=")
        want[k] = int(v)
    if counts != want:
        fail(f"{path}: tensor types {sorted(counts.items())}, expected {sorted(want.items())}")
    print("ok:", path, " ".join(f"{k}={v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "dequant":
        dequant(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "imatrix":
        imatrix(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "types":
        types(sys.argv[2], sys.argv[3:])
    else:
        fail(__doc__)
