@0xd211b213ba5826eb;
# The guest <-> scheduler instruction set, version 1.
#
# A session is one guest program's ordered stream of Instructions on one channel.
# Instructions are asynchronous: the client assigns its own handles (buffers,
# programs), scoped to its session, and sends alloc -> write -> launch -> read back to
# back. Only read, fence and hello produce a reply; a failed instruction produces an
# `error` reply naming its sequence number. A handle that a failed instruction should
# have created (alloc, loadProgram) is poisoned: every later
# instruction using it fails with "dependency failed" naming the root failure. Existing
# buffers are never changed by a failed instruction (arguments are checked first).
# The scheduler forwards instructions to the netaccel verbatim (only the frame header
# changes), so this file is also what netaccel executes.

$import "/capnp/c++.capnp".namespace("raccel::wire");
using Frame = import "frame.capnp";

enum CardKind {
  gpu @0;
  npu @1;
  fpga @2;
  cpu @3;
}

enum ProgramKind {
  builtin @0;   # a library built into every backend, by name ("raccel.builtins")
  ptx @1;
  cubin @2;
  xclbin @3;
  openclC @4;
  spirv @5;
  cudaC @6;     # CUDA C++ source, compiled with NVRTC on the netaccel
  openclUnits @7;  # OpenCL C units and their headers, compiled and linked on the card
}

struct Instruction {
  union {
    hello @0 :Hello;
    alloc @1 :Alloc;
    free @2 :Free;
    write @3 :Write;
    read @4 :Read;
    copy @5 :Copy;
    fill @6 :Fill;
    loadProgram @7 :LoadProgram;
    launch @8 :Launch;
    op @9 :Op;
    fence @10 :Void;
    graph @11 :Graph;
    # What a loaded program holds: its build log, kernels, their arguments and
    # work-group limits, as the card's compiler reports them. Answered by `program`.
    describeProgram @12 :UInt64;
    # Where the vaccel is now (its blocks and cards: they change when it is moved or
    # rebuilt after a loss). Answered by the scheduler, in order, with `vaccel`.
    describeVaccel @13 :Void;
  }
}

# A task graph (datablocks): built-in ops over the session's buffers, run as one
# instruction. The scheduler orders them by their data (an op that reads a buffer follows
# the last op that wrote it; an op that writes one follows the ops that read or wrote it
# before) and by `after`; it places each op on one of the vaccel's cards, moving as few
# buffer bytes between cards as it can, running independent branches on different cards
# at once, and leaves every buffer's latest contents on the primary at the end. Like an
# op, it answers only when it fails (an error under its sequence naming the node).
struct Graph {
  nodes @0 :List(GraphNode);
  placement @1 :Placement;
  enum Placement {
    fewestBytes @0;   # raccel's placement
    roundRobin @1;    # node i on the i-th card in turn (a baseline for comparison)
  }
}

struct GraphNode {
  op @0 :Op;
  after @1 :List(UInt32);   # earlier nodes (indices) it must also follow
}

struct Hello {
  versionMajor @0 :UInt16;
  versionMinor @1 :UInt16;
  program @2 :Text;           # for the operator's console
  tflops @3 :Float64;         # requested size of the virtual accelerator; 0 = one block
  kinds @4 :List(CardKind);   # accepted card kinds; empty = the VM's policy
  priority @5 :Int32;         # hint; capped by the VM's policy
  maxFrameBytes @6 :UInt32;   # 0 = Frame.defaultMaxFrameBytes
  # When the request does not fit even by preempting lower priorities: wait up to this
  # long for blocks to free (the welcome comes when it is placed); 0 = refuse at once.
  admitWaitMs @7 :UInt32;
  # While this vaccel is suspended (preempted by a higher priority, or by the operator),
  # its instructions fail with `unavailable` and the reason instead of waiting for it
  # to resume. Buffers are kept either way.
  noWait @8 :Bool;
  # raccel-guestd re-attaching a session after the scheduler restarted (or its port came
  # back): the vaccel and the token its welcome gave. The welcome then says after which
  # instruction to resend (`resumedAfter`); the other fields above are ignored.
  resume @9 :Resume;
}

struct Resume {
  vaccel @0 :UInt64;   # 0 = a new session
  token @1 :UInt64;
}

