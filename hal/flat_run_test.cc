// FlatRun's rule, checked on the host against any order a card may run a run in: random
// sequences of small flat maps over a few buffers, overlapping every way, are gathered as
// an OpenCL device gathers them; each run is then carried out as rc_flat_run does it (a
// work-item RC_RUN_SPAN elements of every step, in step order) with the work-items'
// steps interleaved at random, and the buffers must come out equal, to the bit, to
// running the maps one after the other.
#include "hal/flat_run.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "hal/cpu/cpu_device.h"

namespace raccel::hal {
namespace {

constexpr TensorFn kFns[] = {TensorFn::copy, TensorFn::add,  TensorFn::mul,     TensorFn::div,     TensorFn::relu,
                             TensorFn::affine, TensorFn::sqrt, TensorFn::addcmul, TensorFn::addcdiv, TensorFn::lerp,
                             TensorFn::thresholdBackward};

class Host {
 public:
  explicit Host(std::map<const Buffer*, std::vector<float>> arrays) : arrays_(std::move(arrays)) {}
  float* at(const Buffer* b) { return arrays_.at(b).data(); }
  const std::map<const Buffer*, std::vector<float>>& arrays() const { return arrays_; }

  // One map over all its elements, in order: the reference.
  void runWhole(const LoweredTensorOp& op) {
    const kernels::RcGeom& g = op.geom;
    float* p[4];
    for (unsigned k = 0; k < 4; ++k) p[k] = at(op.buffers[k]);
    for (int64_t i = 0; i < g.n; ++i)
      p[0][g.offset[0] + i] = kernels::rc_map_element(&g, g.fn, p[1], p[2], p[3], g.offset[1] + i, g.offset[2] + i,
                                                      g.offset[3] + i);
  }

  // rc_flat_run's work, each work-item's steps in order, the work-items interleaved as
  // `rng` says.
  void runRun(const FlatRun& run, std::mt19937& rng) {
    const kernels::RcRun r = run.args();
    const uint64_t items = run.workItems();
    std::vector<int64_t> next(items, 0);  // each work-item's next step
    std::vector<uint64_t> live(items);
    for (uint64_t w = 0; w < items; ++w) live[w] = w;
    while (!live.empty()) {
      const size_t pick = rng() % live.size();
      const uint64_t w = live[pick];
      const kernels::RcRunStep& s = r.step[next[w]];
      float* p[4];
      for (int k = 0; k < 4; ++k) p[k] = at(run.buffers()[(s.slots >> (2 * k)) & 3]) + s.offset[k];
      kernels::RcGeom g{};
      g.alpha = s.alpha, g.beta = s.beta;
      g.pre[0] = s.pre[0], g.pre[1] = s.pre[1], g.post[0] = s.post[0], g.post[1] = s.post[1];
      const int64_t from = int64_t(w) * RC_RUN_SPAN, to = std::min<int64_t>(from + RC_RUN_SPAN, s.n);
      for (int64_t i = from; i < to; ++i) p[0][i] = kernels::rc_map_element(&g, s.fn, p[1], p[2], p[3], i, i, i);
      if (++next[w] == r.steps) live.erase(live.begin() + long(pick));
    }
  }

