#include "hal/slicing.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "common/limits.h"

namespace raccel::hal {
namespace {

// Work per element of the op's shape (a pick walks none of the rows it picks from).
double flopsPerElement(const TensorOp& op) {
  switch (op.fn) {
    case TensorFn::indexSelect:
    case TensorFn::gatherSum: return 1.0 / double(std::max<uint64_t>(op.shape[op.dims - 1], 1));
    case TensorFn::matmul: return 2;
    case TensorFn::logSoftmax:
    case TensorFn::logSoftmaxBackward:
    case TensorFn::softmax:
    case TensorFn::softmaxBackward:
    case TensorFn::layerNorm:
    case TensorFn::layerNormBackward: return 4;
    case TensorFn::maxPool2dBackward: {  // a plane's outputs and inputs, over oh x ow x h x w elements
      const double oh = double(op.shape[op.dims - 4]) * double(op.shape[op.dims - 3]);
      const double in = double(op.shape[op.dims - 2]) * double(op.shape[op.dims - 1]);
      return (oh + in) / std::max(oh * in, 1.0);
    }
    case TensorFn::cholesky: return double(op.shape[op.dims - 1]) / 3;  // n^3 / 3 over n^2 elements
    case TensorFn::luFactor: return 2 * double(op.shape[op.dims - 1]) / 3;
    case TensorFn::qrFactor:  // 2 m n^2 over m n elements
    case TensorFn::householderProduct: return 2 * double(op.shape[op.dims - 1]);
    case TensorFn::symmetricEigen: return 24 * double(op.shape[op.dims - 1]);  // ~8 sweeps of 3 n^3
    case TensorFn::singularValues: return 32 * double(op.shape[op.dims - 1]);  // ~8 sweeps of 4 m n^2
    case TensorFn::ctcLattice: return 3 / std::max(1.0, double(op.shape[3]));  // T x S' steps over T x S' x C elements
    case TensorFn::luSolve: return 2;  // both substitutions
    default: return 1;
  }
}

// The last dimension a slice may cut: the ones after it are always whole (a kernel's
// work-item walks them, or indexes them from 0).
int lastCuttable(const TensorOp& op) {
  switch (op.fn) {
    case TensorFn::nllLoss: return -1;  // one work-item: never cut
    case TensorFn::ctcLattice: return 0;  // the sequences: each walks its lattice whole
    case TensorFn::maxPool2d:  // the planes only: an index counts from its plane's first element
    case TensorFn::maxPool2dBackward: return int(op.dims) - 5;
    case TensorFn::logSoftmax:
    case TensorFn::logSoftmaxBackward:
    case TensorFn::softmax:
    case TensorFn::softmaxBackward:
    case TensorFn::layerNorm:
    case TensorFn::layerNormBackward:
    case TensorFn::nllLossBackward: return 0;  // rows only
    case TensorFn::indexSelect: return int(op.dims) - 2;  // not the rows picked from
    case TensorFn::sort: return int(op.dims) - 2;  // the kept dimensions: a row is sorted whole
    case TensorFn::cholesky:
    case TensorFn::luFactor:
    case TensorFn::qrFactor:
    case TensorFn::householderProduct:
    case TensorFn::symmetricEigen:
    case TensorFn::singularValues: return int(op.dims) - 3;  // the batch: a matrix is factored whole
    case TensorFn::triangularSolve:
    case TensorFn::luSolve: return int(op.dims) - 3;  // the batch and the columns of b
    case TensorFn::indexAdd:
    case TensorFn::indexReduce: return int(op.dims) - 3;  // the columns: every slice holds every row
    case TensorFn::gatherSum: return int(op.dims) - 3;  // not the picks, nor the rows picked from
    case TensorFn::amax:
    case TensorFn::amin:
    case TensorFn::argmax:
    case TensorFn::argmin:  // the kept dimensions only (they come first)
      return int(op.dims) - std::popcount(op.reduceMask) - 1;
    default: return int(op.dims) - 1;
  }
}

bool reduced(const TensorOp& op, unsigned d) {
  if (op.fn == TensorFn::matmul) return d == op.dims - 1;
  if (op.reduceMask) return op.reduceMask >> d & 1;  // the reductions
  return false;
}

// The box of the shape one slice covers: dimensions before `split` take one index at a
// time, `split` a run of `chunk`, the rest whole. Walked in row-major order.
class TensorSlices final : public SlicedWork {
 public:
  TensorSlices(const TensorOp& op, double sliceFlops) : whole_(op), sliceFlops_(sliceFlops) {
    const double budget = std::max(1.0, std::floor(sliceFlops / flopsPerElement(op)));
    const int last = lastCuttable(op);
    if (last < 0) {  // one slice: the whole op
      split_ = 0, chunk_ = op.shape[0];
    } else {
      double inner = 1;  // elements of one index of `split_`
      for (unsigned d = unsigned(last) + 1; d < op.dims; ++d) inner *= double(op.shape[d]);
      split_ = unsigned(last);
      while (split_ > 0 && inner * double(op.shape[split_]) <= budget) inner *= double(op.shape[split_--]);
      chunk_ = uint64_t(std::clamp(std::floor(budget / inner), 1.0, double(op.shape[split_])));
    }
    total_ = (op.shape[split_] + chunk_ - 1) / chunk_;
    for (unsigned d = 0; d < split_; ++d) total_ = limits::satMul(total_, op.shape[d]);
    for (unsigned d = 0; d < op.dims; ++d)
      if (reduced(op, d) && op.shape[d] > 1 && (d < split_ || (d == split_ && chunk_ < op.shape[d]))) accumulate_ = true;
    if (accumulate_ && whole_.beta != 1) {  // beta 1 keeps the output as it is
      prepass_ = scaleOutput();
      total_ = limits::satAdd(total_, prepass_->total());
    }
  }