struct Welcome {
  versionMajor @0 :UInt16;
  versionMinor @1 :UInt16;
  maxFrameBytes @2 :UInt32;
  vaccel @3 :VaccelInfo;
  # Proves the session is this program's when it re-attaches (Hello.resume).
  token @4 :UInt64;
  # Answering a resume: the sequence number of the last instruction the vaccel took
  # (0 = none). The guest resends, in order, everything it sent after that instruction.
  resumedAfter @5 :UInt64;
}

struct BlockRange {
  first @0 :UInt32;   # global block number, 1-based
  count @1 :UInt32;
}

struct CardRef {
  node @0 :Text;
  index @1 :UInt32;   # card index on its node
  kind @2 :CardKind;
  model @3 :Text;
  blocks @4 :UInt32;  # blocks of this card held by the vaccel
  memoryBytes @5 :UInt64;
  programKinds @6 :List(ProgramKind);
  # What the card's own runtime reports (0 = not known): compute units, the largest
  # work-group (threads per block), local (shared) memory per work-group.
  computeUnits @7 :UInt32;
  maxWorkGroupSize @8 :UInt32;
  localMemBytes @9 :UInt64;
  # An OpenCL card's extensions (space-separated) and CL_DEVICE_DOUBLE_FP_CONFIG (0: no
  # double precision); the guest's OpenCL offers what every card of the vaccel has.
  openclExtensions @10 :Text;
  doubleFpConfig @11 :UInt64;
  images @12 :ImageLimits;   # none: the card has no images
}

# What a card offers for OpenCL images (common/images.h): OpenCL's CL_DEVICE_IMAGE*
# limits and the read-write formats it takes, each (channel order << 16 | channel type)
# in OpenCL's numbers. No formats: no image support.
struct ImageLimits {
  max2dWidth @0 :UInt64;
  max2dHeight @1 :UInt64;
  max3dWidth @2 :UInt64;
  max3dHeight @3 :UInt64;
  max3dDepth @4 :UInt64;
  maxArraySize @5 :UInt64;
  maxBufferPixels @6 :UInt64;
  maxReadArgs @7 :UInt32;
  maxWriteArgs @8 :UInt32;
  maxSamplers @9 :UInt32;
  formats @10 :List(UInt32);
}

struct VaccelInfo {
  id @0 :UInt64;
  blocks @1 :List(BlockRange);
  cards @2 :List(CardRef);
  blockTflops @3 :Float64;
  memoryQuota @4 :UInt64;   # bytes the VM may hold on its cards (0 = no limit)
}

struct Alloc {
  handle @0 :UInt64;  # client-chosen, nonzero, unused in this session
  size @1 :UInt64;
}

struct Free {
  handle @0 :UInt64;
}

struct Write {
  buffer @0 :UInt64;
  offset @1 :UInt64;
  data @2 :Data;      # at most Frame.chunkBytes; larger writes are several Writes
}

struct Read {
  buffer @0 :UInt64;
  offset @1 :UInt64;
  length @2 :UInt64;  # answered by `data` replies in order, the last one with last=true
}

struct Copy {
  dst @0 :UInt64;
  dstOffset @1 :UInt64;
  src @2 :UInt64;
  srcOffset @3 :UInt64;
  length @4 :UInt64;
}

struct Fill {
  buffer @0 :UInt64;
  offset @1 :UInt64;
  length @2 :UInt64;
  value @3 :UInt8;
}

struct LoadProgram {
  handle @0 :UInt64;
  kind @1 :ProgramKind;
  name @2 :Text;      # builtin library name, or a label for source/binary programs
  code @3 :Data;      # source or binary, for non-builtin kinds
  options @4 :Text;   # passed to the card's compiler (OpenCL C build options, NVRTC flags)
}

struct Launch {
  program @0 :UInt64;
  kernel @1 :Text;
  grid @2 :List(UInt32);
  block @3 :List(UInt32);
  sharedBytes @4 :UInt32;
  args @5 :List(Arg);
  # OpenCL NDRange semantics: the global id of the first work-item in each dimension.
  offset @6 :List(UInt64);
  # The card chooses the work-group size (OpenCL's NULL local size); grid is then the
  # global size and block is ignored.
  autoBlock @7 :Bool;
  # OpenCL's work_dim, 1 to 3: the launch runs with exactly this many dimensions and
  # its block exactly as given, 1 x 1 x 1 included. 0 (older guests): 3 dimensions, and
  # a block of 1 x 1 x 1 lets the card choose.
  workDim @8 :UInt8;
}

