#include "hal/flat_run.h"

#include <algorithm>

namespace raccel::hal {

static_assert(sizeof(kernels::RcRun) + 4 * sizeof(uint64_t) <= 1024,
              "rc_flat_run's arguments within OpenCL's least CL_DEVICE_MAX_PARAMETER_SIZE");

bool FlatRun::fits(const LoweredTensorOp& op) {
  const kernels::RcGeom& g = op.geom;
  if (op.empty || g.dims != 1 || g.n <= 0 || uint64_t(g.n) > kMaxElements || g.fn == RC_GELU || g.fn == RC_GELU_BACKWARD)
    return false;
#define RC_FLAT_FN(name, FN) g.fn == FN ||
  if (!(RC_FAST_MAPS(RC_FLAT_FN) false)) return false;
#undef RC_FLAT_FN
  for (unsigned k = 0; k < tensorFnOperands(TensorFn(g.fn)); ++k)
    if (g.type[k] != int(TensorType::f32) || (g.stride[k][0] != 1 && g.n > 1)) return false;  // (one element: any stride)
  return true;
}

bool FlatRun::join(const LoweredTensorOp& op, uint64_t tag) {
  if (steps_.size() >= kMaxSteps) return false;
  const kernels::RcGeom& g = op.geom;
  const unsigned operands = tensorFnOperands(TensorFn(g.fn));
  const uint64_t n = uint64_t(g.n);
  std::array<Buffer*, kSlots> buffers = buffers_;
  unsigned slots = slots_;
  kernels::RcRunStep step{};
  step.n = g.n;
  step.fn = g.fn;
  step.alpha = g.alpha, step.beta = g.beta;
  step.pre[0] = g.pre[0], step.pre[1] = g.pre[1], step.post[0] = g.post[0], step.post[1] = g.post[1];
  std::array<Access, RC_MAX_OPERANDS> access{};
  for (unsigned k = 0; k < operands; ++k) {
    Buffer* b = op.buffers[k];
    unsigned slot = std::find(buffers.begin(), buffers.begin() + slots, b) - buffers.begin();
    if (slot == slots) {
      if (slots == kSlots) return false;
      buffers[slots++] = b;
    }
    const uint64_t from = uint64_t(g.offset[k]);
    access[k] = {slot, from, from + n, k == 0};
    for (const Access& a : touched_)
      if (a.slot == slot && a.from < from + n && from < a.to && (a.written || k == 0) && a.from != from) return false;
    step.offset[k] = g.offset[k];
    step.slots |= int(slot << (2 * k));
  }
  if (steps_.empty()) first_ = op;
  buffers_ = buffers, slots_ = slots;
  for (unsigned i = slots; i < kSlots; ++i) buffers_[i] = buffers_[0];
  touched_.insert(touched_.end(), access.begin(), access.begin() + operands);
  shares_.push_back({tag, n});
  steps_.push_back(step);
  widest_ = std::max(widest_, n);
  return true;
}

kernels::RcRun FlatRun::args() const {
  kernels::RcRun r{};
  r.steps = int64_t(steps_.size());
  std::copy(steps_.begin(), steps_.end(), r.step);
  return r;
}

void FlatRun::clear() {
  steps_.clear();
  touched_.clear();
  shares_.clear();
  buffers_ = {};
  slots_ = 0;
  widest_ = 0;
}

void splitRunTime(const std::vector<std::pair<uint64_t, uint64_t>>& shares, uint64_t ns, std::vector<KernelTime>& out) {
  uint64_t elements = 0;
  for (auto& s : shares) elements += s.second;  // each at most kMaxElements, at most kMaxSteps of them
  uint64_t given = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    const uint64_t part = i + 1 == shares.size() || elements == 0
                              ? ns - given
                              : static_cast<uint64_t>(static_cast<long double>(ns) * shares[i].second / elements);
    out.push_back({shares[i].first, part});
    given += part;
  }
}

}  // namespace raccel::hal
