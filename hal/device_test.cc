// Behaviour every backend must show: the conformance suite, parameterized over the
// backends each test binary names (hal/conformance.h).
#include "hal/device.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <numeric>
#include <functional>
#include <random>

#include "hal/conformance.h"
#include "hal/slicing.h"

namespace raccel::hal {
namespace {

// got[m x n] is alpha * a[m x k] b[k x n] + beta * c, within 1e-4.
void expectGemm(const std::vector<float>& got, const std::vector<float>& a, const std::vector<float>& b,
                const std::vector<float>& c, size_t m, size_t n, size_t k, double alpha, double beta) {
  for (size_t i = 0; i < m; ++i)
    for (size_t j = 0; j < n; ++j) {
      double ref = beta * c[i * n + j];
      for (size_t p = 0; p < k; ++p) ref += alpha * a[i * k + p] * b[p * n + j];
      ASSERT_NEAR(got[i * n + j], ref, 1e-4) << i << "," << j;
    }
}

class Conformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    auto made = GetParam().make();
    ASSERT_TRUE(made) << made.error().message;
    device = std::move(*made);
  }
  bool hasBuiltins() const {
    auto& kinds = device->capabilities().programKinds;
    return std::find(kinds.begin(), kinds.end(), ProgramKind::builtin) != kinds.end();
  }
  std::unique_ptr<Buffer> bytes(uint64_t n) {
    auto b = device->allocate(n);
    EXPECT_TRUE(b);
    return b ? std::move(*b) : nullptr;
  }
  std::unique_ptr<Buffer> floats(const std::vector<float>& v) {
    auto b = device->allocate(v.size() * 4);
    EXPECT_TRUE(b);
    EXPECT_TRUE(device->write(**b, 0, std::as_bytes(std::span(v))));
    return std::move(*b);
  }
  std::vector<float> readFloats(const Buffer& b, size_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(device->read(b, 0, std::as_writable_bytes(std::span(out))));
    return out;
  }
  void mapsOverPermutedAndBroadcastViews(uint64_t D);
  void layerNormAndItsBackward(size_t k);
  void layerNormOverChannels(size_t hw);
  std::unique_ptr<Device> device;
};

TEST_P(Conformance, BuffersRoundTripAndRefuseOutOfRange) {
  auto b = device->allocate(100);
  ASSERT_TRUE(b);
  std::vector<std::byte> data(100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i);
  ASSERT_TRUE(device->write(**b, 0, data));
  ASSERT_TRUE(device->fill(**b, 10, 5, 0xAB));
  std::vector<std::byte> out(100);
  ASSERT_TRUE(device->read(**b, 0, out));
  EXPECT_EQ(out[9], std::byte(9));
  EXPECT_EQ(out[10], std::byte(0xAB));
  EXPECT_EQ(out[15], std::byte(15));
  auto past = device->read(**b, 90, std::span(out).first(20));
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code, Code::invalidArgument);
  EXPECT_NE(past.error().message.find("past the end"), std::string::npos);
  EXPECT_FALSE(device->copy(**b, 0, **b, 95, 10));
}

TEST_P(Conformance, NewBuffersAreZeroNotAnEarlierTenantsData) {
  for (int round = 0; round < 3; ++round) {
    auto b = device->allocate(1 << 20);
    ASSERT_TRUE(b);
    std::vector<std::byte> out(1 << 20, std::byte{1});
    ASSERT_TRUE(device->read(**b, 0, out));
    for (size_t i = 0; i < out.size(); i += 4093) ASSERT_EQ(out[i], std::byte{0}) << "round " << round << " byte " << i;
    ASSERT_TRUE(device->fill(**b, 0, 1 << 20, 0xEE));  // what the next allocation must not see
    device->release(std::move(*b));
  }
}

TEST_P(Conformance, AllocationRespectsCardMemory) {
  EXPECT_EQ(device->allocate(0).error().code, Code::invalidArgument);
  auto huge = device->allocate(device->capabilities().memoryBytes + 1);
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().code, Code::resourceExhausted);
  auto a = device->allocate(device->capabilities().memoryBytes);
  ASSERT_TRUE(a);
  EXPECT_FALSE(device->allocate(1));
  device->release(std::move(*a));
  EXPECT_TRUE(device->allocate(1));
}

TEST_P(Conformance, GemmMatchesReference) {
  if (!hasBuiltins()) GTEST_SKIP() << "this card runs no built-in ops";
  const uint32_t m = 37, n = 29, k = 53;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  for (auto& x : c) x = dist(rng);
  auto ba = floats(a), bb = floats(b), bc = floats(c);
  ASSERT_TRUE(device->gemm({m, n, k, 1.5f, 0.5f, ba.get(), bb.get(), bc.get()}));
  expectGemm(readFloats(*bc, m * n), a, b, c, m, n, k, 1.5, 0.5);
}

TEST_P(Conformance, VectorOpsMatchReference) {
  if (!hasBuiltins()) GTEST_SKIP() << "this card runs no built-in ops";
  const size_t n = 200001;
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 100) * 0.25f;
    y[i] = 1.0f;
  }
  auto bx = floats(x), by = floats(y);
  auto out = device->allocate(n * 4);
  ASSERT_TRUE(out);
  ASSERT_TRUE(device->vadd(n, *bx, *by, **out));
  ASSERT_TRUE(device->axpy(n, 2.0f, *bx, *by));
  auto sum = device->allocate(4);
  ASSERT_TRUE(device->reduceSum(n, *bx, **sum));
  auto v = readFloats(**out, n);
  auto w = readFloats(*by, n);
  double ref = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(v[i], x[i] + 1.0f);
    ASSERT_EQ(w[i], 2.0f * x[i] + 1.0f);
    ref += x[i];
  }
  EXPECT_NEAR(readFloats(**sum, 1)[0], ref, ref * 1e-6);
  EXPECT_FALSE(device->vadd(n + 1, *bx, *by, **out));
}

// ---- Tensor ops (hal/tensor.h): every function against a plain C++ reference, over
// strided, transposed and broadcast views, and the checks that keep a kernel inside its
// buffers.
namespace {
TensorOperand view(Buffer* b, uint64_t offset, const std::vector<uint64_t>& strides, TensorType type = TensorType::f32) {
  TensorOperand o;
  o.buffer = b;
  o.offset = offset;
  o.type = type;
  size_t d = 0;
  for (auto s : strides) o.strides[d++] = s;
  return o;
}
TensorOp tensorOp(TensorFn fn, const std::vector<uint64_t>& shape, std::initializer_list<TensorOperand> operands) {
  TensorOp op;
  op.fn = fn;
  op.dims = static_cast<unsigned>(shape.size());
  size_t d = 0;
  for (auto s : shape) op.shape[d++] = s;
  d = 0;
  for (auto& o : operands) op.operands[d++] = o;
  return op;
}
std::vector<float> randomFloats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
}  // namespace

// Every map function, out[i, j] = f(a[j, i] (a read transposed), b[j] (broadcast over i),
// c[i] (broadcast over j)) for a 7 x 5 a; and over rows long enough for a CPU device's
// vector kernels (rc_rows_, two blocks and a tail): out [2, 3, 37] = f(a [2, 3, 37] (apart: 9
// elements between a[0] and a[1]), b[k] (one row for all), c[e, i] (one element a row)).
TEST_P(Conformance, TensorElementwiseOpsOverStridedAndBroadcastViewsMatchReference) {
  struct Case {
    TensorFn fn;
    float alpha, beta;
    std::function<float(float, float, float)> ref;
  };
  std::vector<Case> cases = {
      {TensorFn::copy, 1, 0, [](float x, float, float) { return x; }},
      {TensorFn::fill, 2.5f, 0, [](float, float, float) { return 2.5f; }},
      {TensorFn::add, -0.5f, 0, [](float x, float y, float) { return x - 0.5f * y; }},
      {TensorFn::mul, 3, 0, [](float x, float y, float) { return 3 * x * y; }},
      {TensorFn::div, 1, 0, [](float x, float y, float) { return x / y; }},
      {TensorFn::relu, 1, 0, [](float x, float, float) { return x < 0 ? 0.0f : x; }},
      {TensorFn::thresholdBackward, 0.25f, 0, [](float x, float y, float) { return y <= 0.25f ? 0.0f : x; }},
      {TensorFn::exp, 1, 0, [](float x, float, float) { return std::exp(x); }},
      {TensorFn::log, 1, 0, [](float x, float, float) { return std::log(std::fabs(x)); }},
      {TensorFn::affine, 2, 1, [](float x, float, float) { return 2 * x + 1; }},
      {TensorFn::sqrt, 1, 0, [](float x, float, float) { return std::sqrt(std::fabs(x)); }},
      {TensorFn::tanh, 1, 0, [](float x, float, float) { return std::tanh(x); }},
      {TensorFn::sigmoid, 1, 0, [](float x, float, float) { return 1 / (1 + std::exp(-x)); }},
      {TensorFn::tanhBackward, 1, 0, [](float x, float y, float) { return x * (1 - y * y); }},
      {TensorFn::sigmoidBackward, 1, 0, [](float x, float y, float) { return x * y * (1 - y); }},
      {TensorFn::addcmul, -0.5f, 0, [](float x, float y, float z) { return x - 0.5f * y * z; }},
      {TensorFn::addcdiv, 2, 0, [](float x, float y, float z) { return x + 2 * y / z; }},
      {TensorFn::maximum, 1, 0, [](float x, float y, float) { return std::max(x, y); }},
      {TensorFn::minimum, 1, 0, [](float x, float y, float) { return std::min(x, y); }},
      {TensorFn::abs, 1, 0, [](float x, float, float) { return std::fabs(x); }},
      {TensorFn::sign, 1, 0, [](float x, float, float) { return float(x > 0) - float(x < 0); }},
      {TensorFn::pow, 3, 0, [](float x, float, float) { return x * x * x; }},
      {TensorFn::gelu, 0, 0, [](float x, float, float) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {TensorFn::gelu, 1, 0,
       [](float x, float, float) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }},
      {TensorFn::geluBackward, 0, 0,
       [](float g, float x, float) { return g * (0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI)); }},
      {TensorFn::silu, 1, 0, [](float x, float, float) { return x / (1 + std::exp(-x)); }},
      {TensorFn::siluBackward, 1, 0,
       [](float g, float x, float) {
         double s = 1 / (1 + std::exp(-x));
         return g * s * (1 + x * (1 - s));
       }},
      {TensorFn::leakyRelu, 0.1f, 0, [](float x, float, float) { return x > 0 ? x : 0.1f * x; }},
      {TensorFn::leakyReluBackward, 0.1f, 0, [](float g, float x, float) { return x > 0 ? g : 0.1f * g; }},
      {TensorFn::softplus, 2, 1.5f, [](float x, float, float) { return 2 * x > 1.5 ? x : std::log1p(std::exp(2.0 * x)) / 2; }},
      {TensorFn::softplusBackward, 2, 1.5f,
       [](float g, float x, float) { return 2 * x > 1.5 ? g : g * std::exp(2.0 * x) / (std::exp(2.0 * x) + 1); }},
      {TensorFn::hardtanh, -0.5f, 0.75f, [](float x, float, float) { return std::clamp(x, -0.5f, 0.75f); }},
      {TensorFn::hardtanhBackward, -0.5f, 0.75f, [](float g, float x, float) { return x <= -0.5f || x >= 0.75f ? 0.0f : g; }},
      {TensorFn::clamp, -0.5f, 0.75f, [](float x, float, float) { return std::clamp(x, -0.5f, 0.75f); }},
      {TensorFn::log1p, 1, 0, [](float x, float, float) { return std::log1p(x); }},
      {TensorFn::reciprocal, 1, 0, [](float x, float, float) { return 1 / x; }},
      {TensorFn::rsqrt, 1, 0, [](float x, float, float) { return 1 / std::sqrt(x); }},
      {TensorFn::elu, 0.7f, 1, [](float x, float, float) { return x > 0 ? x : 0.7 * std::expm1(double(x)); }},
      {TensorFn::eluBackward, 0.7f, 1, [](float g, float x, float) { return x > 0 ? g : g * 0.7 * std::exp(double(x)); }},
      {TensorFn::elu, 0.5f, 2, [](float x, float, float) { return x > 0 ? x : 0.5 * std::expm1(2.0 * x); }},
      {TensorFn::eluBackward, 0.5f, 2, [](float g, float x, float) { return x > 0 ? g : g * std::exp(2.0 * x); }},
      {TensorFn::lerp, 0.3f, 0, [](float x, float y, float) { return x + 0.3f * (y - x); }},
      {TensorFn::lerp, 0.8f, 0, [](float x, float y, float) { return y - (y - x) * (1 - 0.8f); }},
      {TensorFn::pow, 0.5f, 0, [](float x, float, float) { return std::sqrt(x); }},
      {TensorFn::pow, -2, 0, [](float x, float, float) { return 1 / (x * x); }},
      {TensorFn::pow, 1.7f, 0, [](float x, float, float) { return std::pow(x, 1.7f); }},
      {TensorFn::hardswish, 1, 0, [](float x, float, float) { return x * std::clamp(x + 3, 0.0f, 6.0f) / 6; }},
      {TensorFn::hardswishBackward, 1, 0, [](float g, float x, float) { return x < -3 ? 0 : x <= 3 ? g * (x / 3 + 0.5f) : g; }},
      {TensorFn::hardsigmoid, 1, 0, [](float x, float, float) { return std::clamp(x + 3, 0.0f, 6.0f) / 6; }},
      {TensorFn::hardsigmoidBackward, 1, 0, [](float g, float x, float) { return x > -3 && x < 3 ? g / 6 : 0; }},
      {TensorFn::mish, 1, 0, [](float x, float, float) { return x * std::tanh(std::log1p(std::exp(double(x)))); }},
      {TensorFn::mishBackward, 1, 0,
       [](float g, float x, float) {
         double s = 1 / (1 + std::exp(-double(x))), t = std::tanh(std::log1p(std::exp(double(x))));
         return g * (t + x * s * (1 - t * t));
       }},
  };
  // One layout: the op's shape, out contiguous, a, b and c's strides, how many elements
  // each holds, and which of them element e of out reads (aAt, bAt, cAt).
  struct Layout {
    std::vector<uint64_t> shape, outStrides, aStrides, bStrides, cStrides;
    size_t aSize, bSize, cSize;
    std::function<size_t(size_t)> aAt, bAt, cAt;
  };
  const std::vector<Layout> layouts = {
      {{5, 7}, {7, 1}, {1, 5}, {0, 1}, {1, 0}, 35, 7, 5,  // a is stored 7 x 5 ([j][i]): read with strides (1, 5)
       [](size_t e) { return e % 7 * 5 + e / 7; }, [](size_t e) { return e % 7; }, [](size_t e) { return e / 7; }},
      {{2, 3, 37}, {111, 37, 1}, {120, 37, 1}, {0, 0, 1}, {3, 1, 0}, 231, 37, 6,  // a's two blocks 9 elements apart
       [](size_t e) { return e / 111 * 120 + e % 111; }, [](size_t e) { return e % 37; }, [](size_t e) { return e / 37; }},
  };
  for (auto& l : layouts) {
    const size_t n = std::accumulate(l.shape.begin(), l.shape.end(), size_t{1}, std::multiplies<>());
    auto a = randomFloats(l.aSize, 3), b = randomFloats(l.bSize, 4), third = randomFloats(l.cSize, 5);
    for (auto& z : third) z = std::fabs(z) + 0.5f;  // a divisor
    auto ba = floats(a), bb = floats(b), bc = floats(third);
    auto out = device->allocate(n * 4);
    ASSERT_TRUE(out);
    for (auto& c : cases) {
      std::vector<float> input = a;
      if (c.fn == TensorFn::log || c.fn == TensorFn::sqrt || c.fn == TensorFn::log1p || c.fn == TensorFn::rsqrt ||
          (c.fn == TensorFn::pow && c.alpha != std::floor(c.alpha)))  // (a fractional power of a negative is NaN)
        for (auto& x : input) x = std::fabs(x);
      ASSERT_TRUE(device->write(*ba, 0, std::as_bytes(std::span(input))));
      auto op = tensorOp(c.fn, l.shape,
                         {view(out->get(), 0, l.outStrides), view(ba.get(), 0, l.aStrides), view(bb.get(), 0, l.bStrides),
                          view(bc.get(), 0, l.cStrides)});
      op.alpha = c.alpha, op.beta = c.beta;
      auto s = device->tensor(op);
      if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
      ASSERT_TRUE(s) << tensorFnName(c.fn) << ": " << s.error().message;
      auto got = readFloats(**out, n);
      for (size_t e = 0; e < n; ++e) {
        float want = c.ref(input[l.aAt(e)], b[l.bAt(e)], third[l.cAt(e)]);
        ASSERT_NEAR(got[e], want, 1e-5 * std::max(1.0f, std::fabs(want))) << tensorFnName(c.fn) << " " << n << " elements, " << e;
      }
    }
  }
}

// Where PyTorch's CPU kernels define an edge their own way, the card gives their value:
// sign of NaN and of -0 is +0; a power of 0.5 is a square root (NaN for -inf, -0 for -0,
// where pow() gives inf and +0); lerp by a weight of 0.5 or more works back from the end
// (inf toward 1 by 0.5 is inf, not inf - inf); hardswish's slope at -3 is -1/2 and at 3 is
// 3/2, hardsigmoid's is 0 at both, hardsigmoid keeps a NaN; mish of -inf is NaN. A
// backward case is the derivative at each x (a gradient of 1). Zeros, infinities and
// NaNs exactly; finite values to a part in 10^6 (the math library's last bits).
TEST_P(Conformance, MapsAtTheEdgesGivePyTorchsValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {nan, -0.0f, -inf, inf, 2.0f, -3.0f, 3.0f}, ones(x.size(), 1.0f);
  const uint64_t n = x.size();
  auto bx = floats(x), bones = floats(ones);
  auto out = device->allocate(n * 4);
  ASSERT_TRUE(out);
  struct Case {
    TensorFn fn;
    float alpha;
    std::vector<float> want;
    bool derivative = false;  // operands (1, x): the gradient, then the input
  };
  const float sixth = 1.0f / 6.0f;
  const std::vector<Case> cases = {
      {TensorFn::sign, 1, {0, 0, -1, 1, 1, -1, 1}},
      {TensorFn::pow, 0.5f, {nan, -0.0f, nan, inf, std::sqrt(2.0f), nan, std::sqrt(3.0f)}},
      {TensorFn::pow, 3, {nan, -0.0f, -inf, inf, 8, -27, 27}},
      {TensorFn::lerp, 0.5f, {nan, 0.5f, -inf, inf, 1.5f, -1, 2}},
      {TensorFn::hardswish, 1, {nan, -0.0f, nan, inf, 10.0f / 6.0f, -0.0f, 3}},
      {TensorFn::hardswishBackward, 1, {1, 0.5f, 0, 1, 2.0f / 3.0f + 0.5f, -0.5f, 1.5f}, true},
      {TensorFn::hardsigmoid, 1, {nan, 0.5f, 0, 1, 5.0f / 6.0f, 0, 1}},
      {TensorFn::hardsigmoidBackward, 1, {0, sixth, 0, 0, sixth, 0, 0}, true},
      {TensorFn::mish, 1, {nan, -0.0f, nan, inf, 1.943958998f, -0.1456474662f, 2.986535072f}},
      {TensorFn::mishBackward, 1, {nan, 0.6f, nan, nan, 1.069317937f, -0.09339312464f, 1.021106958f}, true},
  };
  for (auto& c : cases) {
    Buffer* a = c.derivative ? bones.get() : bx.get();
    Buffer* b = c.derivative ? bx.get() : bones.get();
    auto op = tensorOp(c.fn, {n}, {view(out->get(), 0, {1}), view(a, 0, {1}), view(b, 0, {1})});
    op.alpha = c.alpha;
    auto s = device->tensor(op);
    if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
    ASSERT_TRUE(s) << s.error().message;
    auto got = readFloats(**out, n);
    for (size_t i = 0; i < n; ++i) {
      const std::string what = std::string(tensorFnName(c.fn)) + " " + std::to_string(c.alpha) + " at " + std::to_string(x[i]);
      if (std::isnan(c.want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << what << ": " << got[i];
        continue;
      }
      if (c.want[i] == 0 || std::isinf(c.want[i])) EXPECT_EQ(got[i], c.want[i]) << what;
      else EXPECT_NEAR(got[i], c.want[i], 1e-6 * std::fabs(c.want[i])) << what;
      EXPECT_EQ(std::signbit(got[i]), std::signbit(c.want[i])) << what;
    }
  }
}

// C's math of one input and of two, as the C library computes it in f32 (the backends' own
// libraries: within 4e-6 relative where it is not exact; rounding, zeros, infinities
// and NaN exactly, the sign of zero included).
TEST_P(Conformance, MathOfOneAndTwoInputsGivesTheCLibrarysValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {nan, -0.0f, -inf, inf, 2.5f, -1.5f, 0.5f, 0.3f, -2.5f, 1e-10f};
  const uint64_t n = x.size();
  auto bx = floats(x);
  auto out = device->allocate(n * 4);
  ASSERT_TRUE(out);
  using F = float (*)(float);
  const std::vector<std::pair<TensorFn, F>> cases = {
      {TensorFn::floor, [](float v) { return std::floor(v); }}, {TensorFn::ceil, [](float v) { return std::ceil(v); }},
      {TensorFn::round, [](float v) { return std::nearbyint(v); }}, {TensorFn::trunc, [](float v) { return std::trunc(v); }},
      {TensorFn::frac, [](float v) { return v - std::trunc(v); }}, {TensorFn::sin, [](float v) { return std::sin(v); }},
      {TensorFn::cos, [](float v) { return std::cos(v); }}, {TensorFn::tan, [](float v) { return std::tan(v); }},
      {TensorFn::asin, [](float v) { return std::asin(v); }}, {TensorFn::acos, [](float v) { return std::acos(v); }},
      {TensorFn::atan, [](float v) { return std::atan(v); }}, {TensorFn::sinh, [](float v) { return std::sinh(v); }},
      {TensorFn::cosh, [](float v) { return std::cosh(v); }}, {TensorFn::erf, [](float v) { return std::erf(v); }},
      {TensorFn::erfc, [](float v) { return std::erfc(v); }}, {TensorFn::expm1, [](float v) { return std::expm1(v); }},
      {TensorFn::log2, [](float v) { return std::log2(v); }}, {TensorFn::log10, [](float v) { return std::log10(v); }},
      {TensorFn::exp2, [](float v) { return std::exp2(v); }},
  };
  auto expectLibrarys = [](float got, float want, const std::string& what) {
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
      return;
    }
    if (want == 0 || std::isinf(want) || want == std::trunc(want)) EXPECT_EQ(got, want) << what;
    else EXPECT_NEAR(got, want, 4e-6 * std::fabs(want)) << what;
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << what;
  };
  for (auto& [fn, reference] : cases) {
    auto s = device->tensor(tensorOp(fn, {n}, {view(out->get(), 0, {1}), view(bx.get(), 0, {1})}));
    if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
    ASSERT_TRUE(s) << s.error().message;
    auto got = readFloats(**out, n);
    for (size_t i = 0; i < n; ++i)
      expectLibrarys(got[i], reference(x[i]), std::string(tensorFnName(fn)) + " at " + std::to_string(x[i]));
  }
  // Of two inputs: each x against a y of other signs, zeros, infinities and NaN.
  const std::vector<float> y = {1.0f, 2.0f, -0.0f, -3.0f, -0.75f, inf, -inf, 0.0f, nan, 0.2f};
  auto by = floats(y);
  using G = float (*)(float, float);
  const std::vector<std::pair<TensorFn, G>> binary = {
      {TensorFn::atan2, [](float a, float b) { return std::atan2(a, b); }},
      {TensorFn::hypot, [](float a, float b) { return std::hypot(a, b); }},
      {TensorFn::copysign, [](float a, float b) { return std::copysign(a, b); }},
      {TensorFn::fmod, [](float a, float b) { return std::fmod(a, b); }},
  };
  for (auto& [fn, reference] : binary) {
    auto s = device->tensor(tensorOp(fn, {n}, {view(out->get(), 0, {1}), view(bx.get(), 0, {1}), view(by.get(), 0, {1})}));
    ASSERT_TRUE(s) << s.error().message;
    auto got = readFloats(**out, n);
    for (size_t i = 0; i < n; ++i)
      expectLibrarys(got[i], reference(x[i], y[i]),
                     std::string(tensorFnName(fn)) + " of " + std::to_string(x[i]) + ", " + std::to_string(y[i]));
  }
}