struct Arg {
  union {
    buffer @0 :UInt64;
    u32 @1 :UInt32;
    i32 @2 :Int32;
    u64 @3 :UInt64;
    i64 @4 :Int64;
    f32 @5 :Float32;
    f64 @6 :Float64;
    local @7 :UInt32;         # a __local (shared) array of this many bytes
    bytes @8 :Data;           # by value, the argument's bytes as the kernel declares them (a struct, a vector)
    subBuffer @9 :SubBuffer;  # a buffer from an offset on
    image @10 :ImageArg;      # a buffer's pixels, made an image on the card for this launch
    sampler @11 :UInt32;      # normalized coordinates, addressing and filter (common/images.h)
  }
}

# An OpenCL image as a kernel argument: the buffer holds its pixels packed (rows of
# width x pixel bytes, then rows of the next slice or array layer) from `offset` on. The
# card makes the image with its own driver, fills it from the buffer, and copies back
# what a kernel that may write it wrote. Numbers are OpenCL's (cl_mem_object_type,
# cl_channel_order, cl_channel_type); sizes a type does not use are 0.
struct ImageArg {
  buffer @0 :UInt64;
  offset @1 :UInt64;
  type @2 :UInt32;
  channelOrder @3 :UInt32;
  channelType @4 :UInt32;
  width @5 :UInt64;
  height @6 :UInt64;
  depth @7 :UInt64;
  arraySize @8 :UInt64;
}

struct SubBuffer {
  buffer @0 :UInt64;
  offset @1 :UInt64;
}

# Built-in ops, f32 data, row-major.
struct Op {
  union {
    gemm @0 :Gemm;
    axpy @1 :Axpy;
    vadd @2 :Vadd;
    reduceSum @3 :ReduceSum;
    tensor @4 :TensorOp;
  }
}

