#!/usr/bin/python3
"""raccel.Session's own calls, without torch: buffers, copies, fills and the built-in ops
(gemm, axpy, vadd, reduce_sum) give the answers worked out here; a freed buffer is
refused by name; the session carries on after it."""
import struct
import sys

import raccel


def floats(s, h, n):
    return list(struct.unpack(f"{n}f", s.read(h, 0, 4 * n)))


s = raccel.Session(tflops=1, program="session-ops")
a, b, c, d = (s.alloc(16) for _ in range(4))
s.write(a, 0, struct.pack("4f", 1, 2, 3, 4))
s.write(b, 0, struct.pack("4f", 0, 1, 1, 0))   # swaps the columns of a
s.fill(c, 0, 16, 0)
s.gemm(2, 2, 2, 1.0, a, b, 0.0, c)
got = {"gemm": floats(s, c, 4)}
s.axpy(4, 2.0, a, c)                            # c = 2a + c
got["axpy"] = floats(s, c, 4)
s.vadd(4, a, c, d)                              # d = a + c
got["vadd"] = floats(s, d, 4)
s.copy(b, 4, d, 8, 8)                           # b[1:3] = d[2:4]
got["copy"] = floats(s, b, 4)
s.reduce_sum(4, a, d)
got["reduce_sum"] = floats(s, d, 1)
s.fill(d, 4, 4, 0x3F)                           # bytes 0x3f3f3f3f in d[1]
got["fill"] = floats(s, d, 2)[1:]
want = {"gemm": [2, 1, 4, 3], "axpy": [4, 5, 10, 11], "vadd": [5, 7, 13, 15], "copy": [0, 13, 15, 0],
        "reduce_sum": [10], "fill": [struct.unpack("f", b"\x3f" * 4)[0]]}
bad = [f"{k}: {got[k]} != {want[k]}" for k in want if got[k] != want[k]]
s.free(a)
try:
    s.write(a, 0, b"1234")
    s.fence()
    bad.append("a write to a freed buffer was not refused")
except RuntimeError as e:
    if "does not exist" not in str(e):
        bad.append(f"a freed buffer's refusal does not say why: {e}")
if floats(s, c, 4) != want["axpy"]:
    bad.append("the session did not carry on after the refusal")
s.close()
print("\n".join(bad) if bad else "every call gave its answer")
sys.exit(1 if bad else 0)