// lgamma, digamma and erfinv at known values (to 10 digits, from closed forms and A&S
// tables), their poles, edges and NaN; erfinv(x) also against erf's inverse, erf(y) = x.
TEST_P(Conformance, GammaFunctionsAndErfsInverseGiveTheirKnownValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    TensorFn fn;
    float x, want;
  };
  const std::vector<Case> cases = {
      {TensorFn::lgamma, 1.0f, 0.0f}, {TensorFn::lgamma, 2.0f, 0.0f}, {TensorFn::lgamma, 0.5f, 0.5723649429f},
      {TensorFn::lgamma, 10.0f, 12.8018274801f}, {TensorFn::lgamma, -0.5f, 1.2655121235f}, {TensorFn::lgamma, 0.0f, inf},
      {TensorFn::lgamma, -2.0f, inf}, {TensorFn::lgamma, nan, nan}, {TensorFn::lgamma, 100.0f, 359.1342053696f},
      {TensorFn::digamma, 1.0f, -0.5772156649f}, {TensorFn::digamma, 0.5f, -1.9635100260f},
      {TensorFn::digamma, 2.5f, 0.7031566406f}, {TensorFn::digamma, 0.3f, -3.5025242222f},
      {TensorFn::digamma, 100.0f, 4.6001618527f}, {TensorFn::digamma, -0.5f, 0.0364899740f},
      {TensorFn::digamma, -2.25f, 4.1585835646f}, {TensorFn::digamma, 1e-10f, -1e10f}, {TensorFn::digamma, 0.0f, -inf},
      {TensorFn::digamma, -0.0f, inf}, {TensorFn::digamma, -3.0f, nan}, {TensorFn::digamma, -inf, nan},
      {TensorFn::digamma, inf, inf}, {TensorFn::digamma, nan, nan},
      {TensorFn::erfinv, 0.5f, 0.4769362762f}, {TensorFn::erfinv, -0.9f, -1.1630871537f},
      {TensorFn::erfinv, 0.999f, 2.3267537655f}, {TensorFn::erfinv, 0.1f, 0.0888559905f}, {TensorFn::erfinv, 1.0f, inf},
      {TensorFn::erfinv, -1.0f, -inf}, {TensorFn::erfinv, 1.5f, nan}, {TensorFn::erfinv, -0.0f, -0.0f},
      {TensorFn::erfinv, nan, nan}};
  auto out = device->allocate(4);
  ASSERT_TRUE(out);
  for (const auto& c : cases) {
    auto in = floats({c.x});
    auto s = device->tensor(tensorOp(c.fn, {1}, {view(out->get(), 0, {1}), view(in.get(), 0, {1})}));
    if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
    ASSERT_TRUE(s) << s.error().message;
    const float got = readFloats(**out, 1)[0];
    const std::string what = std::string(tensorFnName(c.fn)) + " of " + std::to_string(c.x);
    if (std::isnan(c.want)) {
      EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
    } else if (std::isinf(c.want) || c.want == 0) {
      EXPECT_EQ(got, c.want) << what;
      EXPECT_EQ(std::signbit(got), std::signbit(c.want)) << what;
    } else {
      EXPECT_NEAR(got, c.want, 2e-6 * std::max(1.0f, std::fabs(c.want))) << what;
    }
  }
  std::vector<float> xs;
  for (float v = -0.995f; v < 1.0f; v += 0.005f) xs.push_back(v);
  auto bx = floats(xs);
  auto ys = device->allocate(xs.size() * 4);
  ASSERT_TRUE(ys);
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::erfinv, {xs.size()}, {view(ys->get(), 0, {1}), view(bx.get(), 0, {1})})));
  const auto y = readFloats(**ys, xs.size());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(std::erf(double(y[i])), xs[i], 2e-7) << "erf(erfinv(" << xs[i] << "))";
}

// sort: each row of a [rows, n] view (read transposed from an [n, rows] buffer) in
// order, stable, a NaN above every number, as std::stable_sort with that rule gives; f32
// both ways over ties, NaNs and infinities, i64, rows of one and of 1000 (ten rounds of
// merges, the last uneven); every operand apart, and the types, refused otherwise.
TEST_P(Conformance, TensorSortIsStableAndPutsNaNAboveEveryNumber) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto buffer = [&](uint64_t bytes) {
    auto b = device->allocate(std::max<uint64_t>(bytes, 8));
    EXPECT_TRUE(b);
    return std::move(*b);
  };
  auto readInts = [&](const Buffer& b, size_t n) {
    std::vector<int64_t> v(n);
    EXPECT_TRUE(device->read(b, 0, std::as_writable_bytes(std::span(v))));
    return v;
  };
  for (const uint64_t n : {7u, 1u, 1000u}) {
    const uint64_t rows = 3, total = rows * n;
    auto x = randomFloats(total, 43);
    for (auto& v : x) v = std::round(v * 2) / 2;  // ties
    std::vector<int64_t> xi(total);  // (of the finite values, before the NaNs and infinities go in)
    for (size_t i = 0; i < total; ++i) xi[i] = int64_t(x[i] * 4) * 1000000007LL;  // past 2^24, exactly
    if (n == 7) x[2] = nan, x[5] = -inf, x[9] = inf, x[10] = nan, x[11] = nan, x[20] = -0.0f;
    for (const bool integers : {false, true})
      for (const bool descending : {false, true}) {
        auto stored = integers ? device->allocate(total * 8) : device->allocate(total * 4);  // [n, rows]: a is read transposed
        ASSERT_TRUE(stored);
        std::vector<float> tf(total);
        std::vector<int64_t> ti(total);
        for (uint64_t r = 0; r < rows; ++r)
          for (uint64_t i = 0; i < n; ++i) tf[i * rows + r] = x[r * n + i], ti[i * rows + r] = xi[r * n + i];
        ASSERT_TRUE(integers ? device->write(**stored, 0, std::as_bytes(std::span(ti))) : device->write(**stored, 0, std::as_bytes(std::span(tf))));
        const TensorType type = integers ? TensorType::i64 : TensorType::f32;
        auto out = buffer(total * 8), index = buffer(total * 8), scratch = buffer(total * 8);
        auto op = tensorOp(TensorFn::sort, {rows, n},
                           {view(out.get(), 0, {n, 1}, type), view(stored->get(), 0, {1, rows}, type),
                            view(index.get(), 0, {n, 1}, TensorType::i64), view(scratch.get(), 0, {n, 1}, TensorType::i64)});
        op.alpha = descending ? 1 : 0;
        auto s = device->tensor(op);
        if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
        ASSERT_TRUE(s) << s.error().message;
        auto gi = readInts(*index, total);
        auto gv = integers ? readInts(*out, total) : std::vector<int64_t>{};
        auto gf = integers ? std::vector<float>{} : readFloats(*out, total);
        for (uint64_t r = 0; r < rows; ++r) {
          std::vector<int64_t> want(n);
          std::iota(want.begin(), want.end(), 0);
          auto before = [&](int64_t p, int64_t q) {
            if (integers) return descending ? xi[r * n + p] > xi[r * n + q] : xi[r * n + p] < xi[r * n + q];
            const float a = x[r * n + p], b = x[r * n + q];
            if (descending) return std::isnan(a) ? !std::isnan(b) : a > b;
            return std::isnan(b) ? !std::isnan(a) : a < b;
          };
          std::stable_sort(want.begin(), want.end(), before);
          for (uint64_t k = 0; k < n; ++k) {
            const std::string what = std::string(integers ? "i64 " : "f32 ") + (descending ? "descending" : "ascending") +
                                     ", n " + std::to_string(n) + ", row " + std::to_string(r) + ", " + std::to_string(k);
            ASSERT_EQ(gi[r * n + k], want[k]) << what;
            if (integers) ASSERT_EQ(gv[r * n + k], xi[r * n + want[k]]) << what;
            else if (std::isnan(x[r * n + want[k]])) ASSERT_TRUE(std::isnan(gf[r * n + k])) << what;
            else ASSERT_EQ(gf[r * n + k], x[r * n + want[k]]) << what;
          }
        }
      }
  }
  // Refused: the index over the values, the scratch over the input, a bool sort, an f32 index.
  auto a = floats(std::vector<float>(16, 1)), out = buffer(64), index = buffer(64), scratch = buffer(64);  // (a: room for 8 i64)
  auto sortOf = [&](TensorOperand o, TensorOperand x, TensorOperand i, TensorOperand t) {
    return device->tensor(tensorOp(TensorFn::sort, {8}, {o, x, i, t}));
  };
  const TensorType i64 = TensorType::i64;
  auto s = sortOf(view(out.get(), 0, {1}), view(a.get(), 0, {1}), view(out.get(), 0, {1}, i64), view(scratch.get(), 0, {1}, i64));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("overlaps"), std::string::npos) << s.error().message;
  s = sortOf(view(out.get(), 0, {1}), view(a.get(), 0, {1}), view(index.get(), 0, {1}, i64), view(a.get(), 0, {1}, i64));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("overlaps"), std::string::npos) << s.error().message;
  s = sortOf(view(out.get(), 0, {1}, TensorType::boolean), view(a.get(), 0, {1}, TensorType::boolean),
             view(index.get(), 0, {1}, i64), view(scratch.get(), 0, {1}, i64));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("f32 or i64"), std::string::npos) << s.error().message;
  s = sortOf(view(out.get(), 0, {1}), view(a.get(), 0, {1}), view(index.get(), 0, {1}), view(scratch.get(), 0, {1}, i64));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("the index is i64"), std::string::npos) << s.error().message;
}

// A batched matmul: a [B, m, k], b given as [B, n, k] (so b[k, n] = bt[n, k]), out [B, m,
// n] = 0.5 a b + out.
TensorOp batchedMatmul(uint64_t B, uint64_t m, uint64_t n, uint64_t k, Buffer* out, Buffer* a, Buffer* bt) {
  auto o = tensorOp(TensorFn::matmul, {B, m, n, k},
                    {view(out, 0, {m * n, n, 1, 0}), view(a, 0, {m * k, k, 0, 1}), view(bt, 0, {n * k, 0, k, 1})});
  o.alpha = 0.5f, o.beta = 1;
  return o;
}
// What the card gave for batchedMatmul against a reference summed in double.
void expectBatchedMatmul(const std::vector<float>& got, const std::vector<float>& a, const std::vector<float>& bt,
                         const std::vector<float>& c, uint64_t B, uint64_t m, uint64_t n, uint64_t k) {
  for (uint64_t e = 0; e < B; ++e)
    for (uint64_t i = 0; i < m; ++i)
      for (uint64_t j = 0; j < n; ++j) {
        double want = 0;
        for (uint64_t q = 0; q < k; ++q) want += double(a[(e * m + i) * k + q]) * bt[(e * n + j) * k + q];
        want = 0.5 * want + c[(e * m + i) * n + j];
        EXPECT_NEAR(got[(e * m + i) * n + j], want, 1e-4 * std::max(1.0, std::fabs(want))) << e << "," << i << "," << j;
      }
}

// A batched matmul ([batch, m, n, k]) is one matmul per entry: b read transposed, the
// output accumulated (beta 1) with alpha 0.5; sliced, the same.
TEST_P(Conformance, ABatchedMatmulIsOneMatmulPerEntry) {
  const uint64_t B = 3, m = 4, n = 5, k = 6;
  auto a = randomFloats(B * m * k, 31), bt = randomFloats(B * n * k, 32), c = randomFloats(B * m * n, 33);
  auto ba = floats(a), bb = floats(bt), whole = floats(c), sliced = floats(c);
  auto op = [&](Buffer* out) { return batchedMatmul(B, m, n, k, out, ba.get(), bb.get()); };
  auto s = device->tensor(op(whole.get()));
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  auto got = readFloats(*whole, B * m * n);
  expectBatchedMatmul(got, a, bt, c, B, m, n, k);
  auto slices = sliceTensor(op(sliced.get()), 20);  // cut within entries, rows and k
  for (;;) {
    auto r = slices->runNext(*device);
    ASSERT_TRUE(r) << r.error().message;
    if (*r) break;
  }
  auto cut = readFloats(*sliced, B * m * n);
  for (size_t i = 0; i < cut.size(); ++i) EXPECT_NEAR(cut[i], got[i], 1e-4) << i;
  // b laid out [B, k, n] (a BLAS's layout: the CPU card runs each entry as a gemm).
  std::vector<float> bkn(B * k * n);
  for (uint64_t e = 0; e < B; ++e)
    for (uint64_t q = 0; q < k; ++q)
      for (uint64_t j = 0; j < n; ++j) bkn[(e * k + q) * n + j] = bt[(e * n + j) * k + q];
  auto bb2 = floats(bkn), gemmed = floats(c);
  auto rowMajor = tensorOp(TensorFn::matmul, {B, m, n, k}, {view(gemmed.get(), 0, {m * n, n, 1, 0}),
                                                            view(ba.get(), 0, {m * k, k, 0, 1}), view(bb2.get(), 0, {k * n, 0, 1, n})});
  rowMajor.alpha = 0.5f, rowMajor.beta = 1;
  ASSERT_TRUE(device->tensor(rowMajor));
  auto viaGemm = readFloats(*gemmed, B * m * n);
  for (size_t i = 0; i < viaGemm.size(); ++i) EXPECT_NEAR(viaGemm[i], got[i], 1e-4) << i;
  // Three dimensions or four, nothing else.
  auto five = tensorOp(TensorFn::matmul, {1, B, m, n, k}, {view(whole.get(), 0, {0, m * n, n, 1, 0}),
                                                           view(ba.get(), 0, {0, m * k, k, 0, 1}), view(bb.get(), 0, {0, n * k, 0, k, 1})});
  auto refused = device->tensor(five);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("4 with a batch first"), std::string::npos) << refused.error().message;
}

// Large enough for an OpenCL card's tiled matmul (64 and more each way), with rows,
// columns and k that fill neither its tiles nor the four running sums of either kernel.
TEST_P(Conformance, AMatmulPastTheTiledSizeWithRaggedEdgesMatchesReference) {
  const uint64_t B = 2, m = 70, n = 67, k = 83;
  auto a = randomFloats(B * m * k, 41), bt = randomFloats(B * n * k, 42), c = randomFloats(B * m * n, 43);
  auto ba = floats(a), bb = floats(bt), out = floats(c);
  auto s = device->tensor(batchedMatmul(B, m, n, k, out.get(), ba.get(), bb.get()));
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  expectBatchedMatmul(readFloats(*out, B * m * n), a, bt, c, B, m, n, k);
}

// out [B, m, n] with neighbouring columns (what an OpenCL CPU card runs as column vectors,
// rc_matmul_vec), b laid out [B, k, n] (neighbouring columns too) or [B, n, k] (its
// columns apart: laid out as rows first, rc_matmul_b_rows_vec, under the four running
// sums' 256 k, and read as it is over them, rc_matmul_nt), rows and columns that fill
// neither the blocks of 4 rows nor of 16 or 4 columns, k under and over 256 (and not a
// multiple of 4): the reference's results; on OpenCL, bit for bit the results of the same
// matmul written into a transposed output (rc_matmul: the kernels sum each output in one
// order). The CPU card runs some of these as a gemm, in another order.
TEST_P(Conformance, AMatmulIntoNeighbouringColumnsMatchesReferenceAndTheTransposedOutput) {
  const uint64_t B = 2, m = 10, n = 37;
  for (uint64_t k : {37, 301})
    for (bool bColumnsApart : {false, true}) {
      SCOPED_TRACE("k " + std::to_string(k) + (bColumnsApart ? ", b [B, n, k]" : ", b [B, k, n]"));
      auto a = randomFloats(B * m * k, 61), bt = randomFloats(B * n * k, 62), c = randomFloats(B * m * n, 63);
      std::vector<float> bkn(B * k * n), ct(B * m * n);
      for (uint64_t e = 0; e < B; ++e) {
        for (uint64_t q = 0; q < k; ++q)
          for (uint64_t j = 0; j < n; ++j) bkn[(e * k + q) * n + j] = bt[(e * n + j) * k + q];
        for (uint64_t i = 0; i < m; ++i)
          for (uint64_t j = 0; j < n; ++j) ct[(e * n + j) * m + i] = c[(e * m + i) * n + j];
      }
      auto ba = floats(a), bb = floats(bColumnsApart ? bt : bkn), rows = floats(c), columns = floats(ct);
      auto op = [&](Buffer* out, bool transposed) {
        auto o = tensorOp(TensorFn::matmul, {B, m, n, k},
                          {transposed ? view(out, 0, {m * n, 1, m, 0}) : view(out, 0, {m * n, n, 1, 0}),
                           view(ba.get(), 0, {m * k, k, 0, 1}),
                           bColumnsApart ? view(bb.get(), 0, {n * k, 0, k, 1}) : view(bb.get(), 0, {k * n, 0, 1, n})});
        o.alpha = 0.5f, o.beta = 1;
        return o;
      };
      auto s = device->tensor(op(rows.get(), false));
      if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
      ASSERT_TRUE(s) << s.error().message;
      auto got = readFloats(*rows, B * m * n);
      expectBatchedMatmul(got, a, bt, c, B, m, n, k);
      ASSERT_TRUE(device->tensor(op(columns.get(), true)));
      auto transposed = readFloats(*columns, B * m * n);
      std::vector<float> same(transposed.size());
      for (uint64_t e = 0; e < B; ++e)
        for (uint64_t i = 0; i < m; ++i)
          for (uint64_t j = 0; j < n; ++j) same[(e * m + i) * n + j] = transposed[(e * n + j) * m + i];
      expectBatchedMatmul(same, a, bt, c, B, m, n, k);
      if (GetParam().name.rfind("opencl", 0) != 0) continue;
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], same[i]) << "element " << i;
    }
}

// Maps over permuted and broadcast views in 2, 3 and 4 dimensions (an attention's head
// permutes, a batch norm's scale, max pooling's backward), on [B, H, T, D] and its last
// dimensions: a read permuted from [B, T, H, D], b broadcast along all but its last
// dimension and H. out = a + 0.5 b over f32; then typed: equal = (ia == ib) over i64
// into bool, chosen = where(equal, a, 3) and converted = ia as f32, each element checked.
// D is 7, then 37 and 300 (rows a CPU device's rc_rows_ kernels take, a work-item a
// span of 256 elements in blocks of 16: two blocks and a tail; two spans, the second 44).
TEST_P(Conformance, MapsOverPermutedAndBroadcastViewsMatchReference) {
  for (const uint64_t D : {7, 37, 300}) {
    mapsOverPermutedAndBroadcastViews(D);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}
void Conformance::mapsOverPermutedAndBroadcastViews(uint64_t D) {
  const uint64_t B = 3, T = 5, H = 4, all = B * H * T * D;
  const std::vector<uint64_t> full = {B, H, T, D};
  const std::vector<uint64_t> dense = {H * T * D, T * D, D, 1}, permuted = {T * H * D, D, H * D, 1}, broadcast = {0, D, 0, 1},
                              scalar = {0, 0, 0, 0};
  auto a = randomFloats(all, 51), b = randomFloats(H * D, 52);
  std::vector<int64_t> ia(all), ib(H * D);
  for (uint64_t i = 0; i < all; ++i) ia[i] = int64_t(i * 7 % 3);
  for (uint64_t i = 0; i < H * D; ++i) ib[i] = int64_t(i % 3);
  auto ba = floats(a), bb = floats(b), three = floats({3.0f});
  auto bytes = [&](std::span<const std::byte> v) {
    auto buffer = device->allocate(v.size());
    EXPECT_TRUE(buffer && device->write(**buffer, 0, v));
    return std::move(*buffer);
  };
  auto bia = bytes(std::as_bytes(std::span(ia))), bib = bytes(std::as_bytes(std::span(ib)));
  for (uint64_t dims : {2, 3, 4}) {
    // An op over the last `dims` of [B, H, T, D] (the leading ones at 0).
    auto op = [&](TensorFn fn, std::vector<std::pair<TensorOperand, std::vector<uint64_t>>> operands) {
      TensorOp o;
      o.fn = fn;
      o.dims = static_cast<unsigned>(dims);
      for (unsigned d = 0; d < dims; ++d) o.shape[d] = full[4 - dims + d];
      for (size_t k = 0; k < operands.size(); ++k) {
        o.operands[k] = operands[k].first;
        for (unsigned d = 0; d < dims; ++d) o.operands[k].strides[d] = operands[k].second[4 - dims + d];
      }
      return o;
    };
    auto operand = [](Buffer* buffer, TensorType type = TensorType::f32) {
      TensorOperand o;
      o.buffer = buffer;
      o.type = type;
      return o;
    };
    auto out = floats(std::vector<float>(all, -1.0f)), chosen = floats(std::vector<float>(all, -1.0f)),
         converted = floats(std::vector<float>(all, -1.0f));
    const std::vector<uint8_t> sevens(all, 7);
    auto equal = bytes(std::as_bytes(std::span(sevens)));
    auto sum = op(TensorFn::add, {{operand(out.get()), dense}, {operand(ba.get()), permuted}, {operand(bb.get()), broadcast}});
    sum.alpha = 0.5f;
    auto s = device->tensor(sum);
    if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
    ASSERT_TRUE(s) << s.error().message;
    ASSERT_TRUE(device->tensor(op(TensorFn::eq, {{operand(equal.get(), TensorType::boolean), dense},
                                                 {operand(bia.get(), TensorType::i64), permuted},
                                                 {operand(bib.get(), TensorType::i64), broadcast}})));
    ASSERT_TRUE(device->tensor(op(TensorFn::where, {{operand(chosen.get()), dense},
                                                    {operand(equal.get(), TensorType::boolean), dense},
                                                    {operand(ba.get()), permuted}, {operand(three.get()), scalar}})));
    ASSERT_TRUE(device->tensor(op(TensorFn::copy, {{operand(converted.get()), dense}, {operand(bia.get(), TensorType::i64), permuted}})));
    auto got = readFloats(*out, all), picked = readFloats(*chosen, all), asFloats = readFloats(*converted, all);
    std::vector<uint8_t> same(all);
    ASSERT_TRUE(device->read(*equal, 0, std::as_writable_bytes(std::span(same))));
    const uint64_t n = std::accumulate(full.end() - dims, full.end(), uint64_t{1}, std::multiplies<>());
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t rest = i, at[4] = {0, 0, 0, 0};
      for (int d = 3; d >= int(4 - dims); --d) at[d] = rest % full[d], rest /= full[d];
      auto offset = [&](const std::vector<uint64_t>& st) { return at[0] * st[0] + at[1] * st[1] + at[2] * st[2] + at[3] * st[3]; };
      const uint64_t o = offset(dense), pa = offset(permuted), pb = offset(broadcast);
      ASSERT_NEAR(got[o], a[pa] + 0.5f * b[pb], 1e-6) << dims << " dimensions, element " << i;
      ASSERT_EQ(same[o], ia[pa] == ib[pb] ? 1 : 0) << dims << " dimensions, element " << i;
      ASSERT_EQ(picked[o], ia[pa] == ib[pb] ? a[pa] : 3.0f) << dims << " dimensions, element " << i;
      ASSERT_EQ(asFloats[o], float(ia[pa])) << dims << " dimensions, element " << i;
    }
  }
}

TEST_P(Conformance, TensorReductionsMatmulSoftmaxAndLossMatchReference) {
  const size_t m = 9, n = 6, k = 11;
  auto a = randomFloats(m * k, 5), b = randomFloats(k * n, 6), c = randomFloats(m * n, 7);
  auto ba = floats(a), bb = floats(b), bc = floats(c);
  // matmul with b read transposed from a copy stored n x k, and out = 0.5 a b + 2 c.
  std::vector<float> bt(n * k);
  for (size_t p = 0; p < k; ++p)
    for (size_t j = 0; j < n; ++j) bt[j * k + p] = b[p * n + j];
  auto bbt = floats(bt);
  auto mm = tensorOp(TensorFn::matmul, {m, n, k}, {view(bc.get(), 0, {n, 1, 0}), view(ba.get(), 0, {k, 0, 1}), view(bbt.get(), 0, {0, k, 1})});
  mm.alpha = 0.5f, mm.beta = 2;
  auto s = device->tensor(mm);
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  expectGemm(readFloats(*bc, m * n), a, b, c, m, n, k, 0.5, 2.0);

  // sum over dimension 0 of a (m x k) into k outputs, and over everything into one.
  auto cols = device->allocate(k * 4), all = device->allocate(4);
  ASSERT_TRUE(cols && all);
  auto sum0 = tensorOp(TensorFn::sum, {m, k}, {view(cols->get(), 0, {0, 1}), view(ba.get(), 0, {k, 1})});
  sum0.reduceMask = 1;
  ASSERT_TRUE(device->tensor(sum0));
  auto sumAll = tensorOp(TensorFn::sum, {m, k}, {view(all->get(), 0, {0, 0}), view(ba.get(), 0, {k, 1})});
  sumAll.reduceMask = 3, sumAll.alpha = 0.5f;
  ASSERT_TRUE(device->tensor(sumAll));
  auto colSums = readFloats(**cols, k);
  double total = 0;
  for (size_t p = 0; p < k; ++p) {
    double ref = 0;
    for (size_t i = 0; i < m; ++i) ref += a[i * k + p];
    EXPECT_NEAR(colSums[p], ref, 1e-4);
    total += ref;
  }
  EXPECT_NEAR(readFloats(**all, 1)[0], 0.5 * total, 1e-4);

  // log_softmax over rows of a, its backward, nll loss (one target ignored) and its backward.
  auto ls = device->allocate(m * k * 4), grad = device->allocate(m * k * 4);
  ASSERT_TRUE(ls && grad);
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::logSoftmax, {m, k}, {view(ls->get(), 0, {k, 1}), view(ba.get(), 0, {k, 1})})));
  auto y = readFloats(**ls, m * k);
  std::vector<double> lse(m);
  for (size_t i = 0; i < m; ++i) {
    double top = -1e30, sum = 0;
    for (size_t p = 0; p < k; ++p) top = std::max<double>(top, a[i * k + p]);
    for (size_t p = 0; p < k; ++p) sum += std::exp(a[i * k + p] - top);
    lse[i] = top + std::log(sum);
    for (size_t p = 0; p < k; ++p) ASSERT_NEAR(y[i * k + p], a[i * k + p] - lse[i], 1e-5);
  }
  std::vector<int64_t> target(m);
  for (size_t i = 0; i < m; ++i) target[i] = static_cast<int64_t>((i * 5) % k);
  target[3] = -100;  // ignored
  auto bt64 = device->allocate(m * 8);
  ASSERT_TRUE(bt64);
  ASSERT_TRUE(device->write(**bt64, 0, std::as_bytes(std::span(target))));
  auto loss = device->allocate(4), weight = device->allocate(4);
  ASSERT_TRUE(loss && weight);
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::nllLoss, {m, k}, {view(loss->get(), 0, {0, 0}), view(ls->get(), 0, {k, 1}),
                                                                   view(bt64->get(), 0, {1, 0}, TensorType::i64), view(weight->get(), 0, {0, 0})})));
  double refLoss = 0;
  for (size_t i = 0; i < m; ++i)
    if (target[i] != -100) refLoss -= y[i * k + target[i]];
  EXPECT_NEAR(readFloats(**loss, 1)[0], refLoss / (m - 1), 1e-5);
  EXPECT_EQ(readFloats(**weight, 1)[0], float(m - 1));
  auto one = floats({2.0f});
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::nllLossBackward, {m, k}, {view(grad->get(), 0, {k, 1}), view(one.get(), 0, {0, 0}),
                                                                           view(bt64->get(), 0, {1, 0}, TensorType::i64), view(weight->get(), 0, {0, 0})})));
  auto g = readFloats(**grad, m * k);
  for (size_t i = 0; i < m; ++i)
    for (size_t p = 0; p < k; ++p)
      ASSERT_FLOAT_EQ(g[i * k + p], target[i] == int64_t(p) ? -2.0f / (m - 1) : 0.0f) << i << "," << p;
  // log_softmax backward: grad - exp(y) * rowsum(grad), in place over the gradient.
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::logSoftmaxBackward, {m, k},
                                      {view(grad->get(), 0, {k, 1}), view(grad->get(), 0, {k, 1}), view(ls->get(), 0, {k, 1})})));
  auto back = readFloats(**grad, m * k);
  for (size_t i = 0; i < m; ++i) {
    double rowsum = 0;
    for (size_t p = 0; p < k; ++p) rowsum += g[i * k + p];
    for (size_t p = 0; p < k; ++p) ASSERT_NEAR(back[i * k + p], g[i * k + p] - std::exp(y[i * k + p]) * rowsum, 1e-5);
  }
  // softmax over the rows of a, and its backward from the nll gradient.
  auto sm = device->allocate(m * k * 4), smBack = device->allocate(m * k * 4);
  ASSERT_TRUE(sm && smBack);
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::softmax, {m, k}, {view(sm->get(), 0, {k, 1}), view(ba.get(), 0, {k, 1})})));
  auto probs = readFloats(**sm, m * k);
  for (size_t i = 0; i < m; ++i)
    for (size_t q = 0; q < k; ++q) ASSERT_NEAR(probs[i * k + q], std::exp(a[i * k + q] - lse[i]), 1e-6) << i << "," << q;
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::softmaxBackward, {m, k},
                                      {view(smBack->get(), 0, {k, 1}), view(grad->get(), 0, {k, 1}), view(sm->get(), 0, {k, 1})})));
  auto smGrad = readFloats(**smBack, m * k);
  for (size_t i = 0; i < m; ++i) {
    double dot = 0;
    for (size_t q = 0; q < k; ++q) dot += back[i * k + q] * probs[i * k + q];
    for (size_t q = 0; q < k; ++q) ASSERT_NEAR(smGrad[i * k + q], probs[i * k + q] * (back[i * k + q] - dot), 1e-5) << i << "," << q;
  }
  // A target outside the classes makes the loss NaN, and nothing is read out of bounds.
  target[0] = 1000;
  ASSERT_TRUE(device->write(**bt64, 0, std::as_bytes(std::span(target))));
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::nllLoss, {m, k}, {view(loss->get(), 0, {0, 0}), view(ls->get(), 0, {k, 1}),
                                                                   view(bt64->get(), 0, {1, 0}, TensorType::i64), view(weight->get(), 0, {0, 0})})));
  EXPECT_TRUE(std::isnan(readFloats(**loss, 1)[0]));
}