# A tensor op over strided views of buffers (what a framework's device needs: PyTorch's
# privateuseone backend). Each operand names its element type; every function takes f32
# operands but where said below (nllLoss's targets are i64). The op iterates
# over `shape` (1 to 6 dimensions); every operand is an element offset into its buffer
# and one stride per dimension of `shape`, in elements (0 broadcasts, or marks a
# dimension the operand does not span). Operand 0 is the output. Per function:
#   copy, fill, add, mul, div, relu, thresholdBackward, exp, log, affine: elementwise,
#     out = a | alpha | a + alpha*b | alpha*a*b | a/b | max(a,0) | (b <= alpha ? 0 : a) |
#     exp a | log a | alpha*a + beta
#   sum: out = alpha * the sum of a over the dimensions in reduceMask (bit d = dim d)
#     + beta*out (out not read when beta = 0), where out's strides are 0
#   matmul: shape [m, n, k], or [batch, m, n, k] (one matmul per batch entry, each
#     operand's batch stride first); out[m,n] = alpha * sum_k a[m,k]*b[k,n] + beta*out
#     (out not read when beta = 0); out's k stride, a's n stride and b's m stride are 0
#   logSoftmax: shape [rows, cols] (at most 2^24 cols), over each row; logSoftmaxBackward: out = a - exp(b) *
#     rowsum(a) with a the gradient and b the forward's output
#   softmax: shape [rows, cols] (at most 2^24 cols), over each row; softmaxBackward:
#     out = b * (a - rowsum(a * b)) with a the gradient and b the forward's output
#   nllLoss: shape [n, classes]; operands out (scalar), a (log-probabilities), target
#     (i64, stride 0 over classes), totalWeight (scalar): out = -sum of a[i, target[i]]
#     over targets other than ignoreIndex, divided by their count when `mean`;
#     totalWeight = that count. A target outside [0, classes) makes the loss NaN.
#     At most 2^24 rows (one work-item walks them all).
#   nllLossBackward: operands out (n x classes), a (the loss's gradient, a scalar),
#     target, totalWeight: out = -a (/ totalWeight when `mean`) at each target, else 0.
#   sqrt, tanh, sigmoid, abs, pow, sign: elementwise, out = sqrt a | tanh a |
#     1/(1+exp(-a)) | |a| | a^alpha | 1, -1 or a itself (0 and NaN); abs also over i64
#     into i64, exactly (the smallest i64 stays itself, as in two's complement)
#   tanhBackward, sigmoidBackward: out = a*(1-b*b) | a*b*(1-b), with a the gradient and b
#     the forward's output
#   addcmul, addcdiv: elementwise over three inputs, out = a + alpha*b*c | a + alpha*b/c
#   maximum, minimum: elementwise, the larger | smaller of a and b (NaN if either is)
#   layerNorm: shape [rows, cols], or [rows, outer, cols] (a row of outer x cols
#     elements: batch norm's channel over [batch, positions]; at most 2^24 elements a
#     row); operands out, a, mean, rstd (one element per row: strides past the rows 0):
#     over each row, mean = its mean, rstd = 1/sqrt(its variance + alpha), out = (a -
#     mean) * rstd
#   layerNormBackward: shape as layerNorm's; operands out, a (the gradient of the
#     normalized values), b (the normalized values), rstd (one per row): out = rstd *
#     (a - rowmean(a) - b * rowmean(a * b))
#   gelu (alpha 0: exact; else the tanh approximation), silu, leakyRelu (slope alpha),
#     softplus (beta alpha, threshold beta), hardtanh (clamped to [alpha, beta]):
#     elementwise activations; each ...Backward takes a (the gradient) and b (the
#     forward's input) and the same alpha and beta: out = a * the derivative at b
#     (hardtanh's: 0 at or past either bound)
#   copy, fill: also between any element types: a conversion (f32 to an integer
#     truncates toward zero, and NaN, infinities and values past i64's range give -2^63,
#     as x86 does; to bool is a != 0); integers are copied exactly
#   eq, ne, lt, le, gt, ge: elementwise, out (bool) = a op b, a and b of one type
#     (integers compared exactly)
#   where: out = a ? b : c, with a bool and out, b and c all f32 or all i64
#   clamp: out = min(max(a, alpha), beta) (NaN stays); log1p, reciprocal, rsqrt:
#     log(1+a) | 1/a | 1/sqrt(a); elu: a > 0 ? a : alpha*(exp(beta*a)-1) (beta the input
#     scale: 1, or celu's 1/alpha); eluBackward: a (the gradient) times that derivative at
#     b (the forward's input); lerp: a + alpha*(b - a)
#   sort: shape [kept..., n] (1 to 6 dimensions, at most 2^24 in n: one work-item walks
#     a row); operands out (the sorted values), a (the values, of out's type: f32 or i64),
#     index (i64: each sorted value's position in its row) and scratch (i64, the merge's
#     other half), all four apart: each row of a in ascending order (alpha 0) or
#     descending (alpha != 0), stable (equal values keep their order), a NaN above every
#     number (last ascending, first descending), as PyTorch's sort.
#   hardswish, hardsigmoid, mish: elementwise, out = a * min(max(a + 3, 0), 6) / 6 |
#     min(max(a + 3, 0), 6) / 6 | a * tanh(log1p(exp(a))); each ...Backward takes a (the
#     gradient) and b (the forward's input): out = a * the derivative at b, PyTorch's
#     (hardswish's: 0 below -3, b/3 + 1/2 up to 3, 1 above; hardsigmoid's: 1/6 strictly
#     inside (-3, 3), else 0)
#   floor, ceil, round, trunc, frac, sin, cos, tan, asin, acos, atan, sinh, cosh, erf,
#     erfc, expm1, log2, log10, exp2: elementwise, out = C's function of that name of a
#     (round: to the nearest, halves to even, as PyTorch's; frac: a - trunc(a)), f32
#   atan2, hypot, copysign, fmod: elementwise, out = C's function of that name of (a, b)
#     (fmod: the remainder with a's sign), f32
#   lgamma, digamma, erfinv: elementwise, f32: log |gamma(a)| (C's lgamma), its
#     derivative psi(a) (-inf at +0, NaN at the negative integers), erf's inverse
#     (+-inf at +-1, NaN past them)
#   polygamma: elementwise, f32: psi's n-th derivative of a, n = alpha (an integer in
#     [0, 64]; 0 is digamma): trigamma for 1, else (-1)^(n+1) n! zeta(n + 1, a) (Hurwitz's
#     zeta; NaN where a is below -2^20, whose terms f32 cannot step through)
#   bitwiseAnd, bitwiseOr, bitwiseXor, shiftLeft, shiftRight: over i64 (all three
#     operands): a & b, a | b, a ^ b, a << b and a >> b (arithmetic: the sign kept), the
#     shift's count taken modulo 64 (as x86 shifts, so PyTorch 1.13's CPU)
#   gcd: over i64 (all three operands): the greatest common divisor of |a| and |b| (0 for
#     two zeros; |-2^63| wraps to -2^63, as PyTorch's CPU)
#   div, fmod over i64 (all three operands): exact, div the quotient rounded down (Python's
#     //), fmod the remainder with a's sign (C's %); a divisor of 0 gives 0, and the
#     smallest i64 over -1 gives itself and remainder 0 (two's complement)
#   sum over i64 or bool: an exact i64 sum (alpha 1, beta 0 or 1)
#   add, mul over integers (i64 and bool, no f32): exact, alpha an integer (|alpha| at
#     most 2^24), wrapping past the i64 range (two's complement, as PyTorch's CPU); into
#     bool, nonzero is 1 (so bool add is or, bool mul is and); an integer sum wraps so too
#   amax, amin: the largest | smallest over the dimensions in reduceMask (NaN if any
#     is); argmax, argmin: out (i64) = the first position of the largest | smallest (a NaN
#     counts as both) among the reduced positions, counted row-major over them. Over f32,
#     or over i64 or bool compared exactly (amax and amin then write the input's type).
#     These four take the reduced dimensions after every kept one.
#   indexSelect: shape: the output's, then the rows picked from (2 to 6 dimensions in
#     all); operands out, a, index (i64), out's and index's strides 0 over the rows: each
#     output element is a's element at its own position in row index[its position], out
#     and a of one type (index_select: [outer, n, inner, rows] with a's stride 0 on n and
#     index's only on n; gather: the index has the output's shape). An index outside
#     [0, rows) gives NaN (0 for integers).
#   indexAdd: shape [cols..., rows, n] (2 to 6 dimensions); operands out (stride 0 over
#     n), a and index (i64), a's and index's strides 0 over the rows: out[d, w] = beta *
#     out[d, w] + alpha * (the sum of a[d, i] over the i with index[d, i] = w), the sum 0
#     for w = ignoreIndex (a padding row; -1 for none). At most 2^24 positions n. An
#     index outside [0, rows) adds nowhere. (embedding's backward: index stride 0 over
#     the columns; scatter_add and index_add along any dimension, moved last.)
#   indexReduce: indexAdd's shape and operands (no padding row): out[d, w] = the
#     reduction over out[d, w] itself (beta 1; beta 0 leaves it out) and the a[d, i] with
#     index[d, i] = w, in i's order: alpha 0 their product, 1 the largest, 2 the smallest
#     (a NaN in a wins; one in out stays), 3 the last picked. An element nothing picks
#     keeps its value. f32, but for the last pick: out and a of any one type, moved exactly.
#     (scatter_reduce's prod, amax and amin; a scatter or an index put whose picks meet.)
#   gatherSum: shape [kept..., picks, rows] (2 to 6 dimensions); operands out (f32, strides
#     0 over the picks and the rows), a (f32) and index (i64, stride 0 over the rows):
#     out[o] = beta * out[o] + alpha * (the sum over the picks p of a[o, p, index[o, p]]),
#     a pick outside [0, rows) adding 0. At most 2^24 picks. (im2col: one pick per
#     output, -1 for padding; col2im and pooling's backward: each input position's picks
#     among the windows that hold it.)
#   maxPool2d: shape [planes..., oh, ow, kh, kw] (4 to 6 dimensions: the windows, as a
#     strided view of the input over them); operands out (f32) and index (i64), both with
#     strides 0 over kh and kw, and a (f32): each window's largest element (a NaN, the
#     last one, wins, as in PyTorch) and, in index, its offset in a from its plane's
#     first element: the sum over the last four dimensions of position x a's stride, which
#     is h * W + w over a contiguous plane, PyTorch's index. At most 2^24 elements in a
#     row of windows (ow x kh x kw); a shape of 4 dimensions (one plane) at most 2^24 in all.
#   maxPool2dBackward: shape [planes..., oh, ow, h, w] (4 to 6 dimensions); operands out
#     (f32: the input's gradient, strides 0 over oh and ow), grad (f32) and index (i64),
#     both with strides 0 over h and w: each plane of out is set to 0, then every grad
#     element of the plane added at out's position index / w, index % w (an index outside
#     [0, h x w) adds nowhere). At most 2^24 of oh x ow + h x w a plane.
#   uniform, bernoulli, normal: out (f32) alone; per element, a Philox-4x32-10 draw
#     keyed by ignoreIndex at the element's position in out's buffer: alpha + (beta -
#     alpha) * u (u in [0, 1)) | 1 with probability alpha, else 0 | normal with mean
#     alpha and standard deviation beta.
#   f16 and bf16 operands of a float map function (rc_map's functions but copy, fill,
#     where, the comparisons and the integer ones): any of its operands may be f32, f16
#     or bf16; each element is read as f32, the function (and the fused scales) computed
#     in f32 and the result rounded once, to nearest even, into out's type: what PyTorch's
#     CPU computes for bf16. Every other function takes f16 and bf16 as storage alone.
#   copy, fill with an i32 operand: i32 is a storage type alone (PyTorch's int32 results:
#     linear algebra's pivots and infos); a copy converts to or from it, exactly between
#     integers (an i64 outside the i32 range wraps, two's complement). No other function
#     takes it.
#   cholesky: shape [batch..., n, n] (n at most 512); operands out (f32), a (f32) and info
#     (i64, strides 0 over the last two dimensions), all apart: out = L, lower triangular
#     with a positive diagonal, A = L L^T from a's lower triangle (the upper is not read),
#     out's upper triangle 0; info 0, or k where the leading minor of order k is the first
#     that is not positive definite (out's columns from k on are then NaN). (Upper: a's
#     and out's strides swapped.)
#   triangularSolve: shape [batch..., k, n, n] (n at most 4096); operands out, a and b
#     (f32), out's and b's strides 0 over the last dimension, a's 0 over k, out apart
#     from a and b: out[.., j, :] = X[:, j] solving A X = B, A triangular over the last
#     two dimensions (row, column), B's columns j over k; alpha's bit 0: A upper (else
#     lower), bit 1: A's diagonal taken as 1 (not read). A zero on the diagonal gives
#     infinities or NaN, as LAPACK's trsm.
#   luFactor: shape [batch..., n, n] (n at most 512); operands out (f32), a (f32), pivots
#     (i64, stride 0 over the last dimension) and info (i64, strides 0 over the last two),
#     all apart: LAPACK's getrf: out = L and U of P A = L U (L's unit diagonal not
#     stored), partial pivoting (the first of the largest magnitudes); pivots[i] (from 1)
#     the row swapped with row i at step i; info 0, or the first i (from 1) with U[i, i] 0.
#   luSolve: shape [batch..., k, n, n] (n at most 4096); operands out (f32), lu (f32, a
#     luFactor's), pivots (i64) and b (f32): lu's strides 0 over k, pivots' 0 over k and
#     the last dimension, out's and b's 0 over the last, out apart from the others: X
#     solving A X = B (getrs), or A^T X = B with alpha 1. A pivot outside [i + 1, n] at
#     step i makes its column NaN.
#   qrFactor: shape [batch..., m, n] (m and n at most 512); operands out (f32), a (f32)
#     and tau (f32, stride 0 over the rows), all apart: LAPACK's geqrf: out's upper
#     triangle R, below it the Householder vectors v_j (v_j[j] = 1 not stored), H_j = I -
#     tau[j] v_j v_j^T, A = H_0 ... H_{k-1} R (k = min(m, n)); tau 0 past k.
#   householderProduct: shape [batch..., m, n] (n <= m <= 512); operands out (f32), a
#     (f32, reflectors as qrFactor's out) and tau (f32, stride 0 over the rows), all
#     apart: LAPACK's orgqr: out = the first n columns of H_0 ... H_{n-1}.
#   symmetricEigen: shape [batch..., n, n] (n at most 256); operands out (f32), a (f32),
#     w (f32, stride 0 over the rows) and scratch (f32), all apart: the eigenvalues of
#     the symmetric matrix a's lower triangle gives (the upper not read) ascending in w,
#     their unit eigenvectors out's columns (signs as the rotations leave them); scratch
#     is overwritten. A NaN or infinity in a gives NaN in out and w.
#   singularValues: shape [batch..., m, n] (n <= m, m at most 512, n at most 256);
#     operands out (f32), a (f32), s (f32, stride 0 over the rows) and v (f32), all apart:
#     A = U diag(s) V^T with s descending, U out's columns (orthonormal, also where s is
#     0), V v's first n rows (its other rows not written). A NaN or infinity in a gives
#     NaN.
#   ctcLattice: shape [N, T, S', C] (T x S' at most 2^24); operands out (f32, strides 0
#     over C), log_probs (f32, 0 over S'), labels (i64, 0 over T and C) and lengths (i64,
#     0 over all but N), out apart from the others: per sequence n, CTC's log forward
#     variables (alpha 0) or backward ones (alpha 1) over the extended labels l' (blank,
#     label, blank...; the first negative one ends them) for the first lengths[n] times;
#     -inf elsewhere; NaN for a length outside [1, T] (the row) or a label outside [0, C).
struct TensorOp {
  fn @0 :TensorFn;
  shape @1 :List(UInt64);
  operands @2 :List(TensorOperand);
  alpha @3 :Float32 = 1;
  beta @4 :Float32;
  reduceMask @5 :UInt32;
  ignoreIndex @6 :Int64 = -100;
  mean @7 :Bool = true;
  # Elementwise functions over f32 only (those of the map kernel: not the comparisons,
  # where, the reductions or the random draws): operand a is read as preScale * a +
  # preShift, and each result written as postScale * r + postShift (two elementwise
  # steps fused into one op). Every other function takes them at (1, 0).
  preScale @8 :Float32 = 1;
  preShift @9 :Float32;
  postScale @10 :Float32 = 1;
  postShift @11 :Float32;
}