  uint64_t total() const override { return total_; }

  Result<bool> runNext(Device& device) override {
    ++done_;
    if (prepass_) {
      auto r = prepass_->runNext(device);
      if (!r) return r;
      if (*r) prepass_.reset();
      return false;
    }
    TensorOp s = whole_;
    const unsigned operands = tensorFnOperands(s.fn);
    for (unsigned d = 0; d <= split_; ++d) {
      s.shape[d] = d < split_ ? 1 : std::min(chunk_, whole_.shape[d] - at_[d]);
      for (unsigned i = 0; i < operands; ++i)
        s.operands[i].offset = limits::satAdd(s.operands[i].offset, limits::satMul(at_[d], whole_.operands[i].strides[d]));
    }
    if (accumulate_) s.beta = 1;
    if (auto st = device.tensor(s); !st) return std::unexpected(st.error());
    return advance();
  }

 private:
  bool advance() {
    at_[split_] += chunk_;
    for (int d = int(split_); d >= 0; --d) {
      if (at_[d] < whole_.shape[d]) return false;
      at_[d] = 0;
      if (d > 0) ++at_[d - 1];
    }
    return true;  // carried out of dimension 0: every box is done
  }

  // out = beta * out (0 when beta is 0: out is not read) over the output's own elements.
  std::unique_ptr<SlicedWork> scaleOutput() const {
    TensorOp scale;
    scale.dims = whole_.dims;
    scale.shape = whole_.shape;
    for (unsigned d = 0; d < whole_.dims; ++d)
      if (reduced(whole_, d)) scale.shape[d] = 1;
    scale.operands[0] = whole_.operands[0];
    if (whole_.beta == 0) {
      scale.fn = TensorFn::fill;
      scale.alpha = 0;
    } else {
      scale.fn = TensorFn::affine;
      scale.operands[1] = whole_.operands[0];
      scale.alpha = whole_.beta, scale.beta = 0;
    }
    return std::make_unique<TensorSlices>(scale, sliceFlops_);
  }