// layerNorm over the rows of a (its mean and rstd written one per row, rstd at a stride
// of 2), then its backward from a gradient, against references in double. Rows of 13,
// then 37 (an OpenCL CPU card's vector kernels: two blocks of 16 and a tail).
TEST_P(Conformance, TensorLayerNormAndItsBackwardMatchReference) {
  for (const size_t k : {13, 37}) {
    SCOPED_TRACE("rows of " + std::to_string(k));
    layerNormAndItsBackward(k);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}
void Conformance::layerNormAndItsBackward(size_t k) {
  const size_t m = 6;
  const float eps = 1e-5f;
  auto a = randomFloats(m * k, 8), grad = randomFloats(m * k, 9);
  auto ba = floats(a), bg = floats(grad);
  auto out = device->allocate(m * k * 4), mean = device->allocate(m * 4), rstd = device->allocate(2 * m * 4),
       back = device->allocate(m * k * 4);
  ASSERT_TRUE(out && mean && rstd && back);
  auto ln = tensorOp(TensorFn::layerNorm, {m, k}, {view(out->get(), 0, {k, 1}), view(ba.get(), 0, {k, 1}),
                                                    view(mean->get(), 0, {1, 0}), view(rstd->get(), 1, {2, 0})});
  ln.alpha = eps;  // added to the variance
  auto s = device->tensor(ln);
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  auto y = readFloats(**out, m * k), mu = readFloats(**mean, m), r = readFloats(**rstd, 2 * m);
  std::vector<double> xhat(m * k), refR(m);
  for (size_t i = 0; i < m; ++i) {
    double sum = 0, squares = 0;
    for (size_t p = 0; p < k; ++p) sum += a[i * k + p];
    const double refMu = sum / k;
    for (size_t p = 0; p < k; ++p) squares += (a[i * k + p] - refMu) * (a[i * k + p] - refMu);
    refR[i] = 1 / std::sqrt(squares / k + eps);
    EXPECT_NEAR(mu[i], refMu, 1e-5) << i;
    EXPECT_NEAR(r[2 * i + 1], refR[i], 1e-4 * refR[i]) << i;
    for (size_t p = 0; p < k; ++p) {
      xhat[i * k + p] = (a[i * k + p] - refMu) * refR[i];
      ASSERT_NEAR(y[i * k + p], xhat[i * k + p], 1e-4) << i << "," << p;
    }
  }
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::layerNormBackward, {m, k},
                                      {view(back->get(), 0, {k, 1}), view(bg.get(), 0, {k, 1}), view(out->get(), 0, {k, 1}),
                                       view(rstd->get(), 1, {2, 0})})));
  auto dx = readFloats(**back, m * k);
  for (size_t i = 0; i < m; ++i) {
    double mg = 0, mgx = 0;
    for (size_t p = 0; p < k; ++p) mg += grad[i * k + p], mgx += grad[i * k + p] * xhat[i * k + p];
    mg /= k, mgx /= k;
    for (size_t p = 0; p < k; ++p)
      ASSERT_NEAR(dx[i * k + p], refR[i] * (grad[i * k + p] - mg - xhat[i * k + p] * mgx), 1e-4 * std::max(1.0, refR[i]))
          << i << "," << p;
  }
  // The per-row operands must be one element per row.
  auto bad = device->tensor(tensorOp(TensorFn::layerNorm, {m, k}, {view(out->get(), 0, {k, 1}), view(ba.get(), 0, {k, 1}),
                                                                    view(back->get(), 0, {0, 1}), view(rstd->get(), 0, {1, 0})}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("the mean is one element per row"), std::string::npos) << bad.error().message;
}

// Batch norm's statistics: layerNorm over [channels, batch, positions], each channel's
// row a strided block of an [N, C, HW] tensor; and its backward over the same rows.
// Positions 13, then 37 (as above).
TEST_P(Conformance, TensorLayerNormOverChannelsOfABatchIsBatchNorm) {
  for (const size_t hw : {13, 37}) {
    SCOPED_TRACE(std::to_string(hw) + " positions");
    layerNormOverChannels(hw);
    if (HasFatalFailure() || IsSkipped()) return;
  }
}
void Conformance::layerNormOverChannels(size_t hw) {
  const size_t n = 3, c = 2, count = n * hw;
  const float eps = 1e-5f;
  auto x = randomFloats(n * c * hw, 18), grad = randomFloats(n * c * hw, 19);
  auto bx = floats(x), bg = floats(grad), out = floats(std::vector<float>(x.size())), back = floats(std::vector<float>(x.size()));
  auto mean = device->allocate(c * 4), rstd = device->allocate(c * 4);
  ASSERT_TRUE(mean && rstd);
  auto rows = [&](Buffer* b) { return view(b, 0, {hw, c * hw, 1}); };
  auto bn = tensorOp(TensorFn::layerNorm, {c, n, hw}, {rows(out.get()), rows(bx.get()), view(mean->get(), 0, {1, 0, 0}),
                                                        view(rstd->get(), 0, {1, 0, 0})});
  bn.alpha = eps;
  auto s = device->tensor(bn);
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::layerNormBackward, {c, n, hw},
                                      {rows(back.get()), rows(bg.get()), rows(out.get()), view(rstd->get(), 0, {1, 0, 0})})));
  auto y = readFloats(*out, x.size()), dx = readFloats(*back, x.size()), mu = readFloats(**mean, c), r = readFloats(**rstd, c);
  auto at = [&](size_t ch, size_t e) { return (e / hw) * c * hw + ch * hw + e % hw; };
  for (size_t ch = 0; ch < c; ++ch) {
    double sum = 0, squares = 0, mg = 0, mgx = 0;
    for (size_t e = 0; e < count; ++e) sum += x[at(ch, e)];
    const double refMu = sum / count;
    for (size_t e = 0; e < count; ++e) squares += (x[at(ch, e)] - refMu) * (x[at(ch, e)] - refMu);
    const double refR = 1 / std::sqrt(squares / count + eps);
    EXPECT_NEAR(mu[ch], refMu, 1e-5) << ch;
    EXPECT_NEAR(r[ch], refR, 1e-4 * refR) << ch;
    for (size_t e = 0; e < count; ++e) {
      const double xhat = (x[at(ch, e)] - refMu) * refR;
      ASSERT_NEAR(y[at(ch, e)], xhat, 1e-4) << ch << "," << e;
      mg += grad[at(ch, e)] / count, mgx += grad[at(ch, e)] * xhat / count;
    }
    for (size_t e = 0; e < count; ++e) {
      const double xhat = (x[at(ch, e)] - refMu) * refR;
      ASSERT_NEAR(dx[at(ch, e)], refR * (grad[at(ch, e)] - mg - xhat * mgx), 1e-4 * std::max(1.0, refR)) << ch << "," << e;
    }
  }
  auto wide = device->allocate(64 * 4);
  ASSERT_TRUE(wide);
  auto bad = bn;
  bad.operands[3] = view(wide->get(), 0, {1, 1, 0});
  auto refused = device->tensor(bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("rstd is one element per row"), std::string::npos) << refused.error().message;
}

// Two elementwise steps fused into one op: operand a scaled and shifted as it is read,
// the result as it is written (Adam's exp_avg.mul_(b1).add_(g, 1 - b1), the denominator's
// sqrt(v) / c + eps); refused for the functions that are not elementwise maps over f32.
TEST_P(Conformance, TensorMapsTakeAFusedScaleBeforeAndAfter) {
  const size_t n = 37;
  auto x = randomFloats(n, 41), y = randomFloats(n, 42);
  for (auto& v : x) v = std::fabs(v) + 0.5f;
  auto bx = floats(x), by = floats(y), out = floats(std::vector<float>(n));
  auto add = tensorOp(TensorFn::add, {n}, {view(out.get(), 0, {1}), view(bx.get(), 0, {1}), view(by.get(), 0, {1})});
  add.alpha = 0.1f, add.preScale = 0.9f, add.preShift = 0.25f, add.postScale = -2, add.postShift = 3;
  auto s = device->tensor(add);
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  auto got = readFloats(*out, n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], -2 * ((0.9f * x[i] + 0.25f) + 0.1f * y[i]) + 3, 1e-5) << i;
  auto root = tensorOp(TensorFn::sqrt, {n}, {view(out.get(), 0, {1}), view(bx.get(), 0, {1})});
  root.postScale = 0.5f, root.postShift = 1e-3f;
  ASSERT_TRUE(device->tensor(root));
  got = readFloats(*out, n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], std::sqrt(x[i]) * 0.5f + 1e-3f, 1e-6) << i;
  auto refused = [&](TensorOp op, const char* words) {
    auto r = device->tensor(op);
    ASSERT_FALSE(r) << tensorFnName(op.fn);
    EXPECT_NE(r.error().message.find(words), std::string::npos) << r.error().message;
  };
  auto sum = tensorOp(TensorFn::sum, {n}, {view(out.get(), 0, {0}), view(bx.get(), 0, {1})});
  sum.reduceMask = 1, sum.preScale = 2;
  refused(sum, "only the elementwise map functions");
  auto nan = add;
  nan.postShift = std::numeric_limits<float>::infinity();
  refused(nan, "not a finite number");
}

// GELU and its backward over contiguous operands (the flat kernels; an OpenCL CPU card
// runs them as vectors of 16): both forms, at offsets into their buffers, with fused
// scales, over 2 whole vectors and 5 more, and over fewer than one vector.
TEST_P(Conformance, GeluAndItsBackwardOverContiguousOperandsMatchReferenceWithFusedScales) {
  const uint64_t at = 3, n = 37;
  auto x = randomFloats(at + n, 61), g = randomFloats(at + n, 62);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= 2;  // -4 to 4: both tails of erf
  const std::vector<float> fresh(at + n, -9.0f);
  auto bx = floats(x), bg = floats(g), out = floats(fresh);
  auto erfGelu = [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
  auto erfGrad = [](double v) { return 0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI); };
  auto tanhInner = [](double v) { return std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)); };
  auto tanhGelu = [&](double v) { return 0.5 * v * (1 + tanhInner(v)); };
  auto tanhGrad = [&](double v) {
    const double t = tanhInner(v);
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
  };
  for (uint64_t count : {n, uint64_t{5}})
    for (int tanhForm : {0, 1})
      for (TensorFn fn : {TensorFn::gelu, TensorFn::geluBackward}) {
        const bool backward = fn == TensorFn::geluBackward;
        // gelu: out = -2 gelu(0.5 x + 0.25) + 1; backward: out = -2 (0.5 g + 0.25) gelu'(x) + 1
        auto op = backward ? tensorOp(fn, {count}, {view(out.get(), at, {1}), view(bg.get(), at, {1}), view(bx.get(), at, {1})})
                           : tensorOp(fn, {count}, {view(out.get(), at, {1}), view(bx.get(), at, {1})});
        op.alpha = float(tanhForm), op.preScale = 0.5f, op.preShift = 0.25f, op.postScale = -2, op.postShift = 1;
        auto s = device->tensor(op);
        if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
        ASSERT_TRUE(s) << s.error().message;
        auto got = readFloats(*out, at + n);
        for (uint64_t i = 0; i < at; ++i) ASSERT_EQ(got[i], -9.0f) << "written before its offset: " << i;
        for (uint64_t i = at; i < at + n; ++i) {
          const double v = x[i], pre = 0.5 * (backward ? g[i] : x[i]) + 0.25;
          const double f = backward ? pre * (tanhForm ? tanhGrad(v) : erfGrad(v)) : (tanhForm ? tanhGelu(pre) : erfGelu(pre));
          const double want = i < at + count ? -2 * f + 1 : -9.0;
          ASSERT_NEAR(got[i], want, 1e-5 * std::max(1.0, std::fabs(want)))
              << tensorFnName(fn) << (tanhForm ? " (tanh)" : " (erf)") << " of " << count << ", element " << i - at;
        }
        ASSERT_TRUE(device->write(*out, 0, std::as_bytes(std::span(fresh))));
      }
}

// Sums of many elements into few outputs (a card with work-group memory sums each output
// with a work-group): everything into one, and each of 3 channels over a [5, 3, 700]
// tensor's other dimensions, scaled and added to what was there (alpha, beta); and rows'
// sums.
TEST_P(Conformance, ASumOfManyElementsIntoFewOutputsMatchesReference) {
  const size_t n = 5, c = 3, p = 700;
  auto x = randomFloats(n * c * p, 71);
  auto bx = floats(x), out = floats({1, 2, 3});
  auto all = tensorOp(TensorFn::sum, {n * c * p}, {view(out.get(), 0, {0}), view(bx.get(), 0, {1})});
  all.reduceMask = 1;
  auto s = device->tensor(all);
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  double total = 0;
  for (float v : x) total += v;
  EXPECT_NEAR(readFloats(*out, 1)[0], total, 1e-3);
  // out[ch] = 0.5 * (the sum over batch and positions) + 2 * out[ch]; shape [c, n, p] with
  // the channel kept.
  auto channels = floats({1, 2, 3});
  auto per = tensorOp(TensorFn::sum, {c, n, p}, {view(channels.get(), 0, {1, 0, 0}), view(bx.get(), 0, {p, c * p, 1})});
  per.reduceMask = 0b110, per.alpha = 0.5f, per.beta = 2;
  ASSERT_TRUE(device->tensor(per));
  auto got = readFloats(*channels, c);
  for (size_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (size_t b = 0; b < n; ++b)
      for (size_t q = 0; q < p; ++q) sum += x[(b * c + ch) * p + q];
    EXPECT_NEAR(got[ch], 0.5 * sum + 2.0 * (ch + 1), 1e-3) << ch;
  }
  // Each row's sum, the rows' elements neighbours (a CPU card sums them as vectors): rows
  // of 37 (two whole vectors and 5 more), of 16 (one) and of 3 (none), from element 7 on.
  for (const size_t len : {37, 16, 3}) {
    const size_t rows = 6, at = 7;
    auto rowSums = floats(std::vector<float>(rows, 1));
    auto op = tensorOp(TensorFn::sum, {rows, len}, {view(rowSums.get(), 0, {1, 0}), view(bx.get(), at, {len, 1})});
    op.reduceMask = 0b10, op.alpha = 2, op.beta = -1;
    ASSERT_TRUE(device->tensor(op)) << len;
    auto sums = readFloats(*rowSums, rows);
    for (size_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (size_t q = 0; q < len; ++q) sum += x[at + r * len + q];
      EXPECT_NEAR(sums[r], 2 * sum - 1, 1e-4) << "rows of " << len << ", row " << r;
    }
  }
}

// A max pooling's reductions: 2 x 2 windows of a [2, 3, 6, 8] input as a [2, 3, 3, 4, 2,
// 2] view (four kept dimensions, two reduced), amax, argmax (the window's first largest
// element, row-major) and sum, each window against a reference.
TEST_P(Conformance, ReductionsOverWindowsOfSeveralKeptDimensionsMatchReference) {
  const uint64_t N = 2, C = 3, H = 6, W = 8, outputs = N * C * (H / 2) * (W / 2);
  auto x = randomFloats(N * C * H * W, 81);
  x[5] = x[4];  // a tie: the first wins
  auto bx = floats(x), maxima = floats(std::vector<float>(outputs, -1)), sums = floats(std::vector<float>(outputs, -1));
  auto positions = device->allocate(outputs * 8);
  ASSERT_TRUE(positions);
  const std::vector<uint64_t> shape = {N, C, H / 2, W / 2, 2, 2}, windows = {C * H * W, H * W, 2 * W, 2, W, 1},
                              outStrides = {C * (H / 2) * (W / 2), (H / 2) * (W / 2), W / 2, 1, 0, 0};
  for (TensorFn fn : {TensorFn::amax, TensorFn::argmax, TensorFn::sum}) {
    Buffer* out = fn == TensorFn::amax ? maxima.get() : fn == TensorFn::sum ? sums.get() : positions->get();
    auto op = tensorOp(fn, shape, {view(out, 0, outStrides, fn == TensorFn::argmax ? TensorType::i64 : TensorType::f32),
                                   view(bx.get(), 0, windows)});
    op.reduceMask = 0b110000;
    auto s = device->tensor(op);
    if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
    ASSERT_TRUE(s) << tensorFnName(fn) << ": " << s.error().message;
  }
  auto gotMax = readFloats(*maxima, outputs), gotSum = readFloats(*sums, outputs);
  std::vector<int64_t> gotAt(outputs);
  ASSERT_TRUE(device->read(**positions, 0, std::as_writable_bytes(std::span(gotAt))));
  for (uint64_t o = 0; o < outputs; ++o) {
    const uint64_t ow = o % (W / 2), oh = o / (W / 2) % (H / 2), plane = o / (W / 2 * (H / 2));
    float best = -INFINITY, sum = 0;
    int64_t at = 0;
    for (int64_t r = 0; r < 4; ++r) {
      const float v = x[plane * H * W + (2 * oh + r / 2) * W + 2 * ow + r % 2];
      if (v > best) best = v, at = r;
      sum += v;
    }
    EXPECT_EQ(gotMax[o], best) << o;
    EXPECT_EQ(gotAt[o], at) << o;
    EXPECT_NEAR(gotSum[o], sum, 1e-5) << o;
  }
}

// Class 2 of issue 29: a zero in the shape used to skip the reach check, and the other
// dimensions' strides then overflowed signed arithmetic while the dimensions merged.
TEST_P(Conformance, ATensorOpWithAZeroDimensionRunsNothingWhateverItsOtherNumbers) {
  auto a = floats(randomFloats(4, 3));
  auto out = floats({1, 2, 3, 4});
  const uint64_t huge = uint64_t{1} << 62;
  for (auto fn : {TensorFn::add, TensorFn::copy, TensorFn::sum, TensorFn::matmul}) {
    auto op = tensorOp(fn, {0, uint64_t{1} << 40, 3}, {view(out.get(), huge, {huge, huge, huge}),
                                                        view(a.get(), ~uint64_t{0}, {huge, huge, 7}),
                                                        view(a.get(), 5, {~uint64_t{0}, 3, huge})});
    if (fn == TensorFn::sum) op.reduceMask = 2, op.operands[0].strides[1] = 0;
    if (fn == TensorFn::matmul) op.operands[0].strides[2] = 0, op.operands[1].strides[1] = 0, op.operands[2].strides[0] = 0;
    auto s = device->tensor(op);
    if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
    EXPECT_TRUE(s) << tensorFnName(fn) << ": " << s.error().message;
  }
  EXPECT_EQ(readFloats(*out, 4), (std::vector<float>{1, 2, 3, 4}));
  // Not empty: the same strides are refused by the reach check, naming it.
  auto big = tensorOp(TensorFn::add, {2, 3}, {view(out.get(), 0, {huge, 1}), view(a.get(), 0, {huge, 1}), view(a.get(), 0, {1, huge})});
  auto s = device->tensor(big);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("reaches element"), std::string::npos) << s.error().message;
}