struct TensorOperand {
  buffer @0 :UInt64;
  offset @1 :UInt64;          # elements
  strides @2 :List(UInt64);   # elements, one per dimension of the op's shape
  type @3 :TensorType;        # of its elements (offsets and strides count these)
}

enum TensorType {
  f32 @0;
  i64 @1;
  bool @2;     # one byte, 0 or 1
  i32 @3;      # copies and fills only (a storage type), as the three below
  f64 @4;
  f16 @5;      # IEEE binary16; also an operand of the float map functions (below)
  bf16 @6;     # bfloat16; the same
}

enum TensorFn {
  copy @0;
  fill @1;
  add @2;
  mul @3;
  div @4;
  relu @5;
  thresholdBackward @6;
  exp @7;
  log @8;
  affine @9;
  sum @10;
  matmul @11;
  logSoftmax @12;
  logSoftmaxBackward @13;
  nllLoss @14;
  nllLossBackward @15;
  sqrt @16;
  tanh @17;
  sigmoid @18;
  tanhBackward @19;
  sigmoidBackward @20;
  addcmul @21;
  addcdiv @22;
  maximum @23;
  minimum @24;
  abs @25;
  pow @26;
  layerNorm @27;
  layerNormBackward @28;
  gelu @29;
  geluBackward @30;
  silu @31;
  siluBackward @32;
  leakyRelu @33;
  leakyReluBackward @34;
  softplus @35;
  softplusBackward @36;
  hardtanh @37;
  hardtanhBackward @38;
  softmax @39;
  softmaxBackward @40;
  sign @41;
  eq @42;
  ne @43;
  lt @44;
  le @45;
  gt @46;
  ge @47;
  where @48;
  clamp @49;
  log1p @50;
  reciprocal @51;
  rsqrt @52;
  elu @53;
  eluBackward @54;
  lerp @55;
  amax @56;
  amin @57;
  argmax @58;
  argmin @59;
  indexSelect @60;
  indexAdd @61;
  uniform @62;
  bernoulli @63;
  normal @64;
  gatherSum @65;
  maxPool2d @66;
  maxPool2dBackward @67;
  hardswish @68;
  hardswishBackward @69;
  hardsigmoid @70;
  hardsigmoidBackward @71;
  mish @72;
  mishBackward @73;
  sort @74;
  floor @75;
  ceil @76;
  round @77;
  trunc @78;
  frac @79;
  sin @80;
  cos @81;
  tan @82;
  asin @83;
  acos @84;
  atan @85;
  sinh @86;
  cosh @87;
  erf @88;
  erfc @89;
  expm1 @90;
  log2 @91;
  log10 @92;
  exp2 @93;
  atan2 @94;
  hypot @95;
  copysign @96;
  fmod @97;
  lgamma @98;
  digamma @99;
  erfinv @100;
  bitwiseAnd @101;
  bitwiseOr @102;
  bitwiseXor @103;
  shiftLeft @104;
  shiftRight @105;
  polygamma @106;
  cholesky @107;
  triangularSolve @108;
  luFactor @109;
  luSolve @110;
  gcd @111;
  indexReduce @112;
  qrFactor @113;
  householderProduct @114;
  symmetricEigen @115;
  singularValues @116;
  ctcLattice @117;
}