 private:
  std::map<const Buffer*, std::vector<float>> arrays_;
};

TEST(FlatRun, ARunGivesWhatItsMapsGiveOneAfterTheOtherInAnyOrderOfItsWorkItems) {
  auto device = makeCpuDevice(CpuDeviceOptions{.threads = 1});
  std::mt19937 rng(7);
  uint64_t joined = 0, refused = 0;
  size_t longest = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::unique_ptr<Buffer>> buffers;
    std::map<const Buffer*, std::vector<float>> arrays;
    for (int i = 0; i < 6; ++i) {
      const uint64_t n = 40 + rng() % 400;
      buffers.push_back(std::move(*device->allocate(n * 4)));
      std::vector<float> v(n);
      for (auto& x : v) x = float(int(rng() % 2001) - 1000) / 250.0f;
      arrays[buffers.back().get()] = v;
    }
    Host whole(arrays), fused(arrays);
    FlatRun run;
    auto launch = [&] {
      if (run.empty()) return;
      longest = std::max(longest, run.size());
      fused.runRun(run, rng);
      run.clear();
    };
    for (int m = 0; m < 40; ++m) {
      TensorOp op;
      op.fn = kFns[rng() % std::size(kFns)];
      op.dims = 1;
      op.alpha = float(int(rng() % 9) - 4) / 4.0f, op.beta = float(int(rng() % 5) - 2) / 2.0f;
      if (rng() % 4 == 0) op.preScale = 0.5f, op.postShift = 1;
      // Operands over few buffers and few offsets, so that they meet often: the output
      // never overlaps an input of its own map but in place (as PyTorch refuses it).
      const unsigned operands = tensorFnOperands(op.fn);
      Buffer* b[4];
      uint64_t at[4], room = UINT64_MAX;
      for (unsigned k = 0; k < operands; ++k) {
        b[k] = buffers[rng() % 3 + (k == 0 ? 0 : rng() % 3)].get();
        at[k] = rng() % 2 ? 0 : (rng() % 5) * (rng() % 2 ? 1 : 17);
        if (at[k] >= b[k]->size() / 4) at[k] = 0;
        room = std::min(room, b[k]->size() / 4 - at[k]);
      }
      op.shape[0] = 1 + rng() % std::min<uint64_t>(room, 300);
      bool selfOverlap = false;
      for (unsigned k = 1; k < operands; ++k)
        selfOverlap |= b[k] == b[0] && at[k] != at[0] && at[k] < at[0] + op.shape[0] && at[0] < at[k] + op.shape[0];
      if (selfOverlap) continue;
      for (unsigned k = 0; k < operands; ++k) op.operands[k] = {b[k], at[k], {1}, TensorType::f32};
      auto lowered = lowerTensorOp(op);
      ASSERT_TRUE(lowered) << lowered.error().message;
      ASSERT_TRUE(FlatRun::fits(*lowered)) << "fn " << int(op.fn) << " over " << op.shape[0];
      whole.runWhole(*lowered);
      if (run.join(*lowered, uint64_t(m))) {
        ++joined;
        continue;
      }
      ++refused;
      launch();
      ASSERT_TRUE(run.join(*lowered, uint64_t(m))) << "a new run takes any map that fits";
    }
    launch();
    for (auto& [buffer, expected] : whole.arrays()) {
      const std::vector<float>& got = fused.arrays().at(buffer);
      ASSERT_EQ(std::memcmp(got.data(), expected.data(), expected.size() * 4), 0) << "trial " << trial;
    }
  }
  // The sequences must have exercised both sides of the rule.
  EXPECT_GT(joined, 2000u);
  EXPECT_GT(refused, 1000u);
  EXPECT_GE(longest, 8u) << "runs of many maps";
}

TEST(FlatRun, MapsItDoesNotTakeAndEachMapsShareOfARunsTime) {
  auto device = makeCpuDevice(CpuDeviceOptions{.threads = 1});
  auto b = std::move(*device->allocate(40000 * 4));
  auto flat = [&](TensorFn fn, uint64_t n, uint64_t stride = 1, TensorType t = TensorType::f32) {
    TensorOp op;
    op.fn = fn;
    op.dims = 1;
    op.shape[0] = n;
    for (unsigned k = 0; k < tensorFnOperands(fn); ++k) op.operands[k] = {b.get(), 0, {stride}, t};
    return *lowerTensorOp(op);
  };
  EXPECT_TRUE(FlatRun::fits(flat(TensorFn::add, FlatRun::kMaxElements)));
  EXPECT_FALSE(FlatRun::fits(flat(TensorFn::add, FlatRun::kMaxElements + 1))) << "too long to gain";
  EXPECT_FALSE(FlatRun::fits(flat(TensorFn::add, 100, 2))) << "not contiguous";
  EXPECT_FALSE(FlatRun::fits(flat(TensorFn::gelu, 100))) << "GELU has a vector kernel of its own";
  EXPECT_FALSE(FlatRun::fits(flat(TensorFn::exp, 100))) << "no rc_flat_ kernel";
  EXPECT_FALSE(FlatRun::fits(flat(TensorFn::copy, 100, 1, TensorType::i64))) << "not f32";
  std::vector<KernelTime> out;
  splitRunTime({{7, 100}, {8, 300}, {9, 1}}, 1000, out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].tag, 7u);
  EXPECT_EQ(out[1].tag, 8u);
  EXPECT_EQ(out[0].ns + out[1].ns + out[2].ns, 1000u) << "the run's time, all of it";
  EXPECT_NEAR(double(out[1].ns) / out[0].ns, 3.0, 0.05);
}

}  // namespace
}  // namespace raccel::hal