// Bounded work (hal/slicing.h): an op cut into slices of a few elements gives the whole
// op's result, cut reductions (sum's dimensions, matmul's k) included.
TEST_P(Conformance, AnOpCutIntoSlicesGivesTheWholeOpsResult) {
  const size_t m = 7, n = 5, k = 13;
  auto a = randomFloats(m * k, 11), b = randomFloats(k * n, 12), c = randomFloats(m * n, 13);
  auto ba = floats(a), bb = floats(b), whole = floats(c), sliced = floats(c);
  auto run = [&](const TensorOp& op, double budget) -> Status {
    auto slices = sliceTensor(op, budget);
    uint64_t count = 0;
    for (;;) {
      auto r = slices->runNext(*device);
      if (!r) return std::unexpected(r.error());
      ++count;
      if (*r) break;
    }
    EXPECT_EQ(count, slices->total());
    EXPECT_GT(count, 1u);
    return {};
  };
  auto expectSame = [&](const Buffer& x, const Buffer& y, size_t count, const char* what) {
    auto vx = readFloats(x, count), vy = readFloats(y, count);
    for (size_t i = 0; i < count; ++i) ASSERT_NEAR(vx[i], vy[i], 1e-4) << what << " at " << i;
  };
  // matmul, out = 0.5 a b + 2 c, cut within k (the budget is below one output's k).
  for (double budget : {3.0, 40.0, 300.0}) {
    ASSERT_TRUE(device->write(*whole, 0, std::as_bytes(std::span(c))));
    ASSERT_TRUE(device->write(*sliced, 0, std::as_bytes(std::span(c))));
    auto mm = [&](Buffer* out) {
      auto op = tensorOp(TensorFn::matmul, {m, n, k}, {view(out, 0, {n, 1, 0}), view(ba.get(), 0, {k, 0, 1}), view(bb.get(), 0, {0, 1, n})});
      op.alpha = 0.5f, op.beta = 2;
      return op;
    };
    auto s = device->tensor(mm(whole.get()));
    if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
    ASSERT_TRUE(s) << s.error().message;
    ASSERT_TRUE(run(mm(sliced.get()), budget));
    expectSame(*whole, *sliced, m * n, "matmul");
  }
  // sum over dimension 0 of a (m x k), beta 0, cut across the summed rows.
  auto cw = device->allocate(k * 4), cs = device->allocate(k * 4);
  ASSERT_TRUE(cw && cs);
  auto sum = [&](Buffer* out) {
    auto op = tensorOp(TensorFn::sum, {m, k}, {view(out, 0, {0, 1}), view(ba.get(), 0, {k, 1})});
    op.reduceMask = 1;
    return op;
  };
  ASSERT_TRUE(device->tensor(sum(cw->get())));
  ASSERT_TRUE(run(sum(cs->get()), 5));
  expectSame(**cw, **cs, k, "sum");
  // amax and argmax over each row's k columns: only the rows are cut.
  for (TensorFn fn : {TensorFn::amax, TensorFn::argmax}) {
    const auto type = fn == TensorFn::argmax ? TensorType::i64 : TensorType::f32;
    auto rw = device->allocate(m * 8), rs = device->allocate(m * 8);
    ASSERT_TRUE(rw && rs);
    auto op = [&](Buffer* out) {
      auto o = tensorOp(fn, {m, k}, {view(out, 0, {1, 0}, type), view(ba.get(), 0, {k, 1})});
      o.reduceMask = 2;
      return o;
    };
    ASSERT_TRUE(device->tensor(op(rw->get())));
    ASSERT_TRUE(run(op(rs->get()), 2 * k));
    std::vector<std::byte> x(m * 8), y(m * 8);
    ASSERT_TRUE(device->read(**rw, 0, x));
    ASSERT_TRUE(device->read(**rs, 0, y));
    EXPECT_EQ(x, y) << tensorFnName(fn);
  }
  // indexAdd (scatter_add along dimension 0 of a k x n table, from m rows of
  // positions): the slices cut the columns only, each holding every row.
  {
    std::vector<int64_t> where(m * n);
    for (size_t i = 0; i < where.size(); ++i) where[i] = int64_t((i * 7 + 3) % k);
    auto bw = device->allocate(where.size() * 8);
    auto tw = floats(std::vector<float>(k * n, 1)), ts = floats(std::vector<float>(k * n, 1));
    ASSERT_TRUE(bw);
    ASSERT_TRUE(device->write(**bw, 0, std::as_bytes(std::span(where))));
    auto op = [&](Buffer* out) {
      auto o = tensorOp(TensorFn::indexAdd, {n, k, m}, {view(out, 0, {1, n, 0}), view(bb.get(), 0, {1, 0, n}), view(bw->get(), 0, {1, 0, n}, TensorType::i64)});
      o.ignoreIndex = -1, o.beta = 1;
      return o;
    };
    ASSERT_TRUE(device->tensor(op(tw.get())));
    ASSERT_TRUE(run(op(ts.get()), double(k * m)));
    expectSame(*tw, *ts, k * n, "indexAdd");
  }
  // An i64 sum of bools cut across the summed elements accumulates exactly.
  {
    std::vector<uint8_t> flags(1000);
    for (size_t i = 0; i < flags.size(); ++i) flags[i] = i % 3 == 0;
    auto bflags = device->allocate(flags.size()), count = device->allocate(8);
    ASSERT_TRUE(bflags && count);
    ASSERT_TRUE(device->write(**bflags, 0, std::as_bytes(std::span(flags))));
    auto op = tensorOp(TensorFn::sum, {1000}, {view(count->get(), 0, {0}, TensorType::i64), view(bflags->get(), 0, {1}, TensorType::boolean)});
    op.reduceMask = 1;
    ASSERT_TRUE(run(op, 64));
    std::vector<int64_t> got(1);
    ASSERT_TRUE(device->read(**count, 0, std::as_writable_bytes(std::span(got))));
    EXPECT_EQ(got[0], 334);
  }
  // elementwise over a transposed view, and log_softmax by rows.
  auto add = [&](Buffer* out) {
    auto op = tensorOp(TensorFn::add, {k, m}, {view(out, 0, {m, 1}), view(ba.get(), 0, {1, k}), view(ba.get(), 0, {1, k})});
    op.alpha = -0.25f;
    return op;
  };
  auto ew = device->allocate(m * k * 4), es = device->allocate(m * k * 4);
  ASSERT_TRUE(ew && es);
  ASSERT_TRUE(device->tensor(add(ew->get())));
  ASSERT_TRUE(run(add(es->get()), 6));
  expectSame(**ew, **es, m * k, "add");
  auto ls = [&](Buffer* out) { return tensorOp(TensorFn::logSoftmax, {m, k}, {view(out, 0, {k, 1}), view(ba.get(), 0, {k, 1})}); };
  ASSERT_TRUE(device->tensor(ls(ew->get())));
  ASSERT_TRUE(run(ls(es->get()), 1));  // one row a slice: a row is never cut
  expectSame(**ew, **es, m * k, "logSoftmax");
  // A gemm, and a copy that moves a buffer's bytes up over themselves (memmove's meaning).
  if (hasBuiltins()) {
    ASSERT_TRUE(device->write(*whole, 0, std::as_bytes(std::span(c))));
    ASSERT_TRUE(device->write(*sliced, 0, std::as_bytes(std::span(c))));
    ASSERT_TRUE(device->gemm({uint32_t(m), uint32_t(n), uint32_t(k), 1.5f, -1, ba.get(), bb.get(), whole.get()}));
    BuiltinOp gemm;
    gemm.gemm = {uint32_t(m), uint32_t(n), uint32_t(k), 1.5f, -1, ba.get(), bb.get(), sliced.get()};
    auto g = sliceBuiltin(gemm, 50);
    ASSERT_TRUE(g);
    for (bool done = false; !done;) {
      auto r = g->runNext(*device);
      ASSERT_TRUE(r) << r.error().message;
      done = *r;
    }
    expectSame(*whole, *sliced, m * n, "gemm");
  }
  std::vector<std::byte> bytes(100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i);
  auto buf = device->allocate(100);
  ASSERT_TRUE(buf);
  ASSERT_TRUE(device->write(**buf, 0, bytes));
  auto cp = sliceCopy(**buf, 10, **buf, 0, 80, 7);
  ASSERT_TRUE(cp);
  for (bool done = false; !done;) done = *cp->runNext(*device);
  std::vector<std::byte> back(100);
  ASSERT_TRUE(device->read(**buf, 0, back));
  for (size_t i = 10; i < 90; ++i) ASSERT_EQ(back[i], std::byte(i - 10)) << i;
}

// Operands of other element types: conversions, comparisons and selections are exact for
// integers past f32's 2^24, reductions to values and positions follow PyTorch's rules.
// polygamma of orders 0 to 5 at known values (PyTorch's f64 ones, to 6 digits), poles, a
// NaN, and a q past -2^20 (NaN: the series' loop is bounded); an order that is not an
// integer in [0, 64] refused.
TEST_P(Conformance, PolygammaGivesItsKnownValuesAndBoundsItsWork) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    int n;
    float x;
    double want;
  };
  const std::vector<Case> cases = {
      {1, 1.0f, 1.6449340676}, {1, 0.5f, 4.9348022021}, {2, 1.0f, -2.4041138063}, {3, 1.0f, 6.4939394023},
      {2, 2.5f, -0.2362040516}, {1, -0.5f, 8.9348022001}, {2, -1.5f, -0.2362040516}, {4, 0.3f, -9883.468555},
      {5, 10.0f, 3.0594516212e-4}, {1, 100.0f, 0.0100501667}, {0, 1.0f, -0.5772156649}, {2, -2.0f, -inf},
      {3, nan, nan}, {2, -1999999.5f, nan}};
  for (const auto& c : cases) {
    auto x = floats({c.x}), y = floats({0.0f});
    auto op = tensorOp(TensorFn::polygamma, {1}, {view(y.get(), 0, {1}), view(x.get(), 0, {1})});
    op.alpha = float(c.n);
    ASSERT_TRUE(device->tensor(op)) << c.n << " " << c.x;
    std::vector<float> got(1);
    ASSERT_TRUE(device->read(*y, 0, std::as_writable_bytes(std::span(got))));
    if (std::isnan(c.want)) EXPECT_TRUE(std::isnan(got[0])) << c.n << " " << c.x << ": " << got[0];
    else if (std::isinf(c.want)) EXPECT_EQ(got[0], float(c.want)) << c.n << " " << c.x;
    else EXPECT_NEAR(got[0], c.want, 2e-6 * std::fabs(c.want)) << c.n << " " << c.x;
  }
  auto x = floats({1.0f}), y = floats({0.0f});
  for (float order : {1.5f, -1.0f, 65.0f, nan}) {
    auto op = tensorOp(TensorFn::polygamma, {1}, {view(y.get(), 0, {1}), view(x.get(), 0, {1})});
    op.alpha = order;
    auto refused = device->tensor(op);
    ASSERT_FALSE(refused) << order;
    EXPECT_NE(refused.error().message.find("an integer in [0, 64]"), std::string::npos) << refused.error().message;
  }
}

// The bits of i64: and, or, xor over every sign, and shifts by counts in range, by 63,
// and out of range (taken modulo 64, as x86 shifts: so PyTorch 1.13's CPU), the right
// shift keeping the sign; a bits op of f32 refused.
TEST_P(Conformance, BitsOfI64AreExactAndShiftsTakeTheirCountModulo64) {
  const int64_t top = std::numeric_limits<int64_t>::max(), bottom = std::numeric_limits<int64_t>::min();
  const std::vector<int64_t> as = {5, -5, int64_t{1} << 62, -1, top, bottom, 0x0F0F, -123456789012345, 7, -7};
  const std::vector<int64_t> bs = {3, 1, 63, 64, 70, -1, 0, 13, 0, 2};
  const uint64_t n = as.size();
  auto ba = bytes(n * 8), bb = bytes(n * 8), out = bytes(n * 8);
  ASSERT_TRUE(device->write(*ba, 0, std::as_bytes(std::span(as))));
  ASSERT_TRUE(device->write(*bb, 0, std::as_bytes(std::span(bs))));
  const auto i64 = TensorType::i64;
  for (TensorFn fn : {TensorFn::bitwiseAnd, TensorFn::bitwiseOr, TensorFn::bitwiseXor, TensorFn::shiftLeft, TensorFn::shiftRight}) {
    ASSERT_TRUE(device->tensor(tensorOp(fn, {n}, {view(out.get(), 0, {1}, i64), view(ba.get(), 0, {1}, i64), view(bb.get(), 0, {1}, i64)})))
        << tensorFnName(fn);
    std::vector<int64_t> got(n), want;
    ASSERT_TRUE(device->read(*out, 0, std::as_writable_bytes(std::span(got))));
    for (size_t i = 0; i < n; ++i) {
      const uint64_t x = uint64_t(as[i]), y = uint64_t(bs[i]);
      const int s = int(y & 63);
      const uint64_t sign = as[i] < 0 ? ~(~uint64_t{0} >> s) : 0;
      want.push_back(int64_t(fn == TensorFn::bitwiseAnd ? x & y : fn == TensorFn::bitwiseOr ? x | y
                             : fn == TensorFn::bitwiseXor ? x ^ y : fn == TensorFn::shiftLeft ? x << s : (x >> s) | sign));
    }
    EXPECT_EQ(got, want) << tensorFnName(fn);
  }
  // Known values: -5 >> 1 is -3, -1 << 64 is -1 (a count of 0), 1 << 62 >> 63 is 0, -7 >> 2 is -2.
  std::vector<int64_t> got(n);
  ASSERT_TRUE(device->read(*out, 0, std::as_writable_bytes(std::span(got))));
  EXPECT_EQ(got[1], -3);
  EXPECT_EQ(got[2], 0);
  EXPECT_EQ(got[9], -2);
  auto reals = floats(std::vector<float>(n, 1.0f));
  auto refused = device->tensor(tensorOp(TensorFn::bitwiseAnd, {n}, {view(out.get(), 0, {1}, i64), view(reals.get(), 0, {1}),
                                                                     view(bb.get(), 0, {1}, i64)}));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("bits are i64"), std::string::npos) << refused.error().message;
}

// gcd of i64 over every sign, zeros, and the smallest i64 (whose magnitude wraps to
// itself, as PyTorch's CPU); an f32 operand refused.
TEST_P(Conformance, GcdOfI64IsExactForEverySign) {
  const int64_t bottom = std::numeric_limits<int64_t>::min();
  const std::vector<int64_t> as = {12, -18, 0, 0, bottom, bottom, 7, int64_t{3} << 40, -(int64_t{1} << 62), 1134903170};
  const std::vector<int64_t> bs = {-8, 27, 5, 0, 0, int64_t{1} << 62, 13, int64_t{5} << 41, int64_t{3} << 61, 1836311903};
  const std::vector<int64_t> want = {4, 9, 5, 0, bottom, int64_t{1} << 62, 1, int64_t{1} << 40, int64_t{1} << 61, 1};
  const uint64_t n = as.size();
  auto ba = bytes(n * 8), bb = bytes(n * 8), out = bytes(n * 8);
  ASSERT_TRUE(device->write(*ba, 0, std::as_bytes(std::span(as))));
  ASSERT_TRUE(device->write(*bb, 0, std::as_bytes(std::span(bs))));
  const auto i64 = TensorType::i64;
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::gcd, {n}, {view(out.get(), 0, {1}, i64), view(ba.get(), 0, {1}, i64), view(bb.get(), 0, {1}, i64)})));
  std::vector<int64_t> got(n);
  ASSERT_TRUE(device->read(*out, 0, std::as_writable_bytes(std::span(got))));
  EXPECT_EQ(got, want);
  auto reals = floats(std::vector<float>(n, 1.0f));
  auto refused = device->tensor(tensorOp(TensorFn::gcd, {n}, {view(out.get(), 0, {1}, i64), view(reals.get(), 0, {1}), view(bb.get(), 0, {1}, i64)}));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("gcd is of i64"), std::string::npos) << refused.error().message;
}

// indexReduce over two columns of six picks into three rows: the product, the largest
// and the smallest with and without out's own value, a NaN picked (it wins) and one in
// out (it stays), the last of several picks (of i64 too, exactly), and a row nothing
// picks (it keeps its value).
TEST_P(Conformance, IndexReduceTakesProductsExtremesAndTheLastPick) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // a: [2 columns, 6 picks]; index: the same picks for both columns; out: [2, 3] (+ 1 row untouched)
  const std::vector<float> a = {2, -1, 3, 5, 4, 0.5f, 1, nan, -2, 6, 3, 7};
  const std::vector<int64_t> index = {0, 1, 1, 0, 1, 0};
  const std::vector<float> start = {10, -10, 99, nan, 1, 99};
  auto ba = floats(a), out = floats(start);
  auto bi = bytes(index.size() * 8);
  ASSERT_TRUE(device->write(*bi, 0, std::as_bytes(std::span(index))));
  auto run = [&](float mode, float include) {
    EXPECT_TRUE(device->write(*out, 0, std::as_bytes(std::span(start))));
    auto op = tensorOp(TensorFn::indexReduce, {2, 3, 6},
                       {view(out.get(), 0, {3, 1, 0}), view(ba.get(), 0, {6, 0, 1}), view(bi.get(), 0, {0, 0, 1}, TensorType::i64)});
    op.alpha = mode, op.beta = include;
    EXPECT_TRUE(device->tensor(op));
    return readFloats(*out, 6);
  };
  auto expectRows = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(got[i])) << what << " " << i;
      else EXPECT_FLOAT_EQ(got[i], want[i]) << what << " " << i;
    }
  };
  // column 0 picks: row 0 <- 2, 5, 0.5; row 1 <- -1, 3, 4. column 1: row 0 <- 1, 6, 7; row 1 <- nan, -2, 3.
  expectRows(run(0, 0), {5, -12, 99, 42, nan, 99}, "product");
  expectRows(run(0, 1), {50, 120, 99, nan, nan, 99}, "product with out's own");
  expectRows(run(1, 0), {5, 4, 99, 7, nan, 99}, "largest");
  expectRows(run(1, 1), {10, 4, 99, nan, nan, 99}, "largest with out's own (its NaN stays)");
  expectRows(run(2, 0), {0.5f, -1, 99, 1, nan, 99}, "smallest");
  expectRows(run(3, 1), {0.5f, 4, 99, 7, 3, 99}, "the last pick");
  // The last pick of i64, past f32's 2^24, moved exactly; a product of i64 refused.
  const std::vector<int64_t> wide = {(int64_t{1} << 40) + 1, -3, (int64_t{1} << 53) + 7, 11, -(int64_t{1} << 60), 5};
  const std::vector<int64_t> wideStart = {1, 2, 3};
  auto bw = bytes(wide.size() * 8), ow = bytes(wideStart.size() * 8);
  ASSERT_TRUE(device->write(*bw, 0, std::as_bytes(std::span(wide))));
  ASSERT_TRUE(device->write(*ow, 0, std::as_bytes(std::span(wideStart))));
  const auto i64 = TensorType::i64;
  auto last = tensorOp(TensorFn::indexReduce, {3, 6}, {view(ow.get(), 0, {1, 0}, i64), view(bw.get(), 0, {0, 1}, i64), view(bi.get(), 0, {0, 1}, i64)});
  last.alpha = 3, last.beta = 1;
  ASSERT_TRUE(device->tensor(last));
  std::vector<int64_t> gotWide(3);
  ASSERT_TRUE(device->read(*ow, 0, std::as_writable_bytes(std::span(gotWide))));
  EXPECT_EQ(gotWide, (std::vector<int64_t>{5, -(int64_t{1} << 60), 3}));
  last.alpha = 0;
  EXPECT_FALSE(device->tensor(last));
  auto op = tensorOp(TensorFn::indexReduce, {2, 3, 6},
                     {view(out.get(), 0, {3, 1, 0}), view(ba.get(), 0, {6, 0, 1}), view(bi.get(), 0, {0, 0, 1}, TensorType::i64)});
  op.alpha = 4;
  auto refused = device->tensor(op);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("3 last"), std::string::npos) << refused.error().message;
}

// Linear algebra on a batch of two 4 x 4 matrices: Cholesky of an SPD one (L L^T gives it
// back; a matrix whose third leading minor is not positive definite gives info 3 and NaN
// columns from there), triangular solves (lower, upper through swapped strides, unit),
// LU with partial pivoting (P A = L U, LAPACK's pivots, info for a singular one) and the
// solve from it; a pivot no factorization made gives NaN, not a read out of bounds; a
// non-square shape, a matrix past the bound and an overlap refused.
// Householder QR (LAPACK's geqrf and orgqr) of a tall and a wide matrix, the symmetric
// eigenproblem and the singular values of a batch: Q^T Q = I, Q R = A, A V = V diag(w)
// ascending, U diag(s) V^T = A descending with U and V orthonormal.
TEST_P(Conformance, OrthogonalFactorizationsOfABatch) {
  auto qr = [&](uint64_t m, uint64_t n, const std::vector<float>& a) {
    SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n));
    const uint64_t k = std::min(m, n);
    auto ba = floats(a), bf = floats(std::vector<float>(m * n, -7.0f)), bt = floats(std::vector<float>(n, -7.0f));
    auto bq = floats(std::vector<float>(m * k, -7.0f));
    EXPECT_TRUE(device->tensor(tensorOp(TensorFn::qrFactor, {m, n}, {view(bf.get(), 0, {n, 1}), view(ba.get(), 0, {n, 1}),
                                                                       view(bt.get(), 0, {0, 1})})));
    // Q: the reflectors of the first k columns (out's rows m, its columns k).
    EXPECT_TRUE(device->tensor(tensorOp(TensorFn::householderProduct, {m, k},
                                        {view(bq.get(), 0, {k, 1}), view(bf.get(), 0, {n, 1}), view(bt.get(), 0, {0, 1})})));
    const auto f = readFloats(*bf, m * n), tau = readFloats(*bt, n), q = readFloats(*bq, m * k);
    for (uint64_t j = k; j < n; ++j) EXPECT_EQ(tau[j], 0.0f) << "tau past min(m, n), " << j;
    for (uint64_t i = 0; i < k; ++i)
      for (uint64_t j = 0; j < k; ++j) {
        float v = 0;
        for (uint64_t r = 0; r < m; ++r) v += q[r * k + i] * q[r * k + j];
        EXPECT_NEAR(v, i == j ? 1.0f : 0.0f, 1e-5f) << "Q^T Q at " << i << " " << j;
      }
    for (uint64_t i = 0; i < m; ++i)
      for (uint64_t j = 0; j < n; ++j) {
        float v = 0;
        for (uint64_t r = 0; r <= std::min(j, k - 1); ++r) v += q[i * k + r] * f[r * n + j];  // R: out's upper triangle
        EXPECT_NEAR(v, a[i * n + j], 1e-4f) << "Q R = A at " << i << " " << j;
      }
    return std::make_pair(f, tau);
  };
  qr(5, 3, {1, 2, 0, -3, 1, 4, 2, 2, 1, 0.5f, -1, 2, 4, 0, 1});
  qr(3, 5, {2, 1, 0, 3, -1, 1, 3, 1, 0, 2, 0, 1, 4, 1, 1});
  // LAPACK's own numbers: [3; 4] reflects onto -5 (beta against the diagonal's sign), v 0.5, tau 1.6.
  auto [f, tau] = qr(2, 1, {3, 4});
  EXPECT_NEAR(f[0], -5.0f, 1e-6f);
  EXPECT_NEAR(f[1], 0.5f, 1e-6f);
  EXPECT_NEAR(tau[0], 1.6f, 1e-6f);
  // A column already zero below the diagonal: H = I, tau 0.
  auto [g, zero] = qr(2, 2, {2, 1, 0, 3});
  EXPECT_EQ(zero[0], 0.0f);
  EXPECT_EQ(g[0], 2.0f);

  // Eigen: a symmetric 4 x 4 (its upper triangle garbage: only the lower is read), a
  // diagonal one and one holding a NaN.
  const uint64_t n = 4;
  const std::vector<float> sym = {4, 1, -2, 0.5f, 1, 3, 0, 1, -2, 0, 5, 2, 0.5f, 1, 2, -1};
  std::vector<float> a(3 * n * n, 0.0f);
  for (uint64_t i = 0; i < n; ++i)
    for (uint64_t j = 0; j < n; ++j) a[i * n + j] = j > i ? 999.0f : sym[i * n + j];
  const float diag[] = {3, 1, 2, -1};
  for (uint64_t i = 0; i < n; ++i) a[n * n + i * n + i] = diag[i];
  a[2 * n * n + 2 * n + 1] = std::nanf("");
  auto ba = floats(a), bv = floats(std::vector<float>(3 * n * n, -7.0f)), bw = floats(std::vector<float>(3 * n, -7.0f));
  auto scratch = bytes(3 * n * n * 4);
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::symmetricEigen, {3, n, n},
                                      {view(bv.get(), 0, {n * n, n, 1}), view(ba.get(), 0, {n * n, n, 1}),
                                       view(bw.get(), 0, {n, 0, 1}), view(scratch.get(), 0, {n * n, n, 1})})));
  const auto v = readFloats(*bv, 3 * n * n), w = readFloats(*bw, 3 * n);
  for (uint64_t j = 1; j < n; ++j) EXPECT_LE(w[j - 1], w[j]) << "ascending at " << j;
  for (uint64_t i = 0; i < n; ++i)
    for (uint64_t j = 0; j < n; ++j) {
      float av = 0, vtv = 0;
      for (uint64_t k = 0; k < n; ++k) av += sym[i * n + k] * v[k * n + j], vtv += v[k * n + i] * v[k * n + j];
      EXPECT_NEAR(av, v[i * n + j] * w[j], 1e-4f) << "A V = V diag(w) at " << i << " " << j;
      EXPECT_NEAR(vtv, i == j ? 1.0f : 0.0f, 1e-5f) << "V^T V at " << i << " " << j;
    }
  EXPECT_EQ(std::vector<float>(w.begin() + n, w.begin() + 2 * n), (std::vector<float>{-1, 1, 2, 3}));
  for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(std::fabs(v[n * n + i * n + (i == 0 ? 3 : i == 1 ? 1 : i == 2 ? 2 : 0)]), 1.0f) << i;
  for (uint64_t i = 0; i < n; ++i) EXPECT_TRUE(std::isnan(w[2 * n + i]) && std::isnan(v[2 * n * n + i])) << i;

  // Singular values: a tall 5 x 3, one of rank 2 (its third column the sum of the first
  // two), one of zeros (U still orthonormal) and one holding an infinity.
  const uint64_t sm = 5, sn = 3;
  const std::vector<float> tall = {1, 2, 0, -3, 1, 4, 2, 2, 1, 0.5f, -1, 2, 4, 0, 1};
  std::vector<float> sa(4 * sm * sn, 0.0f);
  std::copy(tall.begin(), tall.end(), sa.begin());
  for (uint64_t i = 0; i < sm; ++i) {
    sa[sm * sn + i * sn] = tall[i * sn], sa[sm * sn + i * sn + 1] = tall[i * sn + 1];
    sa[sm * sn + i * sn + 2] = tall[i * sn] + tall[i * sn + 1];
  }
  sa[3 * sm * sn + 4] = INFINITY;
  auto bsa = floats(sa), bu = floats(std::vector<float>(4 * sm * sn, -7.0f)), bs = floats(std::vector<float>(4 * sn, -7.0f));
  auto bvv = floats(std::vector<float>(4 * sm * sn, -7.0f));
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::singularValues, {4, sm, sn},
                                      {view(bu.get(), 0, {sm * sn, sn, 1}), view(bsa.get(), 0, {sm * sn, sn, 1}),
                                       view(bs.get(), 0, {sn, 0, 1}), view(bvv.get(), 0, {sm * sn, sn, 1})})));
  const auto u = readFloats(*bu, 4 * sm * sn), sv = readFloats(*bs, 4 * sn), vv = readFloats(*bvv, 4 * sm * sn);
  for (uint64_t b = 0; b < 3; ++b) {
    SCOPED_TRACE("matrix " + std::to_string(b));
    const float* U = &u[b * sm * sn];
    const float* V = &vv[b * sm * sn];
    const float* S = &sv[b * sn];
    for (uint64_t j = 1; j < sn; ++j) EXPECT_GE(S[j - 1], S[j]) << "descending at " << j;
    for (uint64_t i = 0; i < sn; ++i)
      for (uint64_t j = 0; j < sn; ++j) {
        float utu = 0, vtv = 0;
        for (uint64_t k = 0; k < sm; ++k) utu += U[k * sn + i] * U[k * sn + j];
        for (uint64_t k = 0; k < sn; ++k) vtv += V[k * sn + i] * V[k * sn + j];
        EXPECT_NEAR(utu, i == j ? 1.0f : 0.0f, 1e-5f) << "U^T U at " << i << " " << j;
        EXPECT_NEAR(vtv, i == j ? 1.0f : 0.0f, 1e-5f) << "V^T V at " << i << " " << j;
      }
    for (uint64_t i = 0; i < sm; ++i)
      for (uint64_t j = 0; j < sn; ++j) {
        float usv = 0;
        for (uint64_t k = 0; k < sn; ++k) usv += U[i * sn + k] * S[k] * V[j * sn + k];
        EXPECT_NEAR(usv, sa[b * sm * sn + i * sn + j], 1e-4f) << "U S V^T = A at " << i << " " << j;
      }
  }
  EXPECT_NEAR(sv[sn + 2], 0.0f, 1e-5f) << "rank 2";
  EXPECT_EQ(std::vector<float>(sv.begin() + 2 * sn, sv.begin() + 3 * sn), (std::vector<float>{0, 0, 0}));
  for (uint64_t i = 0; i < sn; ++i) EXPECT_TRUE(std::isnan(sv[3 * sn + i]) && std::isnan(u[3 * sm * sn + i])) << i;

  // Refusals: an eigenproblem past its bound, a Q of more columns than rows, tau strided over rows.
  auto refusal = [&](const TensorOp& op) {
    auto r = device->tensor(op);
    return r ? std::string() : r.error().message;
  };
  auto big = bytes(257 * 257 * 4 * 2);
  EXPECT_NE(refusal(tensorOp(TensorFn::symmetricEigen, {257, 257},
                             {view(big.get(), 0, {257, 1}), view(big.get(), 257 * 257, {257, 1}), view(bw.get(), 0, {0, 0}),
                              view(scratch.get(), 0, {0, 0})}))
                .find("at most 256"),
            std::string::npos);
  EXPECT_NE(refusal(tensorOp(TensorFn::householderProduct, {2, 3}, {view(bv.get(), 0, {3, 1}), view(ba.get(), 0, {3, 1}),
                                                                     view(bw.get(), 0, {0, 1})}))
                .find("at most as many columns as rows"),
            std::string::npos);
  EXPECT_NE(refusal(tensorOp(TensorFn::qrFactor, {3, 2}, {view(bv.get(), 0, {2, 1}), view(ba.get(), 0, {2, 1}),
                                                            view(bw.get(), 0, {1, 1})}))
                .find("tau is one element per column"),
            std::string::npos);
  EXPECT_NE(refusal(tensorOp(TensorFn::singularValues, {2, 3}, {view(bv.get(), 0, {3, 1}), view(ba.get(), 0, {3, 1}),
                                                                 view(bw.get(), 0, {0, 1}), view(scratch.get(), 0, {3, 1})}))
                .find("at most as many columns as rows"),
            std::string::npos);
}

