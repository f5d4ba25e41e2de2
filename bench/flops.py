#!/usr/bin/python3
"""flops.py CALLGRIND_OUT BINARY SAMPLES: the floating-point operations a run executed (callgrind's per-instruction
counts, objdump's mnemonics), per sample: an FMA counts 2 flops per lane, an add, subtract, multiply, divide or square
root 1; and the vector operations per lane (an FMA 1), what occupies the vector units.  Used by bench/flops.sh."""
import re, subprocess, sys
cg, binary, samples = sys.argv[1], sys.argv[2], float(sys.argv[3])
counts = {}
addr = 0
skip_next = False
for ln in open(cg):
    ln = ln.rstrip("\n")
    if ln.startswith("calls="):
        skip_next = True
        continue
    m = re.match(r"^(0x[0-9a-f]+|\+[0-9]+|-[0-9]+|\*)\s+(\S+)\s+(\d+)", ln)
    if not m:
        continue
    a = m.group(1)
    if a.startswith("0x"):
        addr = int(a, 16)
    elif a.startswith("+"):
        addr += int(a[1:])
    elif a.startswith("-"):
        addr -= int(a[1:])
    if skip_next:
        skip_next = False
        continue
    counts[addr] = counts.get(addr, 0) + int(m.group(3))
dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True, text=True).stdout
flops = 0.0
by = {}
for ln in dis.splitlines():
    m = re.match(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", ln)
    if not m:
        continue
    a = int(m.group(1), 16)
    n = counts.get(a)
    if not n:
        continue
    op, args = m.group(2), m.group(3)
    base = None
    if re.match(r"v?f(n?m(add|sub))(132|213|231)?[ps][sd]$", op) or re.match(r"vf(n?m(add|sub))(132|213|231)[ps][sd]$", op):
        base = 2
    elif re.match(r"v?(add|sub|mul|div|sqrt)[ps][sd]$", op):
        base = 1
    if base is None:
        continue
    packed = op.endswith("pd") or op.endswith("ps")
    width = 512 if "zmm" in args else 256 if "ymm" in args else 128
    lanes = (width // (64 if op.endswith("d") else 32)) if packed else 1
    f = base * lanes * n
    flops += f
    by[op] = by.get(op, 0) + f
vops = sum(v / (2 if k.startswith("vf") or k.startswith("f") else 1) for k, v in by.items())
print("flops %.4g: per sample %.1f flops, %.1f vector operations per lane" % (flops, flops / samples, vops / samples))
for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:12]:
    print("  %-14s %.1f per sample" % (k, v / samples))
