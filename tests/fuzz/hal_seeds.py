#!/usr/bin/env python3
"""Writes the seed corpora of fuzz_tensor and fuzz_launch (tests/fuzz/corpus/{tensor,launch})
in the encoding tests/fuzz/input.h reads: a few valid ops and launches for the fuzzer to
mutate from. Run again after changing either target's order of reads."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def number(x):
    return bytes([x & 0xFF, (x >> 8) & 0xFF])


def wide(x):
    return bytes([0, x]) if x < 256 else bytes([3]) + x.to_bytes(8, "big")


def real(f):
    return struct.pack(">f", f)


def tensor(fn, shape, operands, alpha=1.0, beta=0.0, mask=0, sizes=(1024, 1024, 1024)):
    out = b"".join(number(s - 1) for s in sizes) + number(fn) + number(len(shape))
    out += b"".join(wide(d) for d in list(shape) + [1] * (6 - len(shape)))
    for i in range(4):
        if i < len(operands):
            which, offset, strides = operands[i][:3]
            kind = operands[i][3] if len(operands[i]) > 3 else 0  # TensorType
            out += number(0) + number(which) + wide(offset)
            out += b"".join(wide(s) for s in list(strides) + [0] * (6 - len(strides))) + number(kind)
        else:  # no buffer: no index read
            out += number(3) + wide(0) + b"".join(wide(0) for _ in range(6)) + number(0)
    return out + real(alpha) + real(beta) + number(mask) + wide(100) + number(1) + number(3)


def launch(kernel, args, grid=(1, 1, 1), block=(1, 1, 1), sizes=(1024, 1024, 1024)):
    out = number(1) + number(1) + b"".join(wide(g) for g in grid) + b"".join(wide(b) for b in block)
    out += b"".join(wide(0) for _ in range(3)) + wide(0) + number(0)
    out += b"".join(number(s - 1) for s in sizes) + number(16) + number(len(args))
    types = {"buffer": 0, "u32": 1, "u64": 3, "f32": 5, "local": 7, "bytes": 8}
    for kind, value in args:
        out += number(types[kind]) + number(0) + number(value if kind == "buffer" else 0) + wide(0) + number(8)
        out += wide(value if kind != "buffer" else 0)
    return out + number(["gemm", "axpy", "vadd", "reduceSum"].index(kernel))


def write(folder, name, data):
    os.makedirs(os.path.join(HERE, "corpus", folder), exist_ok=True)
    with open(os.path.join(HERE, "corpus", folder, name), "wb") as f:
        f.write(data)


# add over [8, 8] (row-major), sum of rows, matmul [4, 4, 4], log_softmax, a transposed copy, fill.
write("tensor", "add", tensor(2, [8, 8], [(0, 0, [8, 1]), (1, 0, [8, 1]), (2, 0, [8, 1])], alpha=0.5))
write("tensor", "sum", tensor(10, [8, 8], [(0, 0, [0, 1]), (1, 0, [8, 1])], mask=1))
write("tensor", "matmul", tensor(11, [4, 4, 4], [(0, 0, [4, 1, 0]), (1, 0, [4, 0, 1]), (2, 0, [0, 1, 4])], beta=1.0))
write("tensor", "logsoftmax", tensor(12, [4, 16], [(0, 0, [16, 1]), (1, 0, [16, 1])]))
write("tensor", "transpose", tensor(0, [8, 8], [(0, 0, [8, 1]), (1, 0, [1, 8])]))
write("tensor", "argmax", tensor(58, [8, 8], [(0, 0, [1, 0], 1), (1, 0, [8, 1])], mask=2))
write("tensor", "eq-i64", tensor(42, [64], [(0, 0, [1], 2), (1, 0, [1], 1), (2, 64, [1], 1)]))
write("tensor", "where", tensor(48, [16], [(0, 0, [1]), (1, 0, [1], 2), (2, 16, [1]), (3, 32, [1])]))
write("tensor", "index-select", tensor(60, [1, 4, 2, 8], [(0, 0, [0, 2, 1, 0]), (1, 0, [0, 0, 1, 2]), (2, 0, [0, 1, 0, 0], 1)]))
write("tensor", "embedding-backward", tensor(61, [8, 2, 4], [(0, 0, [2, 1, 0]), (1, 0, [0, 1, 2]), (2, 0, [0, 0, 1], 1)]))
write("tensor", "uniform", tensor(62, [64], [(0, 0, [1])], alpha=-1.0, beta=1.0))
write("tensor", "fill-stride0", tensor(1, [1000], [(0, 3, [0])], alpha=2.0))
# max pooling: 2x2 windows, stride 2, over two 6x6 planes, and its backward
write("tensor", "max-pool", tensor(66, [1, 2, 3, 3, 2, 2], [(0, 0, [18, 9, 3, 1, 0, 0]), (1, 0, [72, 36, 12, 2, 6, 1]),
                                                          (2, 0, [18, 9, 3, 1, 0, 0], 1)]))
write("tensor", "max-pool-backward", tensor(67, [1, 2, 3, 3, 6, 6], [(0, 0, [72, 36, 0, 0, 6, 1]), (1, 0, [18, 9, 3, 1, 0, 0]),
                                                                   (2, 0, [18, 9, 3, 1, 0, 0], 1)]))
# a descending sort of two rows of 8 (the scratch in buffer 0, past out), and hardswish's backward
write("tensor", "sort", tensor(74, [2, 8], [(0, 0, [8, 1]), (1, 0, [8, 1]), (2, 0, [8, 1], 1), (0, 16, [8, 1], 1)], alpha=1.0))
write("tensor", "hardswish-backward", tensor(69, [64], [(0, 0, [1]), (1, 0, [1]), (2, 0, [1])]))
# an i64 amax of rows (exact), an i64 abs, and an i64 add (wrapping past the range)
write("tensor", "amax-i64", tensor(56, [8, 8], [(0, 0, [1, 0], 1), (1, 0, [8, 1], 1)], mask=2))
write("tensor", "abs-i64", tensor(25, [64], [(0, 0, [1], 1), (1, 0, [1], 1)]))
write("tensor", "add-i64", tensor(2, [64], [(0, 0, [1], 1), (1, 0, [1], 1), (2, 64, [1], 1)], alpha=-16777216.0))
# f32 into i64 past its range (a fill of 3e38; a copy of whatever the buffer holds): -2^63,
# where a plain conversion is undefined.
write("tensor", "fill-i64-huge", tensor(1, [64], [(0, 0, [1], 1)], alpha=3e38))
write("tensor", "copy-f32-i64", tensor(0, [64], [(0, 0, [1], 1), (1, 0, [1])]))
# i64 floor division and remainder over whatever the buffers hold (zeros, the smallest i64
# over -1: defined, where C's are not)
write("tensor", "div-i64", tensor(4, [64], [(0, 0, [1], 1), (1, 0, [1], 1), (2, 64, [1], 1)]))
write("tensor", "fmod-i64", tensor(97, [64], [(0, 0, [1], 1), (1, 64, [1], 1), (2, 0, [1], 1)]))
# the bits of i64 over whatever the buffers hold (every count, in range and out)
for fn, name in ((101, "bitwise-and"), (102, "bitwise-or"), (103, "bitwise-xor"), (104, "shift-left"), (105, "shift-right")):
    write("tensor", name, tensor(fn, [64], [(0, 0, [1], 1), (1, 0, [1], 1), (2, 64, [1], 1)]))
# polygamma of order 3 over whatever the buffer holds (zeta's loops: huge negatives bounded)
write("tensor", "polygamma", tensor(106, [64], [(0, 0, [1]), (1, 64, [1])], alpha=3))
# lgamma, digamma and erfinv over whatever the buffer holds (poles, NaNs, denormals)
for fn, name in ((98, "lgamma"), (99, "digamma"), (100, "erfinv")):
    write("tensor", name, tensor(fn, [64], [(0, 0, [1]), (1, 64, [1])]))
# linear algebra over whatever the buffers hold (pivots included: a hostile one makes NaN):
# a batch of two 8 x 8 matrices, b's three columns
write("tensor", "cholesky", tensor(107, [2, 8, 8], [(0, 0, [64, 8, 1]), (1, 0, [64, 8, 1]), (2, 0, [1, 0, 0], 1)]))
write("tensor", "triangular-solve", tensor(108, [2, 3, 8, 8], [(0, 0, [24, 1, 3, 0]), (1, 0, [64, 0, 8, 1]), (2, 0, [24, 1, 3, 0])],
                                           alpha=1.0))
write("tensor", "lu-factor", tensor(109, [2, 8, 8], [(0, 0, [64, 8, 1]), (1, 0, [64, 8, 1]), (2, 0, [8, 1, 0], 1),
                                                    (2, 16, [1, 0, 0], 1)]))
write("tensor", "lu-solve", tensor(110, [2, 3, 8, 8], [(0, 0, [24, 1, 3, 0]), (1, 0, [64, 0, 8, 1]), (2, 0, [8, 0, 1, 0], 1),
                                                      (0, 64, [24, 1, 3, 0])], alpha=1.0))
# gcd of whatever the buffers hold (the smallest i64, zeros)
write("tensor", "gcd", tensor(111, [64], [(0, 0, [1], 1), (1, 0, [1], 1), (2, 64, [1], 1)]))
# indexReduce's largest, out's own included, over whatever the index holds
write("tensor", "index-reduce", tensor(112, [8, 2, 4], [(0, 0, [2, 1, 0]), (1, 0, [0, 1, 2]), (2, 0, [0, 0, 1], 1)], alpha=1.0, beta=1.0))
# orthogonal factorizations over whatever the buffers hold (NaNs, infinities, zero columns):
# QR of two 8 x 6 matrices and its Q, the eigenproblem of two 8 x 8
write("tensor", "qr-factor", tensor(113, [2, 8, 6], [(0, 0, [48, 6, 1]), (1, 0, [48, 6, 1]), (2, 0, [6, 0, 1])]))
write("tensor", "householder-product", tensor(114, [2, 8, 6], [(0, 0, [48, 6, 1]), (1, 0, [48, 6, 1]), (2, 0, [6, 0, 1])]))
write("tensor", "symmetric-eigen", tensor(115, [2, 8, 8], [(0, 0, [64, 8, 1]), (1, 0, [64, 8, 1]), (2, 0, [8, 0, 1]),
                                                          (2, 16, [64, 8, 1])]))
write("tensor", "singular-values", tensor(116, [2, 8, 6], [(0, 0, [48, 6, 1]), (1, 0, [48, 6, 1]), (2, 0, [6, 0, 1]),
                                                          (2, 16, [48, 6, 1])]))
# CTC's lattice over whatever the labels and lengths hold (negative, past C, past T): 2
# sequences, 4 times, 5 extended labels, 3 classes
write("tensor", "ctc-lattice", tensor(117, [2, 4, 5, 3], [(0, 0, [20, 5, 1, 0]), (1, 0, [12, 3, 0, 1]), (2, 0, [5, 0, 1, 0], 1),
                                                         (2, 64, [1, 0, 0, 0], 1)], alpha=1.0))
# i64 into i32 (wrapping) and back
write("tensor", "copy-i64-i32", tensor(0, [64], [(0, 0, [1], 3), (1, 0, [1], 1)]))
write("launch", "gemm", launch("gemm", [("u32", 4), ("u32", 4), ("u32", 4), ("f32", 0), ("f32", 0),
                                        ("buffer", 0), ("buffer", 1), ("buffer", 2)]))
write("launch", "axpy", launch("axpy", [("u64", 64), ("f32", 0), ("buffer", 0), ("buffer", 1)]))
write("launch", "vadd", launch("vadd", [("u64", 64), ("buffer", 0), ("buffer", 1), ("buffer", 2)]))
write("launch", "reducesum", launch("reduceSum", [("u64", 200), ("buffer", 0), ("buffer", 1)], grid=(4, 1, 1), block=(64, 1, 1)))