// CTC's forward and backward variables against every path (C^T of them) collapsed by
// hand: log p(target) from alpha's end, from beta's start, and from alpha + beta at every
// time; -inf past a sequence's length, NaN for a length of 0 or a class past C.
TEST_P(Conformance, CtcLatticeSumsEveryPathThatCollapsesToTheTarget) {
  const uint64_t N = 4, T = 4, S = 5, C = 3;  // blank 0
  const std::vector<int64_t> labels = {0, 1, 0, 1, 0,  0, 2, 0, -1, -1,  0, 1, 0, -1, -1,  0, 7, 0, -1, -1};
  const std::vector<int64_t> lengths = {4, 3, 0, 4};
  const std::vector<std::vector<int64_t>> targets = {{1, 1}, {2}};
  std::vector<float> lp(N * T * C);  // [n, t, c], log-softmaxed
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2, 2);
  for (uint64_t row = 0; row < N * T; ++row) {
    double z = 0;
    for (uint64_t c = 0; c < C; ++c) z += std::exp(lp[row * C + c] = u(rng));
    for (uint64_t c = 0; c < C; ++c) lp[row * C + c] -= float(std::log(z));
  }
  auto blp = floats(lp), balpha = floats(std::vector<float>(N * T * S, 5.0f)), bbeta = floats(std::vector<float>(N * T * S, 5.0f));
  auto blabels = bytes(labels.size() * 8), blengths = bytes(lengths.size() * 8);
  ASSERT_TRUE(device->write(*blabels, 0, std::as_bytes(std::span(labels))));
  ASSERT_TRUE(device->write(*blengths, 0, std::as_bytes(std::span(lengths))));
  auto lattice = [&](Buffer* out, float direction) {
    auto op = tensorOp(TensorFn::ctcLattice, {N, T, S, C},
                       {view(out, 0, {T * S, S, 1, 0}), view(blp.get(), 0, {T * C, C, 0, 1}),
                        view(blabels.get(), 0, {S, 0, 1, 0}, TensorType::i64), view(blengths.get(), 0, {1, 0, 0, 0}, TensorType::i64)});
    op.alpha = direction;
    return device->tensor(op);
  };
  ASSERT_TRUE(lattice(balpha.get(), 0));
  ASSERT_TRUE(lattice(bbeta.get(), 1));
  const auto alpha = readFloats(*balpha, N * T * S), beta = readFloats(*bbeta, N * T * S);
  auto lse = [](double a, double b) { return a == -INFINITY && b == -INFINITY ? a : std::max(a, b) + std::log1p(std::exp(-std::fabs(a - b))); };
  for (uint64_t n = 0; n < 2; ++n) {
    SCOPED_TRACE("sequence " + std::to_string(n));
    const uint64_t length = uint64_t(lengths[n]), extended = 2 * targets[n].size() + 1;
    double p = 0;  // every path of `length` steps that collapses to the target
    for (uint64_t path = 0, paths = uint64_t(std::pow(C, length)); path < paths; ++path) {
      std::vector<int64_t> collapsed;
      double logp = 0;
      int64_t last = -1;
      for (uint64_t t = 0, rest = path; t < length; ++t, rest /= C) {
        const int64_t c = int64_t(rest % C);
        logp += lp[(n * T + t) * C + uint64_t(c)];
        if (c != last && c != 0) collapsed.push_back(c);
        last = c;
      }
      if (collapsed == targets[n]) p += std::exp(logp);
    }
    const double want = std::log(p);
    auto at = [&](const std::vector<float>& v, uint64_t t, uint64_t s) { return double(v[(n * T + t) * S + s]); };
    EXPECT_NEAR(lse(at(alpha, length - 1, extended - 1), at(alpha, length - 1, extended - 2)), want, 1e-4) << "alpha's end";
    EXPECT_NEAR(lse(at(beta, 0, 0), at(beta, 0, 1)), want, 1e-4) << "beta's start";
    for (uint64_t t = 0; t < length; ++t) {
      double sum = -INFINITY;
      for (uint64_t s = 0; s < extended; ++s)
        sum = lse(sum, at(alpha, t, s) + at(beta, t, s) - lp[(n * T + t) * C + uint64_t(labels[n * S + s])]);
      EXPECT_NEAR(sum, want, 1e-4) << "alpha + beta at time " << t;
    }
    for (uint64_t t = 0; t < T; ++t)
      for (uint64_t s = 0; s < S; ++s)
        if (t >= length || s >= extended) {
          EXPECT_EQ(at(alpha, t, s), -INFINITY) << t << " " << s;
        }
  }
  for (uint64_t i = 0; i < T * S; ++i) EXPECT_TRUE(std::isnan(alpha[2 * T * S + i])) << "a length of 0, " << i;
  EXPECT_TRUE(std::isnan(alpha[3 * T * S + 1])) << "a class past C";
  EXPECT_FALSE(std::isnan(alpha[3 * T * S + 0]));
  // Refused: a lattice strided over the classes, i32 labels, another alpha.
  auto refused = [&](TensorOp op) { return !device->tensor(op); };
  auto op = tensorOp(TensorFn::ctcLattice, {N, T, S, C},
                     {view(balpha.get(), 0, {T * S, S, 1, 1}), view(blp.get(), 0, {T * C, C, 0, 1}),
                      view(blabels.get(), 0, {S, 0, 1, 0}, TensorType::i64), view(blengths.get(), 0, {1, 0, 0, 0}, TensorType::i64)});
  EXPECT_TRUE(refused(op));
  op.operands[0].strides[3] = 0;
  op.alpha = 2;
  EXPECT_TRUE(refused(op));
  op.alpha = 0;
  op.operands[2].type = TensorType::f32;
  EXPECT_TRUE(refused(op));
}

TEST_P(Conformance, LinearAlgebraFactorsAndSolvesABatch) {
  const uint64_t n = 4;
  // SPD: M M^T + 4 I; and one whose third minor is negative.
  const std::vector<float> m = {2, 1, 0, 1, 1, 3, 1, 0, 0, 1, 2, 1, 1, 0, 1, 3};
  std::vector<float> a(2 * n * n, 0.0f);
  for (uint64_t i = 0; i < n; ++i)
    for (uint64_t j = 0; j < n; ++j) {
      float v = i == j ? 4.0f : 0.0f;
      for (uint64_t k = 0; k < n; ++k) v += m[i * n + k] * m[j * n + k];
      a[i * n + j] = v;
    }
  const std::vector<float> bad = {1, 2, 3, 0, 2, 5, 1, 0, 3, 1, 1, 0, 0, 0, 0, 1};
  std::copy(bad.begin(), bad.end(), a.begin() + n * n);
  const auto i64 = TensorType::i64;
  auto ba = floats(a), bl = floats(std::vector<float>(2 * n * n, -7.0f));
  auto info = bytes(2 * 8);
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::cholesky, {2, n, n},
                                      {view(bl.get(), 0, {n * n, n, 1}), view(ba.get(), 0, {n * n, n, 1}), view(info.get(), 0, {1, 0, 0}, i64)})));
  std::vector<float> l(2 * n * n);
  std::vector<int64_t> infos(2);
  ASSERT_TRUE(device->read(*bl, 0, std::as_writable_bytes(std::span(l))));
  ASSERT_TRUE(device->read(*info, 0, std::as_writable_bytes(std::span(infos))));
  EXPECT_EQ(infos, (std::vector<int64_t>{0, 3}));
  for (uint64_t i = 0; i < n; ++i)
    for (uint64_t j = 0; j < n; ++j) {
      if (j > i) {
        EXPECT_EQ(l[i * n + j], 0.0f) << i << " " << j;
      }
      float v = 0;
      for (uint64_t k = 0; k < n; ++k) v += l[i * n + k] * l[j * n + k];
      EXPECT_NEAR(v, a[i * n + j], 1e-4f * std::fabs(a[i * n + j]) + 1e-5f) << i << " " << j;
    }
  for (uint64_t i = 2; i < n; ++i) EXPECT_TRUE(std::isnan(l[n * n + i * n + 2])) << i;
  EXPECT_FALSE(std::isnan(l[n * n + 1 * n + 0]));

  // Solve L X = B and L^T X = B (L^T: L's strides swapped, upper) for B's two columns.
  const std::vector<float> b = {1, 0, 2, -1, 3, 1, 0, 4};  // [n, 2]
  auto bb = floats(b), bx = floats(std::vector<float>(n * 2, 0.0f));
  // X (bx, [n, 2]) solves M X = B, M given by its element (i, k).
  auto expectSolves = [&](const std::function<float(uint64_t, uint64_t)>& matrix, const char* what) {
    std::vector<float> x(n * 2);
    ASSERT_TRUE(device->read(*bx, 0, std::as_writable_bytes(std::span(x))));
    for (uint64_t i = 0; i < n; ++i)
      for (uint64_t c = 0; c < 2; ++c) {
        float v = 0;
        for (uint64_t k = 0; k < n; ++k) v += matrix(i, k) * x[k * 2 + c];
        EXPECT_NEAR(v, b[i * 2 + c], 1e-4f) << what << " at " << i << " " << c;
      }
  };
  auto mulCheck = [&](bool transposed, bool unit, const char* what) {
    expectSolves([&](uint64_t i, uint64_t k) { return unit && i == k ? 1.0f : transposed ? l[k * n + i] : l[i * n + k]; }, what);
  };
  auto solveOp = [&](std::vector<uint64_t> lStrides, float flags) {
    auto op = tensorOp(TensorFn::triangularSolve, {2, n, n},
                       {view(bx.get(), 0, {1, 2, 0}), view(bl.get(), 0, lStrides), view(bb.get(), 0, {1, 2, 0})});
    op.alpha = flags;
    return op;
  };
  ASSERT_TRUE(device->tensor(solveOp({0, n, 1}, 0)));
  mulCheck(false, false, "lower");
  ASSERT_TRUE(device->tensor(solveOp({0, 1, n}, 1)));
  mulCheck(true, false, "upper (the transpose)");
  ASSERT_TRUE(device->tensor(solveOp({0, n, 1}, 2)));
  mulCheck(false, true, "unit lower");

  // LU of [A; bad-but-singular]: A X = B from the factors, and P A = L U.
  std::vector<float> g = a;
  for (uint64_t j = 0; j < n; ++j) g[n * n + 3 * n + j] = g[n * n + 0 * n + j] + g[n * n + 1 * n + j];  // row 3 = row 0 + row 1
  auto bg = floats(g), lu = floats(std::vector<float>(2 * n * n, 0.0f));
  auto piv = bytes(2 * n * 8), linfo = bytes(2 * 8);
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::luFactor, {2, n, n},
                                      {view(lu.get(), 0, {n * n, n, 1}), view(bg.get(), 0, {n * n, n, 1}),
                                       view(piv.get(), 0, {n, 1, 0}, i64), view(linfo.get(), 0, {1, 0, 0}, i64)})));
  std::vector<float> f(2 * n * n);
  std::vector<int64_t> pivots(2 * n), linfos(2);
  ASSERT_TRUE(device->read(*lu, 0, std::as_writable_bytes(std::span(f))));
  ASSERT_TRUE(device->read(*piv, 0, std::as_writable_bytes(std::span(pivots))));
  ASSERT_TRUE(device->read(*linfo, 0, std::as_writable_bytes(std::span(linfos))));
  EXPECT_EQ(linfos[0], 0);
  EXPECT_GT(linfos[1], 0);
  std::vector<float> pa(a.begin(), a.begin() + n * n);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_GE(pivots[i], int64_t(i + 1));
    ASSERT_LE(pivots[i], int64_t(n));
    for (uint64_t j = 0; j < n; ++j) std::swap(pa[i * n + j], pa[(pivots[i] - 1) * n + j]);
  }
  for (uint64_t i = 0; i < n; ++i)
    for (uint64_t j = 0; j < n; ++j) {
      float v = 0;
      for (uint64_t k = 0; k <= std::min(i, j); ++k) v += (k == i ? 1.0f : f[i * n + k]) * f[k * n + j];
      EXPECT_NEAR(v, pa[i * n + j], 1e-4f * std::fabs(pa[i * n + j]) + 1e-4f) << "P A = L U at " << i << " " << j;
    }
  auto luSolve = [&] {
    return tensorOp(TensorFn::luSolve, {2, n, n}, {view(bx.get(), 0, {1, 2, 0}), view(lu.get(), 0, {0, n, 1}),
                                                  view(piv.get(), 0, {0, 1, 0}, i64), view(bb.get(), 0, {1, 2, 0})});
  };
  ASSERT_TRUE(device->tensor(luSolve()));
  expectSolves([&](uint64_t i, uint64_t k) { return a[i * n + k]; }, "A X = B");
  // A^T X = B from the same factors (alpha 1).
  auto transposedSolve = luSolve();
  transposedSolve.alpha = 1;
  ASSERT_TRUE(device->tensor(transposedSolve));
  expectSolves([&](uint64_t i, uint64_t k) { return a[k * n + i]; }, "A^T X = B");
  std::vector<float> x(n * 2);
  // A pivot that points before its row, or past the matrix: the columns become NaN.
  for (int64_t wrong : {int64_t{0}, int64_t{99}, std::numeric_limits<int64_t>::min()}) {
    ASSERT_TRUE(device->write(*piv, 8, std::as_bytes(std::span(&wrong, 1))));
    ASSERT_TRUE(device->tensor(luSolve()));
    ASSERT_TRUE(device->read(*bx, 0, std::as_writable_bytes(std::span(x))));
    for (float v : x) EXPECT_TRUE(std::isnan(v)) << wrong;
  }

  // Refusals: not square, past the bound, an info that overlaps the output.
  auto refusal = [&](const TensorOp& op) {
    auto r = device->tensor(op);
    return r ? std::string() : r.error().message;
  };
  EXPECT_NE(refusal(tensorOp(TensorFn::cholesky, {n, n - 1}, {view(bl.get(), 0, {n, 1}), view(ba.get(), 0, {n, 1}),
                                                               view(info.get(), 0, {0, 0}, i64)}))
                .find("square"),
            std::string::npos);
  auto big = bytes(513 * 513 * 4);
  EXPECT_NE(refusal(tensorOp(TensorFn::luFactor, {513, 513}, {view(big.get(), 0, {513, 1}), view(big.get(), 0, {513, 1}),
                                                                view(piv.get(), 0, {0, 0}, i64), view(linfo.get(), 0, {0, 0}, i64)}))
                .find("at most 512"),
            std::string::npos);
  EXPECT_NE(refusal(tensorOp(TensorFn::cholesky, {n, n}, {view(bl.get(), 0, {n, 1}), view(ba.get(), 0, {n, 1}),
                                                           view(bl.get(), 0, {0, 0}, i64)}))
                .find("overlaps"),
            std::string::npos);
}

// i32 as storage: copies to and from it are exact (i64 past 2^31 wraps, as PyTorch's
// conversion does), f32 converts truncating (past i32's range: F64F16AndBf16...); any
// other function refuses it.
TEST_P(Conformance, I32IsAStorageTypeForCopiesAlone) {
  const std::vector<int64_t> wide = {5, -7, (int64_t{1} << 31) + 3, -(int64_t{1} << 40) - 1, 0};
  const uint64_t n = wide.size();
  auto w = bytes(n * 8), narrow = bytes(n * 4), back = bytes(n * 8);
  auto reals = floats({2.9f, -3.9f, 1e3f, 0.0f, -0.5f});
  ASSERT_TRUE(device->write(*w, 0, std::as_bytes(std::span(wide))));
  const auto i32 = TensorType::i32, i64 = TensorType::i64;
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::copy, {n}, {view(narrow.get(), 0, {1}, i32), view(w.get(), 0, {1}, i64)})));
  std::vector<int32_t> got(n);
  ASSERT_TRUE(device->read(*narrow, 0, std::as_writable_bytes(std::span(got))));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], int32_t(uint32_t(uint64_t(wide[i])))) << i;
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::copy, {n}, {view(back.get(), 0, {1}, i64), view(narrow.get(), 0, {1}, i32)})));
  std::vector<int64_t> again(n);
  ASSERT_TRUE(device->read(*back, 0, std::as_writable_bytes(std::span(again))));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(again[i], int64_t(got[i])) << i;
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::copy, {n}, {view(narrow.get(), 0, {1}, i32), view(reals.get(), 0, {1})})));
  ASSERT_TRUE(device->read(*narrow, 0, std::as_writable_bytes(std::span(got))));
  EXPECT_EQ(got, (std::vector<int32_t>{2, -3, 1000, 0, 0}));
  auto f = floats(std::vector<float>(n, 0.0f));
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::copy, {n}, {view(f.get(), 0, {1}), view(narrow.get(), 0, {1}, i32)})));
  std::vector<float> fs(n);
  ASSERT_TRUE(device->read(*f, 0, std::as_writable_bytes(std::span(fs))));
  EXPECT_EQ(fs, (std::vector<float>{2, -3, 1000, 0, 0}));
  auto r = device->tensor(tensorOp(TensorFn::add, {n}, {view(back.get(), 0, {1}, i64), view(narrow.get(), 0, {1}, i32),
                                                        view(w.get(), 0, {1}, i64)}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("a storage type: copies, fills and picks alone"), std::string::npos) << r.error().message;
}

namespace {
// The conversions PyTorch's CPU makes, as references: f16 by the compiler's _Float16 (to
// nearest even), bf16 as c10::BFloat16 rounds, f64 and i64 by C++'s own (x86's).
uint16_t halfBits(float f) {
  if (std::isnan(f)) return uint16_t((std::bit_cast<uint32_t>(f) >> 16 & 0x8000u) | 0x7e00u);
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));
}
float fromHalf(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
uint16_t bfloatBits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return std::isnan(f) ? 0x7fc0 : uint16_t((u + ((u >> 16) & 1u) + 0x7fffu) >> 16);
}
int64_t truncated(double d) {
  return d >= -9223372036854775808.0 && d < 9223372036854775808.0 ? static_cast<int64_t>(d) : INT64_MIN;
}
// f32 values over every range a conversion treats apart: zeros, f16's and f32's
// subnormals, ties at each width, the largest finite values and past them, infinities;
// then random bit patterns (NaNs left out: their bits are checked apart).
std::vector<float> conversionProbes() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.5f, 65504.0f, 65520.0f, 65519.99f, 6.0e-8f, 2.98e-8f, 5.96e-8f,
                          1e-10f, -3e-5f, 6.1035156e-05f, 1.0009765625f, 1.00048828125f, 1.00146484375f, 3.0e38f,
                          1.17549435e-38f, 1e-45f, 16777217.0f, -2.5f, 255.5f, 1.00390625f, 1.005859375f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  uint32_t x = 12345;
  while (v.size() < 512) {
    x = x * 1664525u + 1013904223u;
    const float f = std::bit_cast<float>(x);
    if (!std::isnan(f)) v.push_back(f);
  }
  return v;
}
}  // namespace

// A float map over f16 or bf16 operands (any mix with f32) computes in f32 and rounds once
// into out's type: bit for bit what converting each operand to f32, mapping and rounding
// the f32 result gives; a fused scale applies in f32 too. Comparisons, integer functions
// and an f64 operand still refuse them.
TEST_P(Conformance, F16AndBf16MapsComputeInF32AndRoundOnce) {
  const auto f32 = TensorType::f32, f16 = TensorType::f16, bf16 = TensorType::bf16;
  const uint64_t n = 300;
  std::vector<float> xs(n), ys(n), zs(n);
  uint32_t r = 99;
  auto next = [&] { return (r = r * 1664525u + 1013904223u) >> 8; };
  for (uint64_t i = 0; i < n; ++i) {
    xs[i] = (float(next() % 60001) - 30000) / 7919.0f;
    ys[i] = 0.25f + float(next() % 40000) / 9973.0f;  // positive: a divisor
    zs[i] = (float(next() % 20001) - 10000) / 3331.0f;
  }
  auto bx = floats(xs), by = floats(ys), bz = floats(zs);
  // Each operand in each type, and its exact f32 value (the reference's operand).
  struct Held { std::unique_ptr<Buffer> typed, exact; };
  auto hold = [&](Buffer* from, TensorType t) {
    Held h{bytes(n * tensorTypeBytes(t)), bytes(n * 4)};
    EXPECT_TRUE(device->tensor(tensorOp(TensorFn::copy, {n}, {view(h.typed.get(), 0, {1}, t), view(from, 0, {1})})));
    EXPECT_TRUE(device->tensor(tensorOp(TensorFn::copy, {n}, {view(h.exact.get(), 0, {1}), view(h.typed.get(), 0, {1}, t)})));
    return h;
  };
  auto bits = [](float v, TensorType t) -> uint32_t {
    return t == TensorType::f16 ? halfBits(v) : t == TensorType::bf16 ? bfloatBits(v) : std::bit_cast<uint32_t>(v);
  };
  struct Case { TensorFn fn; unsigned inputs; float alpha, beta, preScale; };
  const std::vector<Case> cases = {{TensorFn::add, 2, 0.5f, 0, 1}, {TensorFn::mul, 2, 1, 0, 1},   {TensorFn::div, 2, 1, 0, 1},
                                   {TensorFn::exp, 1, 1, 0, 1},    {TensorFn::tanh, 1, 1, 0, 1},  {TensorFn::gelu, 1, 0, 0, 1},
                                   {TensorFn::addcdiv, 3, 0.3f, 0, 1}, {TensorFn::affine, 1, 0.9f, 0.1f, 1},
                                   {TensorFn::mul, 2, 1, 0, 0.999f}};
  const std::vector<std::array<TensorType, 4>> mixes = {
      {bf16, bf16, bf16, bf16}, {f16, f16, f16, f16}, {f32, bf16, f32, f16}, {bf16, f32, f32, f32}, {f16, bf16, f32, bf16}};
  // Over one, two and three dimensions (a card may pick another kernel for each).
  const std::vector<std::pair<std::vector<uint64_t>, std::vector<uint64_t>>> shapes = {
      {{n}, {1}}, {{10, 30}, {30, 1}}, {{3, 10, 10}, {100, 10, 1}}};
  for (const auto& mix : mixes) {
    for (const auto& [shape, strides] : shapes) {
      Held x = hold(bx.get(), mix[1]), y = hold(by.get(), mix[2]), z = hold(bz.get(), mix[3]);
      for (const auto& c : cases) {
        auto out = bytes(n * tensorTypeBytes(mix[0])), want = bytes(n * 4);
        auto run = [&](Buffer* o, TensorType ot, bool exact) {
          auto operand = [&](Held& h, TensorType t) {
            return exact ? view(h.exact.get(), 0, strides) : view(h.typed.get(), 0, strides, t);
          };
          TensorOp op = c.inputs == 1   ? tensorOp(c.fn, shape, {view(o, 0, strides, ot), operand(x, mix[1])})
                        : c.inputs == 2 ? tensorOp(c.fn, shape, {view(o, 0, strides, ot), operand(x, mix[1]), operand(y, mix[2])})
                                        : tensorOp(c.fn, shape, {view(o, 0, strides, ot), operand(x, mix[1]), operand(y, mix[2]),
                                                                 operand(z, mix[3])});
          op.alpha = c.alpha, op.beta = c.beta, op.preScale = c.preScale;
          auto done = device->tensor(op);
          ASSERT_TRUE(done) << tensorFnName(c.fn) << ": " << done.error().message;
        };
        run(out.get(), mix[0], false);
        run(want.get(), f32, true);
        const auto wanted = readFloats(*want, n);
        std::vector<uint32_t> got(n);
        std::vector<uint16_t> got16(n);
        if (mix[0] == f32) {
          const auto g = readFloats(*out, n);
          for (uint64_t i = 0; i < n; ++i) got[i] = std::bit_cast<uint32_t>(g[i]);
        } else {
          ASSERT_TRUE(device->read(*out, 0, std::as_writable_bytes(std::span(got16))));
          for (uint64_t i = 0; i < n; ++i) got[i] = got16[i];
        }
        // (exp, tanh and gelu: a card's vector and scalar forms of them may differ in f32's
        // last bits, gelu's by tens of ulps where 1 + erf cancels: within 1e-5 relative in
        // f32, within a unit of the last place in f16 and bf16)
        const bool library = c.fn == TensorFn::exp || c.fn == TensorFn::tanh || c.fn == TensorFn::gelu;
        for (uint64_t i = 0; i < n; ++i) {
          if (library && mix[0] == f32) {
            const float g = std::bit_cast<float>(got[i]);
            ASSERT_LE(std::fabs(g - wanted[i]), 1e-5f * std::max(std::fabs(wanted[i]), 1e-3f)) << tensorFnName(c.fn) << " at " << i;
            continue;
          }
          const uint32_t w = bits(wanted[i], mix[0]);
          ASSERT_LE(got[i] > w ? got[i] - w : w - got[i], library ? 1u : 0u)
              << tensorFnName(c.fn) << " into " << tensorTypeName(mix[0]) << " from " << tensorTypeName(mix[1]) << " over "
              << shape.size() << " dimensions at " << i
              << ": f32 " << wanted[i] << ", bits " << got[i] << " against " << w;
        }
      }
    }
  }
  // Still refused over them: a comparison, an integer function, an f64 operand.
  Held h = hold(bx.get(), bf16);
  auto flags = bytes(n), wide = bytes(n * 8);
  auto refused = [&](const TensorOp& op, const char* why) {
    auto done = device->tensor(op);
    ASSERT_FALSE(done) << why;
    EXPECT_NE(done.error().message.find("storage type"), std::string::npos) << done.error().message;
  };
  refused(tensorOp(TensorFn::lt, {n}, {view(flags.get(), 0, {1}, TensorType::boolean), view(h.typed.get(), 0, {1}, bf16),
                                       view(h.typed.get(), 0, {1}, bf16)}),
          "lt");
  refused(tensorOp(TensorFn::bitwiseAnd, {n}, {view(h.typed.get(), 0, {1}, bf16), view(h.typed.get(), 0, {1}, bf16),
                                               view(h.typed.get(), 0, {1}, bf16)}),
          "bitwiseAnd");
  refused(tensorOp(TensorFn::add, {n}, {view(wide.get(), 0, {1}, TensorType::f64), view(h.typed.get(), 0, {1}, bf16),
                                        view(h.typed.get(), 0, {1}, bf16)}),
          "an f64 out");
}