  TensorOp whole_;
  double sliceFlops_;
  unsigned split_ = 0;
  uint64_t chunk_ = 1;
  uint64_t total_ = 1;
  std::array<uint64_t, kMaxTensorDims> at_{};
  bool accumulate_ = false;
  std::unique_ptr<SlicedWork> prepass_;
};

TensorOp contiguous(TensorFn fn, uint64_t n, Buffer* out, Buffer* a, Buffer* b, float alpha) {
  TensorOp op;
  op.fn = fn;
  op.dims = 1;
  op.shape[0] = n;
  op.alpha = alpha;
  Buffer* buffers[3] = {out, a, b};
  for (unsigned i = 0; i < 3; ++i) {
    op.operands[i].buffer = buffers[i];
    op.operands[i].strides[0] = buffers[i] ? 1 : 0;
  }
  return op;
}

// Bytes in pieces; `run` does one piece at (offset from the start, length).
template <class Run>
class ByteSlices final : public SlicedWork {
 public:
  ByteSlices(uint64_t length, uint64_t piece, bool backwards, Run run)
      : length_(length), piece_(std::max<uint64_t>(piece, 1)), backwards_(backwards), run_(std::move(run)) {}
  uint64_t total() const override { return (length_ + piece_ - 1) / piece_; }
  Result<bool> runNext(Device& device) override {
    const uint64_t n = std::min(piece_, length_ - at_);
    const uint64_t start = backwards_ ? length_ - at_ - n : at_;
    ++done_;
    if (auto s = run_(device, start, n); !s) return std::unexpected(s.error());
    at_ += n;
    return at_ >= length_;
  }

 private:
  uint64_t length_, piece_, at_ = 0;
  bool backwards_;
  Run run_;
};

template <class Run>
std::unique_ptr<SlicedWork> bytes(uint64_t length, uint64_t piece, bool backwards, Run run) {
  if (length <= piece) return nullptr;
  return std::make_unique<ByteSlices<Run>>(length, piece, backwards, std::move(run));
}

}  // namespace

double tensorWork(const LoweredTensorOp& op) { return op.flops; }
double builtinWork(const BuiltinOp& op) {
  if (op.fn == BuiltinOp::Fn::gemm) return 2.0 * double(op.gemm.m) * double(op.gemm.n) * double(op.gemm.k);
  return double(op.n);
}

std::unique_ptr<SlicedWork> sliceTensor(const TensorOp& op, double sliceFlops) {
  return std::make_unique<TensorSlices>(op, sliceFlops);
}

std::unique_ptr<SlicedWork> sliceBuiltin(const BuiltinOp& b, double sliceFlops) {
  if (builtinWork(b) <= sliceFlops) return nullptr;
  TensorOp op;
  switch (b.fn) {
    case BuiltinOp::Fn::gemm: {
      // c[m, n] = alpha a[m, k] b[k, n] + beta c, row-major, as a matmul over [m, n, k].
      const GemmArgs& g = b.gemm;
      op.fn = TensorFn::matmul;
      op.dims = 3;
      op.shape = {g.m, g.n, g.k, 1, 1, 1};
      op.alpha = g.alpha, op.beta = g.beta;
      op.operands[0] = {g.c, 0, {g.n, 1, 0}};
      op.operands[1] = {const_cast<Buffer*>(g.a), 0, {g.k, 0, 1}};
      op.operands[2] = {const_cast<Buffer*>(g.b), 0, {0, 1, g.n}};
      break;
    }
    case BuiltinOp::Fn::axpy: op = contiguous(TensorFn::add, b.n, b.y, b.y, b.x, b.alpha); break;  // y = y + alpha x
    case BuiltinOp::Fn::vadd: op = contiguous(TensorFn::add, b.n, b.out, b.x, b.y, 1); break;
    case BuiltinOp::Fn::reduceSum:
      op = contiguous(TensorFn::sum, b.n, b.out, b.x, nullptr, 1);
      op.operands[0].strides[0] = 0;
      op.reduceMask = 1;
      break;
  }
  return sliceTensor(op, sliceFlops);
}

std::unique_ptr<SlicedWork> sliceFill(Buffer& buffer, uint64_t offset, uint64_t length, uint8_t value,
                                      uint64_t sliceBytes) {
  return bytes(length, sliceBytes, false, [&buffer, offset, value](Device& d, uint64_t at, uint64_t n) {
    return d.fill(buffer, offset + at, n, value);
  });
}

std::unique_ptr<SlicedWork> sliceCopy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset,
                                      uint64_t length, uint64_t sliceBytes) {
  // memmove's meaning: a destination after an overlapping source is written from the end.
  const bool backwards = &dst == &src && dstOffset > srcOffset && dstOffset < srcOffset + length;
  return bytes(length, sliceBytes, backwards, [&dst, dstOffset, &src, srcOffset](Device& d, uint64_t at, uint64_t n) {
    return d.copy(dst, dstOffset + at, src, srcOffset + at, n);
  });
}

}  // namespace raccel::hal