struct Gemm {        # c[m x n] = alpha * a[m x k] * b[k x n] + beta * c
  m @0 :UInt32;
  n @1 :UInt32;
  k @2 :UInt32;
  alpha @3 :Float32;
  beta @4 :Float32;
  a @5 :UInt64;
  b @6 :UInt64;
  c @7 :UInt64;
}

struct Axpy {        # y = alpha * x + y over n elements
  n @0 :UInt64;
  alpha @1 :Float32;
  x @2 :UInt64;
  y @3 :UInt64;
}

struct Vadd {        # out = a + b over n elements
  n @0 :UInt64;
  a @1 :UInt64;
  b @2 :UInt64;
  out @3 :UInt64;
}

struct ReduceSum {   # out[0] = sum of input[0 .. n)
  n @0 :UInt64;
  input @1 :UInt64;
  out @2 :UInt64;
}

struct Reply {
  union {
    welcome @0 :Welcome;
    data @1 :DataChunk;
    fenced @2 :Void;
    error @3 :ErrorReply;
    program @4 :ProgramInfo;
    # Before a fence's answer: the device time of each kernel the card completed since
    # the last, by its own clock (OpenCL's CL_PROFILING_COMMAND_START to END).
    kernelTimes @5 :List(KernelTime);
    vaccel @6 :VaccelInfo;   # describeVaccel's answer
  }
}