// f64, f16 and bf16 are storage types: a copy converts between them and every other type
// as PyTorch's CPU does (to nearest even; integers truncated), the same type is copied bit
// for bit, a fill rounds its value; any other function but the float maps (f16, bf16)
// refuses them.
TEST_P(Conformance, F64F16AndBf16ConvertAsPyTorchsCpu) {
  const auto f64 = TensorType::f64, f16 = TensorType::f16, bf16 = TensorType::bf16, i64 = TensorType::i64;
  const auto probes = conversionProbes();
  const uint64_t n = probes.size();
  auto src = floats(probes);
  auto wide = bytes(n * 8), half = bytes(n * 2), bhalf = bytes(n * 2), narrow = bytes(n * 4);
  auto copy = [&](Buffer* to, TensorType tt, Buffer* from, TensorType ft) {
    auto r = device->tensor(tensorOp(TensorFn::copy, {n}, {view(to, 0, {1}, tt), view(from, 0, {1}, ft)}));
    ASSERT_TRUE(r) << r.error().message;
  };
  auto read = [&]<typename T>(const Buffer& b, T) {
    std::vector<T> out(n);
    EXPECT_TRUE(device->read(b, 0, std::as_writable_bytes(std::span(out))));
    return out;
  };
  copy(wide.get(), f64, src.get(), TensorType::f32);
  copy(half.get(), f16, src.get(), TensorType::f32);
  copy(bhalf.get(), bf16, src.get(), TensorType::f32);
  const auto d = read(*wide, 0.0);
  const auto h = read(*half, uint16_t()), b = read(*bhalf, uint16_t());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::bit_cast<uint64_t>(d[i]), std::bit_cast<uint64_t>(double(probes[i]))) << i << " " << probes[i];
    EXPECT_EQ(h[i], halfBits(probes[i])) << i << " " << probes[i];
    EXPECT_EQ(b[i], bfloatBits(probes[i])) << i << " " << probes[i];
  }
  // Back to f32: f16 and bf16 exactly; f64 values between f32's, rounded.
  copy(narrow.get(), TensorType::f32, half.get(), f16);
  auto f = readFloats(*narrow, n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(f[i]), std::bit_cast<uint32_t>(fromHalf(h[i]))) << i;
  copy(narrow.get(), TensorType::f32, bhalf.get(), bf16);
  f = readFloats(*narrow, n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(f[i]), uint32_t(b[i]) << 16) << i;
  std::vector<double> between(n);
  for (size_t i = 0; i < n; ++i) between[i] = d[i] * (1.0 + 0x1p-25 * double(i % 5)) + (i % 7 == 0 ? 1e-310 : 0.0);
  between.push_back(1e300);
  between.push_back(-1e-300);
  between.push_back(3.4028235677973366e38);  // past the largest f32 by less than half an ulp: stays finite
  between.push_back(0x1p-150);               // half the least subnormal, a tie: to zero
  between.push_back(0x1.8p-149);             // a tie between 1 and 2 subnormal ulps: to 2
  const uint64_t m = between.size();
  auto wb = bytes(m * 8), nb = bytes(m * 4), hb = bytes(m * 2), ib = bytes(m * 8), back = bytes(m * 8);
  ASSERT_TRUE(device->write(*wb, 0, std::as_bytes(std::span(between))));
  auto copyM = [&](Buffer* to, TensorType tt, Buffer* from, TensorType ft) {
    auto r = device->tensor(tensorOp(TensorFn::copy, {m}, {view(to, 0, {1}, tt), view(from, 0, {1}, ft)}));
    ASSERT_TRUE(r) << r.error().message;
  };
  copyM(nb.get(), TensorType::f32, wb.get(), f64);
  copyM(hb.get(), f16, wb.get(), f64);
  copyM(ib.get(), i64, wb.get(), f64);
  std::vector<float> nf(m);
  std::vector<uint16_t> nh(m);
  std::vector<int64_t> ni(m);
  ASSERT_TRUE(device->read(*nb, 0, std::as_writable_bytes(std::span(nf))));
  ASSERT_TRUE(device->read(*hb, 0, std::as_writable_bytes(std::span(nh))));
  ASSERT_TRUE(device->read(*ib, 0, std::as_writable_bytes(std::span(ni))));
  for (size_t i = 0; i < m; ++i) {
    const volatile double x = between[i];
    const float want = static_cast<float>(x);
    EXPECT_EQ(std::bit_cast<uint32_t>(nf[i]), std::bit_cast<uint32_t>(want)) << i << " " << between[i];
    EXPECT_EQ(nh[i], halfBits(want)) << i;  // (through f32, as c10::Half(double) converts)
    EXPECT_EQ(ni[i], truncated(between[i])) << i << " " << between[i];
  }
  // i64 -> f64 rounds to nearest even past 2^53; f64 -> f64 is the bits, NaNs' payloads too.
  std::vector<int64_t> big = {0, -1, (int64_t{1} << 53) + 1, (int64_t{1} << 53) + 3, INT64_MAX, INT64_MIN, -(int64_t{1} << 60) - 5};
  auto bigs = bytes(big.size() * 8), bigd = bytes(big.size() * 8);
  ASSERT_TRUE(device->write(*bigs, 0, std::as_bytes(std::span(big))));
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::copy, {big.size()}, {view(bigd.get(), 0, {1}, f64), view(bigs.get(), 0, {1}, i64)})));
  std::vector<double> bd(big.size());
  ASSERT_TRUE(device->read(*bigd, 0, std::as_writable_bytes(std::span(bd))));
  for (size_t i = 0; i < big.size(); ++i) EXPECT_EQ(bd[i], static_cast<double>(big[i])) << i;
  const std::vector<uint64_t> nanBits = {0x7ff8000000000123ULL, 0xfff0000000000001ULL, 0x7ff0000000000000ULL};
  ASSERT_TRUE(device->write(*wb, 0, std::as_bytes(std::span(nanBits))));
  copyM(back.get(), f64, wb.get(), f64);
  std::vector<uint64_t> again(m);
  ASSERT_TRUE(device->read(*back, 0, std::as_writable_bytes(std::span(again))));
  for (size_t i = 0; i < nanBits.size(); ++i) EXPECT_EQ(again[i], nanBits[i]) << i;
  copyM(nb.get(), TensorType::f32, wb.get(), f64);
  ASSERT_TRUE(device->read(*nb, 0, std::as_writable_bytes(std::span(nf))));
  EXPECT_EQ(std::bit_cast<uint32_t>(nf[0]), 0x7fc00000u);  // x86's: quiet, the payload's top bits
  EXPECT_EQ(std::bit_cast<uint32_t>(nf[1]), 0xffc00000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(nf[2]), 0x7f800000u);
  // A fill rounds its (f32) value to the type; bool from f64 is "not zero".
  ASSERT_TRUE(device->tensor([&] {
    auto op = tensorOp(TensorFn::fill, {n}, {view(half.get(), 0, {1}, f16)});
    op.alpha = 1.00048828125f;  // a tie: to even, 1
    return op;
  }()));
  EXPECT_EQ(read(*half, uint16_t())[n - 1], 0x3c00);
  const std::vector<double> truths = {0.0, -0.0, 0.25, std::nan(""), -1e-320};
  auto tb = bytes(truths.size() * 8), bb = bytes(truths.size());
  ASSERT_TRUE(device->write(*tb, 0, std::as_bytes(std::span(truths))));
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::copy, {truths.size()}, {view(bb.get(), 0, {1}, TensorType::boolean), view(tb.get(), 0, {1}, f64)})));
  std::vector<uint8_t> bools(truths.size());
  ASSERT_TRUE(device->read(*bb, 0, std::as_writable_bytes(std::span(bools))));
  EXPECT_EQ(bools, (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  // Into i32 a float truncates; outside i32's range (NaN, infinities) the smallest, as x86's.
  const std::vector<double> edges = {3e9, -2147483648.9, 2147483647.9, std::nan(""), -1e20};
  const std::vector<float> fedges = {3e9f, -3e9f, std::numeric_limits<float>::infinity(), -2147483648.0f, 7.9f};
  auto eb = bytes(edges.size() * 8), fb = floats(fedges), i32b = bytes(edges.size() * 4);
  ASSERT_TRUE(device->write(*eb, 0, std::as_bytes(std::span(edges))));
  std::vector<int32_t> i32s(edges.size());
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::copy, {edges.size()}, {view(i32b.get(), 0, {1}, TensorType::i32), view(eb.get(), 0, {1}, f64)})));
  ASSERT_TRUE(device->read(*i32b, 0, std::as_writable_bytes(std::span(i32s))));
  EXPECT_EQ(i32s, (std::vector<int32_t>{INT32_MIN, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MIN}));
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::copy, {edges.size()}, {view(i32b.get(), 0, {1}, TensorType::i32), view(fb.get(), 0, {1})})));
  ASSERT_TRUE(device->read(*i32b, 0, std::as_writable_bytes(std::span(i32s))));
  EXPECT_EQ(i32s, (std::vector<int32_t>{INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, 7}));
  // indexSelect picks their elements' bits (NaNs' payloads too).
  const std::vector<int64_t> picks = {2, 0, 2, 1};
  auto pb = bytes(picks.size() * 8), picked = bytes(picks.size() * 8), hpicked = bytes(picks.size() * 2);
  ASSERT_TRUE(device->write(*pb, 0, std::as_bytes(std::span(picks))));
  ASSERT_TRUE(device->write(*wb, 0, std::as_bytes(std::span(nanBits))));
  auto pick = [&](Buffer* to, Buffer* from, TensorType t) {
    auto r = device->tensor(tensorOp(TensorFn::indexSelect, {1, picks.size(), 1, 3},
                                     {view(to, 0, {4, 1, 1, 0}, t), view(from, 0, {3, 0, 1, 1}, t), view(pb.get(), 0, {0, 1, 0, 0}, i64)}));
    ASSERT_TRUE(r) << r.error().message;
  };
  pick(picked.get(), wb.get(), f64);
  pick(hpicked.get(), bhalf.get(), bf16);  // (the f16 buffer holds one value since the fill)
  std::vector<uint64_t> pickedBits(picks.size());
  std::vector<uint16_t> pickedHalves(picks.size());
  ASSERT_TRUE(device->read(*picked, 0, std::as_writable_bytes(std::span(pickedBits))));
  ASSERT_TRUE(device->read(*hpicked, 0, std::as_writable_bytes(std::span(pickedHalves))));
  for (size_t i = 0; i < picks.size(); ++i) {
    EXPECT_EQ(pickedBits[i], nanBits[size_t(picks[i])]) << i;
    EXPECT_EQ(pickedHalves[i], b[size_t(picks[i])]) << i;
  }
  // (f16 and bf16 are operands of the float maps too: F16AndBf16MapsComputeInF32...)
  for (auto t : {f64, TensorType::i32}) {
    auto r = device->tensor(tensorOp(TensorFn::add, {n}, {view(wide.get(), 0, {1}, t), view(wide.get(), 0, {1}, t),
                                                          view(wide.get(), 0, {1}, t)}));
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("a storage type"), std::string::npos) << r.error().message;
  }
}

TEST_P(Conformance, TensorConversionsComparisonsSelectionsAndArgReductionsAreExact) {
  const int64_t big = int64_t{1} << 40;
  std::vector<int64_t> ints = {big, big + 1, -big - 3, 7, 0, -1};
  std::vector<float> reals = {-2.7f, 0.0f, 3.5f, -0.0f, 1e9f, 2.0f};
  const uint64_t n = ints.size();
  auto bytesOf = [&](auto& v) { return std::as_bytes(std::span(v)); };
  auto bi = bytes(n * 8), bi2 = bytes(n * 8), oi = bytes(n * 8), ob = bytes(n), ob2 = bytes(n), of = bytes(n * 4);
  auto bf = floats(reals);
  ASSERT_TRUE(device->write(*bi, 0, bytesOf(ints)));
  std::vector<int64_t> shifted = ints;
  shifted[1] -= 1;  // == ints[0]: differs from ints[1] only below f32's precision
  ASSERT_TRUE(device->write(*bi2, 0, bytesOf(shifted)));
  auto readInts = [&](const Buffer& b, size_t count) {
    std::vector<int64_t> v(count);
    EXPECT_TRUE(device->read(b, 0, std::as_writable_bytes(std::span(v))));
    return v;
  };
  auto readBools = [&](const Buffer& b, size_t count) {
    std::vector<uint8_t> v(count);
    EXPECT_TRUE(device->read(b, 0, std::as_writable_bytes(std::span(v))));
    return v;
  };
  auto run = [&](TensorOp op) {
    auto s = device->tensor(op);
    if (!s) ADD_FAILURE() << tensorFnName(op.fn) << ": " << s.error().message;
    return bool(s);
  };
  const auto i64 = TensorType::i64, boolean = TensorType::boolean;
  // An i64 copy reversed is exact; f32 to i64 truncates toward zero; to bool is != 0.
  auto s = device->tensor(tensorOp(TensorFn::copy, {3}, {view(oi.get(), 0, {1}, i64), view(bi.get(), 0, {2}, i64)}));
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(readInts(*oi, 3), (std::vector<int64_t>{ints[0], ints[2], ints[4]}));
  ASSERT_TRUE(run(tensorOp(TensorFn::copy, {n}, {view(oi.get(), 0, {1}, i64), view(bi.get(), 0, {1}, i64)})));
  EXPECT_EQ(readInts(*oi, n), ints);
  ASSERT_TRUE(run(tensorOp(TensorFn::copy, {n}, {view(oi.get(), 0, {1}, i64), view(bf.get(), 0, {1})})));
  EXPECT_EQ(readInts(*oi, n), (std::vector<int64_t>{-2, 0, 3, 0, 1000000000, 2}));
  ASSERT_TRUE(run(tensorOp(TensorFn::copy, {n}, {view(ob.get(), 0, {1}, boolean), view(bf.get(), 0, {1})})));
  EXPECT_EQ(readBools(*ob, n), (std::vector<uint8_t>{1, 0, 1, 0, 1, 1}));
  ASSERT_TRUE(run(tensorOp(TensorFn::copy, {n}, {view(of.get(), 0, {1}), view(ob.get(), 0, {1}, boolean)})));
  EXPECT_EQ(readFloats(*of, n), (std::vector<float>{1, 0, 1, 0, 1, 1}));
  ASSERT_TRUE(run(tensorOp(TensorFn::copy, {n}, {view(of.get(), 0, {1}), view(bi.get(), 0, {1}, i64)})));
  EXPECT_EQ(readFloats(*of, n)[3], 7.0f);
  auto fill = tensorOp(TensorFn::fill, {n}, {view(oi.get(), 0, {1}, i64)});
  fill.alpha = -5;
  ASSERT_TRUE(run(fill));
  EXPECT_EQ(readInts(*oi, n), std::vector<int64_t>(n, -5));
  // f32 values no i64 holds (NaN, infinities, 2^63 and past) become -2^63, as x86's
  // conversion gives PyTorch's CPU; -2^63 itself and -0.5 convert exactly.
  const float inf = std::numeric_limits<float>::infinity(), two63 = 9223372036854775808.0f;
  auto edgeReals = floats({std::numeric_limits<float>::quiet_NaN(), inf, -inf, two63, -two63, -0.5f});
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  ASSERT_TRUE(run(tensorOp(TensorFn::copy, {n}, {view(oi.get(), 0, {1}, i64), view(edgeReals.get(), 0, {1})})));
  EXPECT_EQ(readInts(*oi, n), (std::vector<int64_t>{lowest, lowest, lowest, lowest, lowest, 0}));
  fill.alpha = 1e30f;
  ASSERT_TRUE(run(fill));
  EXPECT_EQ(readInts(*oi, n), std::vector<int64_t>(n, lowest));

  // Comparisons: i64 exactly (ints[1] and shifted[1] differ by one past 2^40), f32 with
  // a broadcast scalar (-0 == 0; NaN compares unequal but for ne).
  const std::vector<std::pair<TensorFn, std::vector<uint8_t>>> intCases = {
      {TensorFn::eq, {1, 0, 1, 1, 1, 1}}, {TensorFn::ne, {0, 1, 0, 0, 0, 0}}, {TensorFn::lt, {0, 0, 0, 0, 0, 0}},
      {TensorFn::le, {1, 0, 1, 1, 1, 1}}, {TensorFn::gt, {0, 1, 0, 0, 0, 0}}, {TensorFn::ge, {1, 1, 1, 1, 1, 1}}};
  for (auto& [fn, want] : intCases) {
    ASSERT_TRUE(run(tensorOp(fn, {n}, {view(ob.get(), 0, {1}, boolean), view(bi.get(), 0, {1}, i64), view(bi2.get(), 0, {1}, i64)})));
    EXPECT_EQ(readBools(*ob, n), want) << tensorFnName(fn);
  }
  reals[5] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(device->write(*bf, 0, bytesOf(reals)));
  auto zero = floats({0.0f});
  const std::vector<std::pair<TensorFn, std::vector<uint8_t>>> realCases = {
      {TensorFn::eq, {0, 1, 0, 1, 0, 0}}, {TensorFn::ne, {1, 0, 1, 0, 1, 1}}, {TensorFn::lt, {1, 0, 0, 0, 0, 0}},
      {TensorFn::le, {1, 1, 0, 1, 0, 0}}, {TensorFn::gt, {0, 0, 1, 0, 1, 0}}, {TensorFn::ge, {0, 1, 1, 1, 1, 0}}};
  for (auto& [fn, want] : realCases) {
    ASSERT_TRUE(run(tensorOp(fn, {n}, {view(ob.get(), 0, {1}, boolean), view(bf.get(), 0, {1}), view(zero.get(), 0, {0})})));
    EXPECT_EQ(readBools(*ob, n), want) << tensorFnName(fn);
  }
  // where: a bool mask picks from f32 or i64 sides (one broadcast).
  ASSERT_TRUE(run(tensorOp(TensorFn::gt, {n}, {view(ob2.get(), 0, {1}, boolean), view(bf.get(), 0, {1}), view(zero.get(), 0, {0})})));
  auto minusOne = floats({-1.0f});
  ASSERT_TRUE(run(tensorOp(TensorFn::where, {n}, {view(of.get(), 0, {1}), view(ob2.get(), 0, {1}, boolean), view(bf.get(), 0, {1}),
                                                  view(minusOne.get(), 0, {0})})));
  EXPECT_EQ(readFloats(*of, n), (std::vector<float>{-1, -1, 3.5f, -1, 1e9f, -1}));
  ASSERT_TRUE(run(tensorOp(TensorFn::where, {n}, {view(oi.get(), 0, {1}, i64), view(ob2.get(), 0, {1}, boolean),
                                                  view(bi.get(), 0, {1}, i64), view(bi2.get(), 0, {1}, i64)})));
  EXPECT_EQ(readInts(*oi, n), (std::vector<int64_t>{big, big, -big - 3, 7, 0, -1}));

  // Integer add and mul, exact past 2^24; over bools, or and and.
  auto add = tensorOp(TensorFn::add, {n}, {view(oi.get(), 0, {1}, i64), view(bi.get(), 0, {1}, i64), view(bi2.get(), 0, {1}, i64)});
  add.alpha = -1;
  ASSERT_TRUE(run(add));
  EXPECT_EQ(readInts(*oi, n), (std::vector<int64_t>{0, 1, 0, 0, 0, 0}));
  ASSERT_TRUE(run(tensorOp(TensorFn::mul, {n}, {view(oi.get(), 0, {1}, i64), view(bi.get(), 0, {1}, i64), view(ob2.get(), 0, {1}, boolean)})));
  EXPECT_EQ(readInts(*oi, n), (std::vector<int64_t>{0, 0, -big - 3, 0, 0, 0}));
  ASSERT_TRUE(run(tensorOp(TensorFn::lt, {n}, {view(ob.get(), 0, {1}, boolean), view(bf.get(), 0, {1}), view(zero.get(), 0, {0})})));
  auto both = tensorOp(TensorFn::mul, {n}, {view(ob.get(), 0, {1}, boolean), view(ob.get(), 0, {1}, boolean), view(ob2.get(), 0, {1}, boolean)});
  ASSERT_TRUE(run(both));  // x < 0 and x > 0: never
  EXPECT_EQ(readBools(*ob, n), std::vector<uint8_t>(n, 0));
  ASSERT_TRUE(run(tensorOp(TensorFn::lt, {n}, {view(ob.get(), 0, {1}, boolean), view(bf.get(), 0, {1}), view(zero.get(), 0, {0})})));
  auto either = tensorOp(TensorFn::add, {n}, {view(ob.get(), 0, {1}, boolean), view(ob.get(), 0, {1}, boolean), view(ob2.get(), 0, {1}, boolean)});
  ASSERT_TRUE(run(either));  // x < 0 or x > 0: all but the zeros and the NaN
  EXPECT_EQ(readBools(*ob, n), (std::vector<uint8_t>{1, 0, 1, 0, 1, 0}));

  // An i64 sum (of i64s past 2^24, and of bools), exact.
  auto total = bytes(8);
  auto sum = tensorOp(TensorFn::sum, {n}, {view(total.get(), 0, {0}, i64), view(bi.get(), 0, {1}, i64)});
  sum.reduceMask = 1;
  ASSERT_TRUE(run(sum));
  EXPECT_EQ(readInts(*total, 1)[0], big + 1 - 3 + 7 + 0 - 1);
  sum.operands[1] = view(ob2.get(), 0, {1}, boolean);
  ASSERT_TRUE(run(sum));
  EXPECT_EQ(readInts(*total, 1)[0], 2);

  // amax/amin of i64s (past 2^24: exactly) and of bools, into the input's type, and
  // argmax/argmin of them (the first of equals); an i64 amax into f32 is refused.
  const auto held = readInts(*bi, n);
  const auto flags = readBools(*ob2, n);
  for (TensorFn fn : {TensorFn::amax, TensorFn::amin, TensorFn::argmax, TensorFn::argmin}) {
    const bool largest = fn == TensorFn::amax || fn == TensorFn::argmax, position = fn == TensorFn::argmax || fn == TensorFn::argmin;
    auto ext = tensorOp(fn, {n}, {view(total.get(), 0, {0}, i64), view(bi.get(), 0, {1}, i64)});
    ext.reduceMask = 1;
    ASSERT_TRUE(run(ext)) << tensorFnName(fn);
    const auto at = largest ? std::max_element(held.begin(), held.end()) : std::min_element(held.begin(), held.end());
    EXPECT_EQ(readInts(*total, 1)[0], position ? at - held.begin() : *at) << tensorFnName(fn);
    auto ofFlags = ext;
    ofFlags.operands[1] = view(ob2.get(), 0, {1}, boolean);
    if (!position) ofFlags.operands[0] = view(ob.get(), 0, {0}, boolean);
    ASSERT_TRUE(run(ofFlags)) << tensorFnName(fn);
    const auto flag = largest ? std::max_element(flags.begin(), flags.end()) : std::min_element(flags.begin(), flags.end());
    if (position) EXPECT_EQ(readInts(*total, 1)[0], flag - flags.begin()) << tensorFnName(fn);
    else EXPECT_EQ(readBools(*ob, 1)[0], *flag) << tensorFnName(fn);
  }
  // Past the i64 range an add, a product and abs wrap, as in two's complement.
  const int64_t top = std::numeric_limits<int64_t>::max(), bottom = std::numeric_limits<int64_t>::min();
  auto edges = bytes(3 * 8), wrapped = bytes(3 * 8);
  const std::vector<int64_t> extremes = {top, bottom, -5};
  ASSERT_TRUE(device->write(*edges, 0, bytesOf(extremes)));
  auto twice = tensorOp(TensorFn::add, {3}, {view(wrapped.get(), 0, {1}, i64), view(edges.get(), 0, {1}, i64), view(edges.get(), 0, {0}, i64)});
  twice.alpha = -2;  // x - 2 top, mod 2^64: -top; bottom + 2; -3
  ASSERT_TRUE(run(twice));
  EXPECT_EQ(readInts(*wrapped, 3), (std::vector<int64_t>{-top, bottom + 2, -3}));
  ASSERT_TRUE(run(tensorOp(TensorFn::abs, {3}, {view(wrapped.get(), 0, {1}, i64), view(edges.get(), 0, {1}, i64)})));
  EXPECT_EQ(readInts(*wrapped, 3), (std::vector<int64_t>{top, bottom, 5}));
  // i64 division: the floor quotient and the truncated remainder over every sign, past
  // 2^53, by 0 (0, defined) and the smallest over -1 (itself, remainder 0: no trap).
  const std::vector<int64_t> dividends = {7, -7, 7, -7, 6, -6, (int64_t{1} << 60) + 3, 5, bottom, bottom, top};
  const std::vector<int64_t> divisors = {2, 2, -2, -2, 3, -3, 7, 0, -1, 3, -1};
  const size_t q = dividends.size();
  auto num = bytes(q * 8), den = bytes(q * 8), quot = bytes(q * 8);
  ASSERT_TRUE(device->write(*num, 0, bytesOf(dividends)));
  ASSERT_TRUE(device->write(*den, 0, bytesOf(divisors)));
  for (TensorFn fn : {TensorFn::div, TensorFn::fmod}) {
    ASSERT_TRUE(run(tensorOp(fn, {q}, {view(quot.get(), 0, {1}, i64), view(num.get(), 0, {1}, i64), view(den.get(), 0, {1}, i64)})))
        << tensorFnName(fn);
    std::vector<int64_t> want;
    for (size_t i = 0; i < q; ++i) {
      const int64_t x = dividends[i], y = divisors[i];
      const bool plain = y != 0 && y != -1;
      const int64_t mod = plain ? x % y : 0;
      const int64_t floorDiv = y == 0 ? 0 : y == -1 ? int64_t(0 - uint64_t(x)) : x / y - (mod != 0 && (x < 0) != (y < 0));
      want.push_back(fn == TensorFn::div ? floorDiv : mod);
    }
    EXPECT_EQ(readInts(*quot, q), want) << tensorFnName(fn);
  }
  EXPECT_EQ(readInts(*quot, 4), (std::vector<int64_t>{1, -1, 1, -1}));  // fmod: the dividend's sign
  auto mixed = device->tensor(tensorOp(TensorFn::div, {n}, {view(quot.get(), 0, {1}, i64), view(num.get(), 0, {1}, i64), view(bf.get(), 0, {1})}));
  ASSERT_FALSE(mixed);
  EXPECT_NE(mixed.error().message.find("an integer division is i64"), std::string::npos) << mixed.error().message;

  auto intoReals = tensorOp(TensorFn::amax, {n}, {view(bf.get(), 0, {0}), view(bi.get(), 0, {1}, i64)});
  intoReals.reduceMask = 1;
  auto refused = device->tensor(intoReals);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("the input's type"), std::string::npos) << refused.error().message;

  // amax/amin/argmax/argmin over rows of a 3 x 4 (ties: the first; a NaN wins both), and
  // argmax over every element (the flat position).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> m = {1, 5, 5, -2, /**/ 0, nan, 9, -9, /**/ -1, -1, -3, -3};
  auto bm = floats(m);
  auto values = bytes(3 * 4), positions = bytes(4 * 8);
  auto reduce = [&](TensorFn fn, Buffer* out, TensorType type) {
    auto op = tensorOp(fn, {3, 4}, {view(out, 0, {1, 0}, type), view(bm.get(), 0, {4, 1})});
    op.reduceMask = 2;
    return op;
  };
  ASSERT_TRUE(run(reduce(TensorFn::amax, values.get(), TensorType::f32)));
  auto got = readFloats(*values, 3);
  EXPECT_EQ(got[0], 5.0f);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[2], -1.0f);
  ASSERT_TRUE(run(reduce(TensorFn::amin, values.get(), TensorType::f32)));
  got = readFloats(*values, 3);
  EXPECT_EQ(got[0], -2.0f);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[2], -3.0f);
  ASSERT_TRUE(run(reduce(TensorFn::argmax, positions.get(), i64)));
  EXPECT_EQ(readInts(*positions, 3), (std::vector<int64_t>{1, 1, 0}));
  ASSERT_TRUE(run(reduce(TensorFn::argmin, positions.get(), i64)));
  EXPECT_EQ(readInts(*positions, 3), (std::vector<int64_t>{3, 1, 2}));
  m[5] = 0;
  ASSERT_TRUE(device->write(*bm, 0, bytesOf(m)));
  auto all = tensorOp(TensorFn::argmax, {3, 4}, {view(positions.get(), 0, {0, 0}, i64), view(bm.get(), 0, {4, 1})});
  all.reduceMask = 3;
  ASSERT_TRUE(run(all));
  EXPECT_EQ(readInts(*positions, 1)[0], 6);
  // Over columns: the reduced dimension is walked through a transposed view.
  auto cols = tensorOp(TensorFn::argmin, {4, 3}, {view(positions.get(), 0, {1, 0}, i64), view(bm.get(), 0, {1, 4})});
  cols.reduceMask = 2;
  ASSERT_TRUE(run(cols));
  EXPECT_EQ(readInts(*positions, 4), (std::vector<int64_t>{2, 2, 2, 1}));
}

// The same over rows of 37 (an OpenCL CPU card's vector kernels: two blocks of 16 and a
// tail), with a leading dimension of 2: out[e, j, c] = table[e, index[e, j], c], NaN for
// a pick outside the table; then out[e, r, c] = 0.5 (the sum of grad[e, i, c] over the
// positions i that picked r, in their order) + 2 out, the padding row's sum 0.
TEST_P(Conformance, AnEmbeddingOfWideRowsPicksAndSumsRowByRow) {
  const uint64_t E = 2, rows = 5, dim = 37, picks = 6;
  auto table = randomFloats(E * rows * dim, 23), grad = randomFloats(E * picks * dim, 24), start = randomFloats(E * rows * dim, 25);
  const std::vector<int64_t> index = {4, 0, 4, 2, 7, -1, 1, 1, 3, 0, 2, 4};  // [E, picks]; 7 and -1 outside [0, 5)
  auto bt = floats(table), bg = floats(grad), out = floats(std::vector<float>(E * picks * dim)), sums = floats(start);
  auto bi = device->allocate(index.size() * 8);
  ASSERT_TRUE(bi);
  ASSERT_TRUE(device->write(**bi, 0, std::as_bytes(std::span(index))));
  auto pick = tensorOp(TensorFn::indexSelect, {E, picks, dim, rows},
                       {view(out.get(), 0, {picks * dim, dim, 1, 0}), view(bt.get(), 0, {rows * dim, 0, 1, dim}),
                        view(bi->get(), 0, {picks, 1, 0, 0}, TensorType::i64)});
  auto s = device->tensor(pick);
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  auto got = readFloats(*out, E * picks * dim);
  for (uint64_t e = 0; e < E; ++e)
    for (uint64_t j = 0; j < picks; ++j)
      for (uint64_t c = 0; c < dim; ++c) {
        const int64_t r = index[e * picks + j];
        const float v = got[(e * picks + j) * dim + c];
        if (r < 0 || r >= int64_t(rows)) ASSERT_TRUE(std::isnan(v)) << e << "," << j << "," << c;
        else ASSERT_EQ(v, table[(e * rows + r) * dim + c]) << e << "," << j << "," << c;
      }
  // Shape [E, dim, rows, picks]: the leading dimension, the columns, the rows summed
  // into, the positions; row 2 the padding.
  auto back = tensorOp(TensorFn::indexAdd, {E, dim, rows, picks},
                       {view(sums.get(), 0, {rows * dim, 1, dim, 0}), view(bg.get(), 0, {picks * dim, 1, 0, dim}),
                        view(bi->get(), 0, {picks, 0, 0, 1}, TensorType::i64)});
  back.ignoreIndex = 2;
  back.alpha = 0.5f, back.beta = 2;
  ASSERT_TRUE(device->tensor(back));
  auto w = readFloats(*sums, E * rows * dim);
  for (uint64_t e = 0; e < E; ++e)
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t c = 0; c < dim; ++c) {
        float sum = 0;
        for (uint64_t i = 0; i < picks; ++i)
          if (index[e * picks + i] == int64_t(r) && r != 2) sum += grad[(e * picks + i) * dim + c];
        const float want = 0.5f * sum + 2 * start[(e * rows + r) * dim + c];
        ASSERT_NEAR(w[(e * rows + r) * dim + c], want, 1e-6f * std::max(1.0f, std::fabs(want))) << e << "," << r << "," << c;
      }
}

// Embeddings: rows picked by an i64 index (forward), and each row's gradient summed over
// the positions that picked it (backward), the padding row left 0.
TEST_P(Conformance, TensorIndexSelectAndEmbeddingBackwardMatchReference) {
  const uint64_t rows = 5, dim = 3, picks = 6;
  auto table = randomFloats(rows * dim, 21);
  std::vector<int64_t> index = {4, 0, 4, 2, 7, -1};  // the last two outside [0, 5)
  auto bt = floats(table), out = floats(std::vector<float>(picks * dim));
  auto bi = device->allocate(picks * 8);
  ASSERT_TRUE(bi);
  ASSERT_TRUE(device->write(**bi, 0, std::as_bytes(std::span(index))));
  // out[j, c] = table[index[j], c]: shape [1, picks, dim, rows].
  auto pick = tensorOp(TensorFn::indexSelect, {1, picks, dim, rows},
                       {view(out.get(), 0, {0, dim, 1, 0}), view(bt.get(), 0, {0, 0, 1, dim}), view(bi->get(), 0, {0, 1, 0, 0}, TensorType::i64)});
  auto s = device->tensor(pick);
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  auto got = readFloats(*out, picks * dim);
  for (uint64_t j = 0; j < picks; ++j)
    for (uint64_t c = 0; c < dim; ++c) {
      if (index[j] < 0 || index[j] >= int64_t(rows)) EXPECT_TRUE(std::isnan(got[j * dim + c])) << j;
      else EXPECT_EQ(got[j * dim + c], table[index[j] * dim + c]) << j << "," << c;
    }
  // A gather along dimension 0 (the index has the output's shape): out[j, c] =
  // table[picks[j, c], c].
  std::vector<int64_t> picks2 = {4, 0, 2, 1, 1, 3};
  auto bp = device->allocate(6 * 8), gathered = device->allocate(6 * 4);
  ASSERT_TRUE(bp && gathered);
  ASSERT_TRUE(device->write(**bp, 0, std::as_bytes(std::span(picks2))));
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::indexSelect, {2, dim, rows},
                                      {view(gathered->get(), 0, {dim, 1, 0}), view(bt.get(), 0, {0, 1, dim}),
                                       view(bp->get(), 0, {dim, 1, 0}, TensorType::i64)})));
  auto g2 = readFloats(**gathered, 6);
  for (uint64_t j = 0; j < 2; ++j)
    for (uint64_t c = 0; c < dim; ++c) EXPECT_EQ(g2[j * dim + c], table[picks2[j * dim + c] * dim + c]) << j << "," << c;
  // The backward over the first four positions, row 2 the padding.
  const uint64_t n = 4;
  auto grad = randomFloats(n * dim, 22);
  auto bg = floats(grad), gw = floats(std::vector<float>(rows * dim, 9));
  // (shape [dim, rows, n]: the columns, then the rows summed into, then the positions)
  auto back = tensorOp(TensorFn::indexAdd, {dim, rows, n},
                       {view(gw.get(), 0, {1, dim, 0}), view(bg.get(), 0, {1, 0, dim}), view(bi->get(), 0, {0, 0, 1}, TensorType::i64)});
  back.ignoreIndex = 2;
  ASSERT_TRUE(device->tensor(back));
  auto w = readFloats(*gw, rows * dim);
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < dim; ++c) {
      float want = 0;
      for (uint64_t i = 0; i < n; ++i)
        if (index[i] == int64_t(r) && r != 2) want += grad[i * dim + c];
      EXPECT_NEAR(w[r * dim + c], want, 1e-6) << r << "," << c;
    }
  // scatter_add along dimension 0, onto what is there: out[picks2[i, c], c] += 2 a[i, c]
  // (an index per column; ignoreIndex -1: no padding row).
  auto scatter = tensorOp(TensorFn::indexAdd, {dim, rows, 2},
                          {view(gw.get(), 0, {1, dim, 0}), view(bg.get(), 0, {1, 0, dim}), view(bp->get(), 0, {1, 0, dim}, TensorType::i64)});
  scatter.ignoreIndex = -1, scatter.alpha = 2, scatter.beta = 1;
  ASSERT_TRUE(device->tensor(scatter));
  auto w2 = readFloats(*gw, rows * dim);
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < dim; ++c) {
      float want = w[r * dim + c];
      for (uint64_t i = 0; i < 2; ++i)
        if (picks2[i * dim + c] == int64_t(r)) want += 2 * grad[i * dim + c];
      EXPECT_NEAR(w2[r * dim + c], want, 1e-6) << r << "," << c;
    }
  // Operands of one buffer are told apart by bytes, not elements: six f32 outputs in
  // bytes 0-23 and an i64 index of two in bytes 24-39 (its element 3) do not overlap.
  {
    auto shared = device->allocate(40);
    ASSERT_TRUE(shared);
    std::vector<int64_t> two = {1, 4};
    ASSERT_TRUE(device->write(**shared, 24, std::as_bytes(std::span(two))));
    auto op = [&](uint64_t indexAt) {
      return tensorOp(TensorFn::indexAdd, {6, 2}, {view(shared->get(), 0, {1, 0}), view(bg.get(), 0, {0, 1}),
                                                   view(shared->get(), indexAt, {0, 1}, TensorType::i64)});
    };
    auto apart = op(3);
    apart.ignoreIndex = -1;
    ASSERT_TRUE(device->tensor(apart));
    auto six = readFloats(**shared, 6);
    EXPECT_EQ(six, (std::vector<float>{0, grad[0], 0, 0, grad[1], 0}));
    auto s = device->tensor(op(2));  // bytes 16-31: inside the output's
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("overlaps"), std::string::npos) << s.error().message;
  }
  // An i64 table picks exactly.
  std::vector<int64_t> wide = {int64_t{1} << 50, 3, -(int64_t{1} << 40)};
  auto bw = device->allocate(3 * 8), wo = device->allocate(2 * 8);
  ASSERT_TRUE(bw && wo);
  ASSERT_TRUE(device->write(**bw, 0, std::as_bytes(std::span(wide))));
  ASSERT_TRUE(device->tensor(tensorOp(TensorFn::indexSelect, {1, 2, 1, 3},
                                      {view(wo->get(), 0, {0, 1, 0, 0}, TensorType::i64), view(bw->get(), 0, {0, 0, 0, 1}, TensorType::i64),
                                       view(bi->get(), 2, {0, 1, 0, 0}, TensorType::i64)})));  // index {4, 2}: 4 is outside
  std::vector<int64_t> back2(2);
  ASSERT_TRUE(device->read(**wo, 0, std::as_writable_bytes(std::span(back2))));
  EXPECT_EQ(back2, (std::vector<int64_t>{0, -(int64_t{1} << 40)}));
}

// Convolution's column gathers: im2col (one pick per column element, -1 where the window
// lies in the padding) and col2im (each input position summing the column elements its
// windows put it in), against direct loops over the windows; cut into slices, the same.
// (30 outputs a window element: an OpenCL CPU card's im2col as vectors of 16, and a rest.)
TEST_P(Conformance, TensorGatherSumIsIm2colAndCol2im) {
  const int64_t n = 2, c = 3, h = 9, w = 5, kh = 3, kw = 2, sh = 2, sw = 1, ph = 1, pw = 1;
  const int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1, kk = kh * kw, ohw = oh * ow, hw = h * w;
  // The input position window element (i, j) of output (y, x) reads, or -1.
  auto source = [&](int64_t i, int64_t j, int64_t y, int64_t x) -> int64_t {
    const int64_t r = y * sh - ph + i, q = x * sw - pw + j;
    return r < 0 || r >= h || q < 0 || q >= w ? -1 : r * w + q;
  };
  std::vector<int64_t> forward(kk * ohw);
  std::vector<std::vector<int64_t>> holders(hw);
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          const int64_t col = (i * kw + j) * ohw + y * ow + x, at = source(i, j, y, x);
          forward[col] = at;
          if (at >= 0) holders[at].push_back(col);
        }
  size_t picks = 0;
  for (auto& v : holders) picks = std::max(picks, v.size());
  std::vector<int64_t> backward(hw * picks, -1);
  for (int64_t p = 0; p < hw; ++p) std::copy(holders[p].begin(), holders[p].end(), backward.begin() + p * picks);
  auto index = [&](const std::vector<int64_t>& v) {
    auto b = device->allocate(v.size() * 8);
    EXPECT_TRUE(b && device->write(**b, 0, std::as_bytes(std::span(v))));
    return std::move(*b);
  };
  auto bf = index(forward), bk = index(backward);
  auto x = randomFloats(n * c * hw, 31);
  auto bx = floats(x), cols = floats(std::vector<float>(c * kk * n * ohw));
  // cols [c, kk, n, ohw] = x[n, c, forward[kk, ohw]]: shape [c, kk, n, ohw, 1, hw].
  auto im2col = tensorOp(TensorFn::gatherSum, {uint64_t(c), uint64_t(kk), uint64_t(n), uint64_t(ohw), 1, uint64_t(hw)},
                         {view(cols.get(), 0, {uint64_t(kk * n * ohw), uint64_t(n * ohw), uint64_t(ohw), 1, 0, 0}),
                          view(bx.get(), 0, {uint64_t(hw), 0, uint64_t(c * hw), 0, 0, 1}),
                          view(bf.get(), 0, {0, uint64_t(ohw), 0, 1, 0, 0}, TensorType::i64)});
  auto s = device->tensor(im2col);
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  auto got = readFloats(*cols, cols->size() / 4);
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t e = 0; e < kk; ++e)
      for (int64_t ni = 0; ni < n; ++ni)
        for (int64_t o = 0; o < ohw; ++o) {
          const int64_t at = source(e / kw, e % kw, o / ow, o % ow);
          EXPECT_EQ(got[((ci * kk + e) * n + ni) * ohw + o], at < 0 ? 0.0f : x[(ni * c + ci) * hw + at]) << ci << "," << e << "," << o;
        }
  // col2im of columns laid out [n, c, kk * ohw]: out[n, c, p] = 2 * out + 0.5 * the sum
  // of the column elements whose windows read p. Shape [n, c, hw, picks, kk * ohw].
  auto g = randomFloats(n * c * kk * ohw, 32), start = randomFloats(n * c * hw, 33);
  auto bg = floats(g);
  auto col2im = [&](Buffer* out) {
    auto op = tensorOp(TensorFn::gatherSum, {uint64_t(n), uint64_t(c), uint64_t(hw), picks, uint64_t(kk * ohw)},
                       {view(out, 0, {uint64_t(c * hw), uint64_t(hw), 1, 0, 0}),
                        view(bg.get(), 0, {uint64_t(c * kk * ohw), uint64_t(kk * ohw), 0, 0, 1}),
                        view(bk.get(), 0, {0, 0, picks, 1, 0}, TensorType::i64)});
    op.alpha = 0.5f, op.beta = 2;
    return op;
  };
  auto whole = floats(start), sliced = floats(start);
  ASSERT_TRUE(device->tensor(col2im(whole.get())));
  auto slices = sliceTensor(col2im(sliced.get()), double(hw * picks));  // one plane a slice
  EXPECT_EQ(slices->total(), uint64_t(n * c));
  for (bool done = false; !done;) {
    auto r = slices->runNext(*device);
    ASSERT_TRUE(r) << r.error().message;
    done = *r;
  }
  std::vector<double> want(start.begin(), start.end());
  for (auto& v : want) v *= 2;
  for (int64_t ni = 0; ni < n; ++ni)
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t e = 0; e < kk; ++e)
        for (int64_t o = 0; o < ohw; ++o)
          if (int64_t at = source(e / kw, e % kw, o / ow, o % ow); at >= 0)
            want[(ni * c + ci) * hw + at] += 0.5 * g[((ni * c + ci) * kk + e) * ohw + o];
  auto gw = readFloats(*whole, want.size()), gs = readFloats(*sliced, want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(gw[i], want[i], 1e-5) << i;
    EXPECT_EQ(gs[i], gw[i]) << i;
  }
}

// Max pooling over overlapping, dilated windows (3 x 2, stride 2 x 1, dilation 1 x 2) of
// a [2, 3, 9, 7] input with ties, -inf windows and NaNs: each window's largest element and
// its index h * W + w as PyTorch's CPU kernel picks them (the first of equals, the last
// NaN), whole and cut into one slice a plane; the backward sums each output's gradient at
// its index (overlapping windows pick some positions twice), over a plane it first sets to
// 0, an index outside the plane adding nowhere.
TEST_P(Conformance, TensorMaxPoolAndItsBackwardMatchReference) {
  const int64_t n = 2, c = 3, h = 9, w = 7, kh = 3, kw = 2, sh = 2, sw = 1, dh = 1, dw = 2;
  const int64_t oh = (h - dh * (kh - 1) - 1) / sh + 1, ow = (w - dw * (kw - 1) - 1) / sw + 1, hw = h * w, ohw = oh * ow;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto x = randomFloats(n * c * hw, 41);
  for (auto& v : x) v = std::round(v * 2) / 2;  // ties
  for (int64_t i = 0; i < hw; ++i) x[hw + i] = -inf;  // plane 1: every window -inf
  x[2 * hw + 3] = nan, x[2 * hw + 5] = nan;  // plane 2: two NaNs in one window
  x[3 * hw + 20] = nan;
  auto ux = [](int64_t v) { return uint64_t(v); };
  auto bx = floats(x), values = floats(std::vector<float>(n * c * ohw, 7)), sliced = floats(std::vector<float>(n * c * ohw));
  auto index = [&] {
    auto b = device->allocate(n * c * ohw * 8);
    EXPECT_TRUE(b);
    return std::move(*b);
  };
  auto bi = index(), bis = index();
  auto pool = [&](Buffer* out, Buffer* idx) {
    return tensorOp(TensorFn::maxPool2d, {ux(n), ux(c), ux(oh), ux(ow), ux(kh), ux(kw)},
                    {view(out, 0, {ux(c * ohw), ux(ohw), ux(ow), 1, 0, 0}),
                     view(bx.get(), 0, {ux(c * hw), ux(hw), ux(sh * w), ux(sw), ux(dh * w), ux(dw)}),
                     view(idx, 0, {ux(c * ohw), ux(ohw), ux(ow), 1, 0, 0}, TensorType::i64)});
  };
  auto s = device->tensor(pool(values.get(), bi.get()));
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  auto slices = sliceTensor(pool(sliced.get(), bis.get()), double(ohw * kh * kw));  // a plane a slice
  EXPECT_EQ(slices->total(), uint64_t(n * c));
  for (bool done = false; !done;) {
    auto r = slices->runNext(*device);
    ASSERT_TRUE(r) << r.error().message;
    done = *r;
  }
  auto readInts = [&](const Buffer& b) {
    std::vector<int64_t> v(n * c * ohw);
    EXPECT_TRUE(device->read(b, 0, std::as_writable_bytes(std::span(v))));
    return v;
  };
  auto gv = readFloats(*values, n * c * ohw), gs = readFloats(*sliced, n * c * ohw);
  auto gi = readInts(*bi), gis = readInts(*bis);
  std::vector<int64_t> want(n * c * ohw);
  for (int64_t p = 0; p < n * c; ++p)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t q = 0; q < ow; ++q) {
        float best = -inf;
        int64_t at = (y * sh) * w + q * sw;
        for (int64_t i = 0; i < kh; ++i)
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t pos = (y * sh + i * dh) * w + q * sw + j * dw;
            const float v = x[p * hw + pos];
            if (v > best || std::isnan(v)) best = v, at = pos;
          }
        const int64_t o = p * ohw + y * ow + q;
        want[o] = at;
        EXPECT_EQ(gi[o], at) << "plane " << p << " output " << y << "," << q;
        EXPECT_EQ(gis[o], at) << "sliced: plane " << p << " output " << y << "," << q;
        if (std::isnan(best)) {
          EXPECT_TRUE(std::isnan(gv[o]) && std::isnan(gs[o])) << o;
        } else {
          EXPECT_EQ(gv[o], best) << o;
          EXPECT_EQ(gs[o], best) << o;
        }
      }
  // The backward, with two indices no forward makes (-1 and the plane's size).
  want[4] = -1, want[(n * c - 1) * ohw + 2] = hw;  // the last plane's: one past its end
  ASSERT_TRUE(device->write(*bi, 0, std::as_bytes(std::span(want))));
  auto g = randomFloats(n * c * ohw, 42);
  auto bg = floats(g), gin = floats(std::vector<float>(n * c * hw + 8, 9));  // 8 past the planes, kept
  auto back = tensorOp(TensorFn::maxPool2dBackward, {ux(n), ux(c), ux(oh), ux(ow), ux(h), ux(w)},
                       {view(gin.get(), 0, {ux(c * hw), ux(hw), 0, 0, ux(w), 1}),
                        view(bg.get(), 0, {ux(c * ohw), ux(ohw), ux(ow), 1, 0, 0}),
                        view(bi.get(), 0, {ux(c * ohw), ux(ohw), ux(ow), 1, 0, 0}, TensorType::i64)});
  ASSERT_TRUE(device->tensor(back));
  std::vector<float> wantIn(n * c * hw, 0);
  for (int64_t p = 0; p < n * c; ++p)
    for (int64_t o = 0; o < ohw; ++o)
      if (want[p * ohw + o] >= 0 && want[p * ohw + o] < hw) wantIn[p * hw + want[p * ohw + o]] += g[p * ohw + o];
  wantIn.resize(n * c * hw + 8, 9);
  auto got = readFloats(*gin, wantIn.size());
  for (size_t i = 0; i < wantIn.size(); ++i) EXPECT_EQ(got[i], wantIn[i]) << i;

  // What the kernels could not keep inside their buffers, or would read while writing.
  auto refused = [&](TensorOp op, const char* says) {
    auto r = device->tensor(op);
    ASSERT_FALSE(r) << says;
    EXPECT_EQ(r.error().code, Code::invalidArgument);
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
  };
  auto roomy = floats(std::vector<float>(4 * n * c * hw));  // room for the strides below
  auto op = pool(values.get(), bi.get());
  op.operands[2].type = TensorType::f32;
  refused(op, "the index is i64");
  op = pool(roomy.get(), bi.get());
  op.operands[0].strides[5] = 1;
  refused(op, "strides over kh and kw must be 0");
  op = pool(values.get(), bx.get());  // the index written over the input
  refused(op, "overlaps");
  op = pool(values.get(), bi.get());
  op.dims = 3;
  refused(op, "4 to 6 dimensions");
  auto bad = back;
  bad.operands[0].buffer = roomy.get();
  bad.operands[0].strides[2] = 1;
  refused(bad, "the output's strides over oh and ow must be 0");
  bad = back;
  bad.operands[1].buffer = roomy.get();
  bad.operands[1].strides[4] = 1;
  refused(bad, "grad's strides over h and w must be 0");
  // Shapes whose products overflow, or whose work-items would walk without end.
  const uint64_t huge = uint64_t{1} << 40;
  op = pool(values.get(), bi.get());
  for (unsigned d = 0; d < 6; ++d) op.shape[d] = huge;
  refused(op, "more than 2^48 elements");
  op = pool(values.get(), bi.get());
  op.shape[0] = op.shape[1] = 1, op.shape[3] = uint64_t{1} << 20, op.shape[4] = op.shape[5] = 8;
  refused(op, "rows of windows of more than 2^24 elements");
  bad = back;
  bad.shape[0] = bad.shape[1] = 1, bad.shape[4] = bad.shape[5] = uint64_t{1} << 13;
  refused(bad, "planes of more than 2^24 elements");
  bad = back;
  bad.dims = 4;
  for (unsigned d = 0; d < 4; ++d) bad.shape[d] = uint64_t{1} << 7;
  for (auto& o : bad.operands) std::copy(o.strides.begin() + 2, o.strides.end(), o.strides.begin());
  refused(bad, "one plane of more than 2^24 elements");
}