struct KernelTime {
  sequence @0 :UInt32;  # the low 32 bits of the instruction's sequence
  ns @1 :UInt64;
}

# Answers describeProgram: what the card's compiler says of a program.
struct ProgramInfo {
  buildLog @0 :Text;
  kernels @1 :List(KernelInfo);
}

struct KernelInfo {
  name @0 :Text;
  attributes @1 :Text;
  args @2 :List(KernelArgInfo);
  workGroupSize @3 :UInt64;              # the largest this kernel runs with on the card
  compileWorkGroupSize @4 :List(UInt64); # reqd_work_group_size, or zeros
  localMemBytes @5 :UInt64;
  privateMemBytes @6 :UInt64;
  preferredMultiple @7 :UInt64;          # preferred work-group size multiple
}

struct KernelArgInfo {
  name @0 :Text;
  typeName @1 :Text;
  addressSpace @2 :AddressSpace;
  access @3 :Access;
  typeQualifiers @4 :UInt32;   # OpenCL's CL_KERNEL_ARG_TYPE_* bits (const 1, restrict 2, volatile 4)
  size @5 :UInt32;             # bytes of a by-value argument; 0 for pointers and __local
  enum AddressSpace {
    private @0;     # by value
    global @1;
    constant @2;
    local @3;
  }
  enum Access {
    none @0;
    readOnly @1;
    writeOnly @2;
    readWrite @3;
  }
}

struct DataChunk {
  offset @0 :UInt64;  # from the start of the read
  data @1 :Data;
  last @2 :Bool;
}

struct ErrorReply {
  sequence @0 :UInt64;      # the failed instruction
  error @1 :Frame.Error;
  dependency @2 :UInt64;    # nonzero: failed because instruction #dependency failed
}