// Counter-based random numbers: the same key draws the same numbers (whole or sliced, at
// any offset from its origin), another key others, and their distributions are the ones asked for.
TEST_P(Conformance, TensorRandomNumbersAreReproduciblePerKeyAndDistributedAsAsked) {
  const uint64_t n = 20000;
  auto a = floats(std::vector<float>(n)), b = floats(std::vector<float>(n));
  auto draw = [&](TensorFn fn, Buffer* out, int64_t key, float alpha, float beta) {
    auto op = tensorOp(fn, {n}, {view(out, 0, {1})});
    op.ignoreIndex = key, op.alpha = alpha, op.beta = beta;
    return op;
  };
  auto s = device->tensor(draw(TensorFn::uniform, a.get(), 42, -1, 3));
  if (!s && s.error().code == Code::unimplemented) GTEST_SKIP() << s.error().message;
  ASSERT_TRUE(s) << s.error().message;
  auto slices = sliceTensor(draw(TensorFn::uniform, b.get(), 42, -1, 3), 999);
  for (bool done = false; !done;) {
    auto r = slices->runNext(*device);
    ASSERT_TRUE(r) << r.error().message;
    done = *r;
  }
  auto x = readFloats(*a, n), y = readFloats(*b, n);
  EXPECT_EQ(x, y);  // sliced or whole, one key draws the same numbers
  // And wherever the output lies: counted from its origin (drawOrigin), the same ones.
  const uint64_t at = 123;
  auto c = floats(std::vector<float>(n + at));
  auto moved = draw(TensorFn::uniform, c.get(), 42, -1, 3);
  moved.operands[0].offset = moved.drawOrigin = at;
  ASSERT_TRUE(device->tensor(moved));
  auto z = readFloats(*c, n + at);
  EXPECT_EQ(std::vector<float>(z.begin() + at, z.end()), x);
  double sum = 0;
  for (float v : x) {
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 3.0f);
    sum += v;
  }
  EXPECT_NEAR(sum / n, 1.0, 0.05);
  ASSERT_TRUE(device->tensor(draw(TensorFn::uniform, b.get(), 43, -1, 3)));
  y = readFloats(*b, n);
  size_t same = 0;
  for (size_t i = 0; i < n; ++i) same += x[i] == y[i];
  EXPECT_LT(same, n / 100);
  ASSERT_TRUE(device->tensor(draw(TensorFn::bernoulli, a.get(), 7, 0.3f, 0)));
  x = readFloats(*a, n);
  double ones = 0;
  for (float v : x) {
    ASSERT_TRUE(v == 0.0f || v == 1.0f) << v;
    ones += v;
  }
  EXPECT_NEAR(ones / n, 0.3, 0.02);
  ASSERT_TRUE(device->tensor(draw(TensorFn::normal, a.get(), 9, 2, 0.5f)));
  x = readFloats(*a, n);
  double mean = 0, squares = 0;
  for (float v : x) {
    ASSERT_TRUE(std::isfinite(v));
    mean += v;
  }
  mean /= n;
  for (float v : x) squares += (v - mean) * (v - mean);
  EXPECT_NEAR(mean, 2.0, 0.02);
  EXPECT_NEAR(std::sqrt(squares / n), 0.5, 0.02);
}

TEST_P(Conformance, TensorOpsWithOperandsOfTheWrongTypeAreRefused) {
  auto a = floats(randomFloats(16, 8));
  auto out = device->allocate(16 * 8), flags = device->allocate(10);
  ASSERT_TRUE(out && flags);
  auto refused = [&](const TensorOp& op, const char* words) {
    auto s = device->tensor(op);
    ASSERT_FALSE(s) << tensorFnName(op.fn);
    EXPECT_EQ(s.error().code, Code::invalidArgument) << s.error().message;
    EXPECT_NE(s.error().message.find(words), std::string::npos) << s.error().message;
  };
  const auto i64 = TensorType::i64, boolean = TensorType::boolean;
  refused(tensorOp(TensorFn::eq, {4}, {view(out->get(), 0, {1}), view(a.get(), 0, {1}), view(a.get(), 4, {1})}), "writes bool");
  refused(tensorOp(TensorFn::eq, {4}, {view(flags->get(), 0, {1}, boolean), view(a.get(), 0, {1}), view(out->get(), 0, {1}, i64)}),
          "one type");
  refused(tensorOp(TensorFn::relu, {4}, {view(out->get(), 0, {1}, i64), view(a.get(), 0, {1})}), "is i64 (f32)");
  refused(tensorOp(TensorFn::add, {4}, {view(out->get(), 0, {1}, i64), view(a.get(), 0, {1}), view(a.get(), 0, {1})}),
          "takes no f32 operand");
  auto half = tensorOp(TensorFn::add, {4}, {view(out->get(), 0, {1}, i64), view(out->get(), 4, {1}, i64), view(out->get(), 8, {1}, i64)});
  half.alpha = 0.5f;
  refused(half, "integer alpha");
  refused(tensorOp(TensorFn::where, {4}, {view(out->get(), 0, {1}), view(a.get(), 0, {1}), view(a.get(), 0, {1}), view(a.get(), 0, {1})}),
          "condition is bool");
  TensorOperand unknown = view(a.get(), 0, {1});
  unknown.type = TensorType(7);
  refused(tensorOp(TensorFn::copy, {4}, {view(out->get(), 0, {1}), unknown}), "unknown element type");
  // A bool's element is one byte, an i64's eight: 10 bools fit a 10-byte buffer, 11 do not.
  EXPECT_TRUE(device->tensor(tensorOp(TensorFn::copy, {10}, {view(flags->get(), 0, {1}, boolean), view(a.get(), 0, {1})})));
  refused(tensorOp(TensorFn::copy, {11}, {view(flags->get(), 0, {1}, boolean), view(a.get(), 0, {1})}), "reaches element");
  refused(tensorOp(TensorFn::copy, {17}, {view(out->get(), 0, {1}, i64), view(out->get(), 0, {1})}), "reaches element");
  auto amax = tensorOp(TensorFn::amax, {4, 4}, {view(out->get(), 0, {0, 1}), view(a.get(), 0, {4, 1})});
  amax.reduceMask = 1;
  refused(amax, "after the kept ones");
  auto arg = tensorOp(TensorFn::argmax, {4, 4}, {view(out->get(), 0, {1, 0}), view(a.get(), 0, {4, 1})});
  arg.reduceMask = 2;
  refused(arg, "position is i64");
  auto sum = tensorOp(TensorFn::sum, {4}, {view(out->get(), 0, {0}), view(flags->get(), 0, {1}, boolean)});
  sum.reduceMask = 1;
  refused(sum, "integer sum is i64");
  // gatherSum: an i64 index, an output that holds still over the picks and the rows.
  refused(tensorOp(TensorFn::gatherSum, {2, 2, 4}, {view(out->get(), 8, {1, 0, 0}), view(a.get(), 0, {0, 0, 1}), view(a.get(), 4, {2, 1, 0})}),
          "index is i64");
  refused(tensorOp(TensorFn::gatherSum, {2, 2, 4}, {view(out->get(), 8, {1, 1, 0}), view(a.get(), 0, {0, 0, 1}), view(out->get(), 0, {2, 1, 0}, i64)}),
          "over the picks and the rows must be 0");
  refused(tensorOp(TensorFn::gatherSum, {2, 2, 4}, {view(out->get(), 8, {1, 0, 0}), view(a.get(), 0, {0, 0, 1}), view(out->get(), 0, {2, 1, 1}, i64)}),
          "index's stride over the rows must be 0");
  EXPECT_TRUE(device->finish());  // the copy that ran (an asynchronous card) before its buffers go
}

TEST_P(Conformance, TensorOpsThatWouldLeaveTheirBuffersAreRefused) {
  auto a = floats(randomFloats(16, 8));
  auto out = device->allocate(16 * 4);
  ASSERT_TRUE(out);
  auto refused = [&](const TensorOp& op, const char* words) {
    auto s = device->tensor(op);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code, Code::invalidArgument) << s.error().message;
    EXPECT_NE(s.error().message.find(words), std::string::npos) << s.error().message;
  };
  refused(tensorOp(TensorFn::copy, {4, 5}, {view(out->get(), 0, {4, 1}), view(a.get(), 0, {4, 1})}), "reaches element");
  refused(tensorOp(TensorFn::copy, {16}, {view(out->get(), 1, {1}), view(a.get(), 0, {1})}), "reaches element");
  refused(tensorOp(TensorFn::copy, {2}, {view(out->get(), 0, {1}), view(a.get(), 0, {uint64_t{1} << 62})}), "reaches element");
  refused(tensorOp(TensorFn::copy, {1ull << 40, 1ull << 40}, {view(out->get(), 0, {0, 0}), view(a.get(), 0, {0, 0})}), "2^48");
  refused(tensorOp(TensorFn::add, {4}, {view(out->get(), 0, {1}), view(a.get(), 0, {1})}), "no buffer");
  auto sum = tensorOp(TensorFn::sum, {4, 4}, {view(out->get(), 0, {1, 1}), view(a.get(), 0, {4, 1})});
  sum.reduceMask = 1;
  refused(sum, "strides must be 0");
  sum.reduceMask = 4;
  refused(sum, "past the shape");
  refused(tensorOp(TensorFn::matmul, {4, 4}, {view(out->get(), 0, {4, 1}), view(a.get(), 0, {4, 1}), view(a.get(), 0, {4, 1})}),
          "3 dimensions");
  refused(tensorOp(TensorFn::matmul, {2, 2, 2}, {view(a.get(), 0, {2, 1, 0}), view(a.get(), 2, {2, 0, 1}), view(a.get(), 8, {0, 1, 2})}),
          "overlaps");
  TensorOp tooDeep = tensorOp(TensorFn::copy, {1}, {view(out->get(), 0, {1}), view(a.get(), 0, {1})});
  tooDeep.dims = 7;
  refused(tooDeep, "dimensions");
  // Nothing was written by any of them; an empty shape runs nothing.
  EXPECT_EQ(readFloats(**out, 16), std::vector<float>(16, 0.0f));
  EXPECT_TRUE(device->tensor(tensorOp(TensorFn::copy, {0, 4}, {view(out->get(), 0, {4, 1}), view(a.get(), 0, {4, 1})})));
}

TEST_P(Conformance, BuiltinLibraryLaunchesByNameAndRefusesUnknownKernels) {
  if (!hasBuiltins()) GTEST_SKIP() << "this card runs no built-in ops";
  auto program = device->loadProgram(ProgramKind::builtin, kBuiltinLibrary, {});
  ASSERT_TRUE(program) << program.error().message;
  auto x = floats({1, 2, 3}), y = floats({10, 20, 30});
  KernelArg args[4];
  args[0].type = KernelArg::Type::u64;
  args[0].scalar.u64 = 3;
  args[1].type = KernelArg::Type::f32;
  args[1].scalar.f32 = 2;
  args[2] = {KernelArg::Type::buffer, x.get(), {}};
  args[3] = {KernelArg::Type::buffer, y.get(), {}};
  ASSERT_TRUE(device->launch(**program, "axpy", {}, args));
  EXPECT_EQ(readFloats(*y, 3), (std::vector<float>{12, 24, 36}));
  auto unknown = device->launch(**program, "fft", {}, args);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Code::notFound);
  EXPECT_NE(unknown.error().message.find("fft"), std::string::npos);
  EXPECT_FALSE(device->launch(**program, "axpy", {}, std::span(args).first(2)));
}

// Small flat maps issued while plugged, as the card worker issues an optimizer's step: an
// OpenCL device runs them together (hal/flat_run.h), and each phase below must give what
// the maps give one after the other. A map joins a run only where it touches what earlier
// maps touched at the same element offset; each phase counts the launches it takes there.
//   A  five maps, each reading what the one before wrote, at the same offsets: one run
//   B  a map reading t one element on (a work-item's neighbour's result), then one writing
//      a at an offset the first map read at another: each starts a run of its own
//   C  fifteen maps on one array: runs of 13 and 2 (RC_RUN_STEPS)
//   D  maps over six buffers: a fifth buffer starts a new run (four a run)
// Every map reports its own device time, under its own tag.
TEST_P(Conformance, SmallMapsIssuedPluggedGiveTheResultsOfOneAfterTheOther) {
  const uint64_t n = 300;
  std::vector<float> a0 = randomFloats(n, 1), b0 = randomFloats(n, 2);
  auto a = floats(a0), b = floats(b0), t = floats(std::vector<float>(n)), u = floats(std::vector<float>(n));
  auto v = floats(std::vector<float>(n)), w = floats(std::vector<float>(n));
  auto flat = [&](TensorFn fn, uint64_t count, std::initializer_list<TensorOperand> operands, float alpha = 1,
                  float beta = 0) {
    TensorOp op = tensorOp(fn, {count}, operands);
    op.alpha = alpha, op.beta = beta;
    return op;
  };
  auto at = [](std::unique_ptr<Buffer>& buf, uint64_t offset = 0) { return view(buf.get(), offset, {1}); };
  const bool runs = GetParam().name.rfind("opencl", 0) == 0;
  uint64_t tag = 100;
  std::vector<uint64_t> tags;
  // Runs `ops` plugged and returns the kernels they took (where the device counts them).
  auto plugged = [&](const std::vector<TensorOp>& ops) {
    const uint64_t before = device->launches();
    device->plug();
    for (const TensorOp& op : ops) {
      tags.push_back(tag);
      device->tagKernels(tag++);
      EXPECT_TRUE(device->tensor(op));
    }
    device->unplug();
    EXPECT_TRUE(device->finish());
    return device->launches() - before;
  };
  std::vector<float> ta(n), ua(n), va(n), wa(n), aa = a0;
  // A: t = a + 0.5 b; t = 2 t + 1; u = a * t; t = t + u; u = 0.5 (u - t) (lerp of u toward t).
  const uint64_t launchesA = plugged({flat(TensorFn::add, n, {at(t), at(a), at(b)}, 0.5f),
                                      flat(TensorFn::affine, n, {at(t), at(t)}, 2, 1), flat(TensorFn::mul, n, {at(u), at(a), at(t)}),
                                      flat(TensorFn::add, n, {at(t), at(t), at(u)}), flat(TensorFn::lerp, n, {at(u), at(u), at(t)}, 0.5f)});
  for (uint64_t i = 0; i < n; ++i) {
    ta[i] = 2 * (a0[i] + 0.5f * b0[i]) + 1;
    ua[i] = a0[i] * ta[i];
    ta[i] = ta[i] + ua[i];
    ua[i] = ua[i] + 0.5f * (ta[i] - ua[i]);
  }
  auto gotT = readFloats(*t, n), gotU = readFloats(*u, n);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(gotT[i], ta[i], 1e-5 * (1 + std::fabs(ta[i]))) << "A: t[" << i << "]";
    ASSERT_NEAR(gotU[i], ua[i], 1e-5 * (1 + std::fabs(ua[i]))) << "A: u[" << i << "]";
  }
  // B: t = t + 1; v = t[1..] (a neighbour's t); a[1..] = 3 a[1..] (a was read from 0 in the first).
  const uint64_t launchesB = plugged({flat(TensorFn::add, n, {at(t), at(t), at(a)}, 0.0f),
                                      flat(TensorFn::affine, n, {at(t), at(t)}, 1, 1),
                                      flat(TensorFn::copy, n - 1, {at(v), at(t, 1)}),
                                      flat(TensorFn::affine, n - 1, {at(a, 1), at(a, 1)}, 3, 0),
                                      flat(TensorFn::add, n - 1, {at(w), at(v), at(a)}, 1)});
  for (uint64_t i = 0; i < n; ++i) ta[i] = ta[i] + 1;
  for (uint64_t i = 0; i + 1 < n; ++i) va[i] = ta[i + 1];
  for (uint64_t i = 1; i < n; ++i) aa[i] = 3 * a0[i];
  for (uint64_t i = 0; i + 1 < n; ++i) wa[i] = va[i] + aa[i];
  auto gotV = readFloats(*v, n), gotA = readFloats(*a, n), gotW = readFloats(*w, n);
  for (uint64_t i = 0; i + 1 < n; ++i) {
    ASSERT_NEAR(gotV[i], va[i], 1e-5 * (1 + std::fabs(va[i]))) << "B: v[" << i << "] (t read one element on)";
    ASSERT_NEAR(gotA[i + 1], aa[i + 1], 1e-5 * (1 + std::fabs(aa[i + 1]))) << "B: a[" << i + 1 << "]";
    ASSERT_NEAR(gotW[i], wa[i], 1e-5 * (1 + std::fabs(wa[i]))) << "B: w[" << i << "]";
  }
  // C: fifteen times w = 0.5 w + 1 over its first 17 elements.
  std::vector<TensorOp> halving(15, flat(TensorFn::affine, 17, {at(w), at(w)}, 0.5f, 1));
  const uint64_t launchesC = plugged(halving);
  for (int r = 0; r < 15; ++r)
    for (uint64_t i = 0; i < 17; ++i) wa[i] = 0.5f * wa[i] + 1;
  gotW = readFloats(*w, n);
  for (uint64_t i = 0; i + 1 < n; ++i) ASSERT_NEAR(gotW[i], wa[i], 1e-5 * (1 + std::fabs(wa[i]))) << "C: w[" << i << "]";
  // D: b = b + a; t = t + u; v = v + w: the third reaches a fifth and sixth buffer.
  const uint64_t launchesD = plugged({flat(TensorFn::add, n, {at(b), at(b), at(a)}), flat(TensorFn::add, n, {at(t), at(t), at(u)}),
                                      flat(TensorFn::add, n - 1, {at(v), at(v), at(w)})});
  auto gotB = readFloats(*b, n);
  gotT = readFloats(*t, n), gotV = readFloats(*v, n);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(gotB[i], b0[i] + aa[i], 1e-5 * (1 + std::fabs(b0[i] + aa[i]))) << "D: b[" << i << "]";
    ASSERT_NEAR(gotT[i], ta[i] + ua[i], 1e-5 * (1 + std::fabs(ta[i] + ua[i]))) << "D: t[" << i << "]";
    if (i + 1 < n) {
      ASSERT_NEAR(gotV[i], va[i] + wa[i], 1e-5 * (1 + std::fabs(va[i] + wa[i]))) << "D: v[" << i << "]";
    }
  }
  if (runs) {
    EXPECT_EQ(launchesA, 1u) << "five maps at the same offsets: one run";
    EXPECT_EQ(launchesB, 3u) << "a read one element on, then a write over an earlier read: two runs more";
    EXPECT_EQ(launchesC, 2u) << "fifteen maps: runs of 13 and 2";
    EXPECT_EQ(launchesD, 2u) << "six buffers: four in a run";
  }
  if (device->timesKernels()) {  // every map's time once, under its tag
    std::vector<KernelTime> times;
    device->takeCompleted(times);
    std::vector<uint64_t> reported;
    for (auto& k : times)
      if (k.tag >= 100) reported.push_back(k.tag);
    EXPECT_EQ(reported, tags);
  }
}

TEST_P(Conformance, AsynchronousCardsReportEachKernelsDeviceTimeOnceWithItsTag) {
  if (!device->timesKernels()) GTEST_SKIP() << "a synchronous card: its caller times its kernels";
  if (!hasBuiltins()) GTEST_SKIP() << "no built-in library";
  const uint32_t n = 128;
  auto a = floats(std::vector<float>(n * n, 1.0f)), b = floats(std::vector<float>(n * n, 2.0f));
  auto c = device->allocate(n * n * 4);
  ASSERT_TRUE(c);
  device->tagKernels(7);
  ASSERT_TRUE(device->gemm({n, n, n, 1, 0, a.get(), b.get(), c->get()}));
  device->tagKernels(9);
  ASSERT_TRUE(device->axpy(n, 2.0f, *a, **c));
  ASSERT_TRUE(device->finish());
  std::vector<KernelTime> times;
  EXPECT_EQ(device->takeCompleted(times), 0u);
  ASSERT_EQ(times.size(), 2u);
  EXPECT_EQ(times[0].tag, 7u);
  EXPECT_EQ(times[1].tag, 9u);
  EXPECT_GT(times[0].ns, 0u);
  times.clear();
  EXPECT_EQ(device->takeCompleted(times), 0u);
  EXPECT_TRUE(times.empty()) << "reported twice";
  // The results are the same as a synchronous card's.
  auto out = readFloats(**c, 2);
  EXPECT_EQ(out[0], 2.0f * n + 2.0f);
  device->release(std::move(*c));
}

TEST_P(Conformance, ProgramKindsTheCardCannotRunAreRefused) {
  // Every kind this card does not list is refused as unimplemented, naming what it takes.
  auto& have = device->capabilities().programKinds;
  int refused = 0;
  for (auto kind : {ProgramKind::builtin, ProgramKind::openclC, ProgramKind::spirv, ProgramKind::ptx, ProgramKind::cubin,
                    ProgramKind::cudaC, ProgramKind::xclbin}) {
    if (std::find(have.begin(), have.end(), kind) != have.end()) continue;
    auto p = device->loadProgram(kind, "k", {});
    ASSERT_FALSE(p) << programKindName(kind);
    EXPECT_EQ(p.error().code, Code::unimplemented) << programKindName(kind) << ": " << p.error().message;
    EXPECT_NE(p.error().message.find("it accepts"), std::string::npos) << p.error().message;
    ++refused;
  }
  EXPECT_GT(refused, 0);
  auto lib = device->loadProgram(ProgramKind::builtin, "nope", {});
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code, Code::notFound);
}

TEST_P(Conformance, ProgramsLaunchWithScalarAndBufferArguments) {
  auto& sample = GetParam().sample;
  if (!sample) GTEST_SKIP() << "no source-language sample for this backend";
  auto program = device->loadProgram(sample->kind, "sample", std::as_bytes(std::span(sample->source)));
  ASSERT_TRUE(program) << program.error().message;
  auto names = (*program)->kernels();
  EXPECT_NE(std::find(names.begin(), names.end(), "scale"), names.end());
  const uint32_t n = 1000;
  std::vector<float> v(n + 24, 1.0f);
  for (uint32_t i = 0; i < n; ++i) v[i] = float(i);
  auto x = floats(v);
  KernelArg args[3];
  args[0].type = KernelArg::Type::f32;
  args[0].scalar.f32 = 3;
  args[1] = {KernelArg::Type::buffer, x.get(), {}};
  args[2].type = KernelArg::Type::u32;
  args[2].scalar.u32 = n;
  LaunchDims dims;
  dims.grid = {(n + 63) / 64, 1, 1};
  dims.block = {64, 1, 1};
  ASSERT_TRUE(device->launch(**program, "scale", dims, args));
  ASSERT_TRUE(device->finish());  // the fence: everything issued has completed
  auto got = readFloats(*x, n + 24);
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 3.0f * i) << i;
  for (uint32_t i = n; i < n + 24; ++i) ASSERT_EQ(got[i], 1.0f) << "past n, at " << i;

  auto missing = device->launch(**program, "nope", dims, args);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Code::notFound);
  auto tooFew = device->launch(**program, "scale", dims, std::span(args).first(2));
  ASSERT_FALSE(tooFew);
  EXPECT_EQ(tooFew.error().code, Code::invalidArgument) << tooFew.error().message;
}

TEST_P(Conformance, ProgramsThatFailToBuildReturnTheirLog) {
  auto& sample = GetParam().sample;
  if (!sample) GTEST_SKIP() << "no source-language sample for this backend";
  auto program = device->loadProgram(sample->kind, "broken", std::as_bytes(std::span(sample->broken)));
  ASSERT_FALSE(program);
  EXPECT_EQ(program.error().code, Code::invalidArgument);
  EXPECT_NE(program.error().message.find("log"), std::string::npos) << program.error().message;
  EXPECT_NE(program.error().message.find("undeclared_thing"), std::string::npos) << program.error().message;
  // The device is still usable.
  auto b = device->allocate(16);
  EXPECT_TRUE(b);
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(conformanceBackends()),
                         [](const auto& info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);

}  // namespace
}  // namespace raccel::hal
