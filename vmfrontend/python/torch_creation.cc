// Tensors the torch device makes from numbers rather than from other tensors: ranges,
// identities and triangles' indices (made on the host by PyTorch's own kernels and
// written to the card: a write that does not wait), and random draws on the card, keyed
// from PyTorch's generator
// (bernoulli_, uniform_, normal_, and what is made of them: exponential, Cauchy,
// log-normal, geometric, gamma, Dirichlet and integer draws, normal draws about tensors,
// permutations and samples of a distribution).
#include <ATen/CPUGeneratorImpl.h>

#include "vmfrontend/python/torch_device.h"

namespace raccel::python {

namespace {

// ---- Ranges and identities -------------------------------------------------------------

// Each is what PyTorch's CPU makes of numbers alone (its checks and its values), written
// into `out` on the card (resultInto).
at::TensorOptions hostOptions(const at::Tensor& out) { return at::TensorOptions().dtype(out.scalar_type()); }
at::Tensor& linspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps, at::Tensor& out) {
  return resultInto(out, at::linspace(start, end, steps, hostOptions(out)));
}
at::Tensor& logspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps, double base, at::Tensor& out) {
  return resultInto(out, at::logspace(start, end, steps, base, hostOptions(out)));
}
at::Tensor& eye_out(int64_t n, at::Tensor& out) { return resultInto(out, at::eye(n, hostOptions(out))); }
at::Tensor& eye_m_out(int64_t n, int64_t m, at::Tensor& out) { return resultInto(out, at::eye(n, m, hostOptions(out))); }
// tril_indices and triu_indices: the positions of a triangle, as PyTorch's CPU lists them.
at::Tensor madeOnCard(const at::Tensor& made) {
  auto out = emptyOn(made.sizes(), made.scalar_type());
  return resultInto(out, made);
}
at::Tensor tril_indices(int64_t row, int64_t col, int64_t offset, c10::optional<at::ScalarType> dtype, c10::optional<at::Layout>,
                        c10::optional<at::Device>, c10::optional<bool>) {
  return madeOnCard(at::tril_indices(row, col, offset, at::TensorOptions().dtype(dtype.value_or(at::kLong))));
}
at::Tensor triu_indices(int64_t row, int64_t col, int64_t offset, c10::optional<at::ScalarType> dtype, c10::optional<at::Layout>,
                        c10::optional<at::Device>, c10::optional<bool>) {
  return madeOnCard(at::triu_indices(row, col, offset, at::TensorOptions().dtype(dtype.value_or(at::kLong))));
}
at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  return resultInto(out, at::arange(start, end, step, hostOptions(out)));
}

// ---- Random draws on the card ----------------------------------------------------------

// A Philox key for one op, drawn from `generator` (a CPU one) or PyTorch's default, so
// torch.manual_seed makes the device's draws reproducible.
int64_t randomKey(const c10::optional<at::Generator>& generator) {
  auto* g = at::get_generator_or_default<at::CPUGeneratorImpl>(generator, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(g->mutex_);
  return static_cast<int64_t>(g->random64());
}
at::Tensor& randomInto(TensorFn fn, at::Tensor& self, float alpha, float beta, const c10::optional<at::Generator>& generator) {
  if (reducedFloats({&self})) {  // drawn in f32 on the card, rounded once
    auto wide = emptyOn(self.sizes());
    randomInto(fn, wide, alpha, beta, generator);
    return self.copy_(wide);
  }
  Locked s;
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(self.sizes());
  op.operands = {operand(self, self.strides())};
  op.alpha = alpha, op.beta = beta;
  op.ignoreIndex = randomKey(generator);
  send(*s, op);
  return self;
}
bool cpuGenerator(const c10::optional<at::Generator>& generator) {
  return !generator || !generator->defined() || generator->device().is_cpu();
}
// A draw the card makes into `self`: f32, or f16/bf16 drawn in f32 and rounded once.
bool drawnOnCard(const at::Tensor& self, const c10::optional<at::Generator>& generator) {
  return (supported({&self}) || reducedFloats({&self})) && cpuGenerator(generator);
}
at::Tensor& bernoulli_(at::Tensor& self, double p, c10::optional<at::Generator> generator) {
  if (!drawnOnCard(self, generator))
    return hostInto("aten::bernoulli_.float", self, host(self).bernoulli_(p, generator));
  return randomInto(TensorFn::bernoulli, self, static_cast<float>(p), 0, generator);
}
at::Tensor& uniform_(at::Tensor& self, double from, double to, c10::optional<at::Generator> generator) {
  if (!drawnOnCard(self, generator))
    return hostInto("aten::uniform_", self, host(self).uniform_(from, to, generator));
  return randomInto(TensorFn::uniform, self, static_cast<float>(from), static_cast<float>(to), generator);
}
at::Tensor& normal_(at::Tensor& self, double mean, double std, c10::optional<at::Generator> generator) {
  if (!drawnOnCard(self, generator))
    return hostInto("aten::normal_", self, host(self).normal_(mean, std, generator));
  return randomInto(TensorFn::normal, self, static_cast<float>(mean), static_cast<float>(std), generator);
}

// Random integers: rows x n draws of 24 bits each (2^24 u, exact in f32), as i64; and
// n draws of 48 bits (two of them).
constexpr int64_t kDrawSteps = int64_t{1} << 24;
at::Tensor integerDraws(int64_t rows, int64_t n, const c10::optional<at::Generator>& generator) {
  auto draws = emptyOn({rows, n});
  randomInto(TensorFn::uniform, draws, 0, float(kDrawSteps), generator);
  return draws.to(at::kLong);
}
at::Tensor draws48(int64_t n, const c10::optional<at::Generator>& generator) {
  auto halves = integerDraws(2, n, generator);
  return halves[0] * kDrawSteps + halves[1];
}

// bernoulli_ of a tensor of probabilities (torch.bernoulli(p), Bernoulli.sample()): 1
// where the card's uniform draw is below p, p first checked to lie in [0, 1] as PyTorch's
// CPU checks it (one bool read back).
at::Tensor& bernoulli_tensor_(at::Tensor& self, const at::Tensor& p, c10::optional<at::Generator> generator) {
  if (!(supported({&p}) || reducedFloats({&p})) || !stored(self) || !cpuGenerator(generator) ||
      !at::is_expandable_to(p.sizes(), self.sizes()))
    return hostInto("aten::bernoulli_.Tensor", self, host(self).bernoulli_(host(p), generator));
  TORCH_CHECK(p.numel() == 0 || ((p >= 0) & (p <= 1)).all().item<bool>(), "Expected p_in >= 0 && p_in <= 1 to be true, but got false.");
  auto u = emptyOn(self.sizes());
  randomInto(TensorFn::uniform, u, 0, 1, generator);
  return self.copy_(u < p);
}

// random_(from, to): integers in [from, to), from the card's 24-bit draws k: k * range /
// 2^24 (rounded down, exact in i64) for a range of up to 2^24, else a 48-bit draw modulo
// the range (up to 2^40: a bias below 2^-8 of one value's share, as PyTorch's CPU has for
// its ranges). Into i64, or f32 where every value is exact (below 2^24 in magnitude).
at::Tensor& random_from_(at::Tensor& self, int64_t from, c10::optional<int64_t> to, c10::optional<at::Generator> generator) {
  int64_t range = 0;  // (0: none the card draws; PyTorch's checks on the host)
  if (to && __builtin_sub_overflow(*to, from, &range)) range = 0;
  const bool exactInF32 =
      self.scalar_type() == at::kFloat && from >= -kDrawSteps && range <= kDrawSteps && from + range <= kDrawSteps;
  const bool ok = onDevice(self) && (self.scalar_type() == at::kLong || exactInF32) && range > 0 &&
                  range <= (int64_t{1} << 40) && cpuGenerator(generator);
  if (!ok) return hostInto("aten::random_.from", self, host(self).random_(from, to, generator));
  auto value = range <= kDrawSteps ? at::div(integerDraws(1, self.numel(), generator)[0] * range, kDrawSteps, "floor")
                                    : at::remainder(draws48(self.numel(), generator), range);
  return self.copy_((value + from).view(self.sizes()));
}

// normal with tensors for the mean or the deviation (Normal.sample()): z * std + mean for
// the card's standard normal z, in PyTorch's order, a negative deviation refused as
// PyTorch's CPU refuses it (one number read back).
at::Tensor normalOf(const at::Tensor& mean, const at::Tensor& std, const c10::optional<at::Generator>& generator) {
  TORCH_CHECK(std.numel() == 0 || std.min().item<float>() >= 0, "normal expects all elements of std >= 0.0");
  auto z = emptyOn(at::infer_size(mean.sizes(), std.sizes()));
  randomInto(TensorFn::normal, z, 0, 1, generator);
  return z.mul_(std).add_(mean);
}
bool normalOnCard(std::initializer_list<const at::Tensor*> tensors, const c10::optional<at::Generator>& generator) {
  return supported(tensors) && cpuGenerator(generator);
}
at::Tensor& normal_tensors_out(const at::Tensor& mean, const at::Tensor& std, c10::optional<at::Generator> generator, at::Tensor& out) {
  if (!normalOnCard({&mean, &std, &out}, generator) || !at::is_expandable_to(mean.sizes(), at::infer_size(mean.sizes(), std.sizes())))
    return hostInto("aten::normal.Tensor_Tensor", out, at::normal(host(mean), host(std), generator));
  return resultInto(out, normalOf(mean, std, generator));
}
at::Tensor normal_tensors(const at::Tensor& mean, const at::Tensor& std, c10::optional<at::Generator> generator) {
  auto out = emptyOn({0}, floatResult(at::result_type(mean, std)));
  return python::normal_tensors_out(mean, std, generator, out);
}
at::Tensor& normal_tensor_float_out(const at::Tensor& mean, double std, c10::optional<at::Generator> generator, at::Tensor& out) {
  if (!normalOnCard({&mean, &out}, generator) || !(std >= 0))
    return hostInto("aten::normal.Tensor_float", out, at::normal(host(mean), std, generator));
  return resultInto(out, normalOf(mean, at::full({}, std, mean.options()), generator));
}
at::Tensor normal_tensor_float(const at::Tensor& mean, double std, c10::optional<at::Generator> generator) {
  auto out = emptyOn({0}, floatResult(mean.scalar_type()));
  return python::normal_tensor_float_out(mean, std, generator, out);
}
at::Tensor& normal_float_tensor_out(double mean, const at::Tensor& std, c10::optional<at::Generator> generator, at::Tensor& out) {
  if (!normalOnCard({&std, &out}, generator))
    return hostInto("aten::normal.float_Tensor", out, at::normal(mean, host(std), generator));
  return resultInto(out, normalOf(at::full({}, mean, std.options()), std, generator));
}
at::Tensor normal_float_tensor(double mean, const at::Tensor& std, c10::optional<at::Generator> generator) {
  auto out = emptyOn({0}, floatResult(std.scalar_type()));
  return python::normal_float_tensor_out(mean, std, generator, out);
}

// cauchy_: median + sigma tan(pi (u - 1/2)); log_normal_: exp of a normal draw;
// geometric_: the trials to the first success, ceil(log(1 - u) / log(1 - p)), at least 1.
at::Tensor& cauchy_(at::Tensor& self, double median, double sigma, c10::optional<at::Generator> generator) {
  if (!supported({&self}) || !cpuGenerator(generator) || !(sigma > 0))
    return hostInto("aten::cauchy_", self, host(self).cauchy_(median, sigma, generator));
  randomInto(TensorFn::uniform, self, 0, 1, generator);
  return self.sub_(0.5).mul_(M_PI).tan_().mul_(sigma).add_(median);
}
at::Tensor& log_normal_(at::Tensor& self, double mean, double std, c10::optional<at::Generator> generator) {
  if (!supported({&self}) || !cpuGenerator(generator) || !(std > 0))
    return hostInto("aten::log_normal_", self, host(self).log_normal_(mean, std, generator));
  randomInto(TensorFn::normal, self, static_cast<float>(mean), static_cast<float>(std), generator);
  return self.exp_();
}
at::Tensor& geometric_(at::Tensor& self, double p, c10::optional<at::Generator> generator) {
  if (!supported({&self}) || !cpuGenerator(generator) || !(p > 0 && p < 1))
    return hostInto("aten::geometric_", self, host(self).geometric_(p, generator));
  randomInto(TensorFn::uniform, self, 0, 1, generator);
  return self.neg_().log1p_().div_(std::log1p(-p)).ceil_().clamp_min_(1);
}

// _standard_gamma: Marsaglia and Tsang's method, as PyTorch's CPU samples it (alpha below 1
// boosted by u^(1 / alpha) from alpha + 1), its rejection loop unrolled into kGammaRounds
// candidates drawn at once, the first accepted taken. The acceptance is at least 0.95 a
// round, so that none of 8 is accepted is below 1e-10 of the draws: those get the mode's
// neighbour d. At least f32's least normal, as PyTorch's CPU keeps it; 0 for alpha 0.
constexpr int64_t kGammaRounds = 8;
at::Tensor standardGamma(const at::Tensor& alpha, const c10::optional<at::Generator>& generator) {
  auto boosted = alpha < 1;
  auto a = at::where(boosted, alpha + 1, alpha);
  auto d = a - 1.0 / 3.0;
  auto c = (d * 9).rsqrt();
  std::vector<int64_t> rounds = {kGammaRounds};
  rounds.insert(rounds.end(), alpha.sizes().begin(), alpha.sizes().end());
  auto x = emptyOn(rounds), u = emptyOn(rounds), boost = emptyOn(alpha.sizes());
  randomInto(TensorFn::normal, x, 0, 1, generator);
  randomInto(TensorFn::uniform, u, 0, 1, generator);
  randomInto(TensorFn::uniform, boost, 0, 1, generator);
  auto y = c * x + 1;
  auto v = y * y * y;
  auto xx = x * x;
  auto uu = 1 - u;
  auto accepted = (y > 0) & ((uu < 1 - xx * xx * 0.0331) | (at::log(uu) < xx * 0.5 + d * (1 - v + at::log(v))));
  auto first = accepted.to(at::kFloat).argmax(0, true);  // (the first of the largest: the first accepted round)
  auto value = (d * v).gather(0, first).squeeze(0);
  value = at::where(accepted.any(0), value, d);
  value = at::where(boosted, value * at::exp(at::log1p(-boost) / alpha), value);  // (1 - u)^(1 / alpha)
  value = at::where(alpha == 0, at::zeros({}, value.options()), value);
  return value.clamp_min(std::numeric_limits<float>::min());
}
bool gammaOnCard(const at::Tensor& alpha, const c10::optional<at::Generator>& generator) {
  return supported({&alpha}) && alpha.dim() < 6 && cpuGenerator(generator) && alpha.numel() > 0;
}
at::Tensor _standard_gamma(const at::Tensor& self, c10::optional<at::Generator> generator) {
  if (!gammaOnCard(self, generator))
    return onHost("aten::_standard_gamma", [&] { return at::_standard_gamma(host(self), generator).to(self.device()); });
  return standardGamma(self, generator);
}
// _sample_dirichlet: gamma draws over their sum along the last dimension, held in
// [least normal, 1 - epsilon] as PyTorch's CPU holds them.
at::Tensor _sample_dirichlet(const at::Tensor& self, c10::optional<at::Generator> generator) {
  if (!gammaOnCard(self, generator) || self.dim() == 0)
    return onHost("aten::_sample_dirichlet", [&] { return at::_sample_dirichlet(host(self), generator).to(self.device()); });
  auto gamma = standardGamma(self, generator);
  auto share = gamma / gamma.sum(-1, true);
  return share.clamp(std::numeric_limits<float>::min(), 1 - std::numeric_limits<float>::epsilon());
}

// exponential_: -log(1 - u) / lambda of a uniform u in [0, 1) (f32's 2^24 steps), its
// least value 2^-25 / lambda rather than 0, so that p / q (multinomial's draws below) is
// never 0 / 0 or p / 0.
at::Tensor& exponential_(at::Tensor& self, double lambda, c10::optional<at::Generator> generator) {
  if (!supported({&self}) || !cpuGenerator(generator) || !(lambda > 0) || std::isinf(lambda))
    return hostInto("aten::exponential_", self, host(self).exponential_(lambda, generator));  // (its error for lambda <= 0)
  randomInto(TensorFn::uniform, self, 0, 1, generator);
  return self.neg_().log1p_().neg_().clamp_min_(std::ldexp(1.0, -25)).mul_(1.0 / lambda);
}

// randperm: positions sorted by random 48-bit keys (two draws of 24 bits each, exact in
// f32), so that equal keys, which would keep their order, are rare (n^2 / 2^49).
at::Tensor& randperm_out(int64_t n, c10::optional<at::Generator> generator, at::Tensor& out) {
  const bool ok = n >= 0 && onDevice(out) && cpuGenerator(generator) &&
                  (out.scalar_type() == at::kLong || (out.scalar_type() == at::kFloat && n <= kDrawSteps));
  if (!ok) return hostInto("aten::randperm.generator_out", out, at::randperm(n, generator, hostOptions(out)));
  at::native::resize_output(out, {n});
  if (n == 0) return out;
  return out.copy_(std::get<1>(at::sort(draws48(n, generator))));
}

// multinomial: `samples` categories drawn from each row of non-negative weights.
//  - Without replacement, or one sample: PyTorch's own method, the largest of p / q for
//    exponential q (the Gumbel trick), the rows scaled to a largest weight of 1 first so
//    that no ratio overflows.
//  - With replacement: the count of each draw u * total's cumulative weights at or below
//    it (so no category of weight 0 is drawn), at most the last category of weight.
// The weights are checked as PyTorch's CPU checks them, which reads two numbers back.
void checkDistribution(const at::Tensor& rows) {
  auto bad = ((rows < 0) | (rows != rows) | (rows.abs() == INFINITY)).any();
  auto read = at::stack({bad.to(at::kFloat), rows.sum(1).amin()}).cpu();
  TORCH_CHECK(read[0].item<float>() == 0, "probability tensor contains either `inf`, `nan` or element < 0");
  TORCH_CHECK(read[1].item<float>() > 0, "invalid multinomial distribution (sum of probabilities <= 0)");
}
at::Tensor drawnWithReplacement(const at::Tensor& weights, int64_t samples, const c10::optional<at::Generator>& generator) {
  auto cumulative = weights.cumsum(1);
  auto total = cumulative.narrow(1, weights.size(1) - 1, 1);
  auto u = emptyOn({weights.size(0), samples});
  randomInto(TensorFn::uniform, u, 0, 1, generator);
  auto drawn = (cumulative.unsqueeze(1) <= (u * total).unsqueeze(2)).sum(2);
  auto lastWeighted = (cumulative < total).sum(1, true);
  return at::minimum(drawn, lastWeighted);
}
at::Tensor& multinomial_out(const at::Tensor& self, int64_t samples, bool replacement, c10::optional<at::Generator> generator,
                            at::Tensor& out) {
  const int64_t categories = self.dim() > 0 ? self.size(-1) : 0, rows = self.dim() == 2 ? self.size(0) : 1;
  const bool withReplacement = replacement && samples > 1;
  const bool ok = supported({&self}) && (self.dim() == 1 || self.dim() == 2) && onDevice(out) && out.scalar_type() == at::kLong &&
                  cpuGenerator(generator) && samples > 0 && rows > 0 && categories > 0 && categories <= (int64_t{1} << 24) &&
                  (replacement || samples <= categories) &&
                  (!withReplacement || withinComposedElements(rows * samples, categories));
  if (!ok) return hostInto("aten::multinomial", out, at::multinomial(host(self), samples, replacement, generator));
  auto weights = self.reshape({rows, categories});
  checkDistribution(weights);
  weights = weights / weights.amax(1, true);
  at::Tensor drawn;
  if (withReplacement) {
    drawn = drawnWithReplacement(weights, samples, generator);
  } else {
    auto q = emptyOn(weights.sizes());
    python::exponential_(q, 1, generator);
    auto ratio = weights / q;
    drawn = samples == 1 ? ratio.argmax(1, true) : std::get<1>(ratio.topk(samples, 1));
  }
  notePositions(drawn, categories);
  at::native::resize_output(out, self.dim() == 1 ? at::IntArrayRef{samples} : at::IntArrayRef{rows, samples});
  return out.copy_(drawn.view(out.sizes()));
}
at::Tensor multinomial(const at::Tensor& self, int64_t samples, bool replacement, c10::optional<at::Generator> generator) {
  auto out = emptyOn({0}, at::kLong);
  return python::multinomial_out(self, samples, replacement, generator, out);
}

}  // namespace

// RReLU: in training, each element at or below 0 scaled by a slope drawn from [lower,
// upper) (kept in `noise`, which the backward multiplies by; 1 elsewhere, a NaN's too),
// as PyTorch's CPU; in evaluation, leaky_relu with the range's middle.
at::Tensor& rrelu_with_noise_out(const at::Tensor& self, const at::Tensor& noise, const at::Scalar& lower, const at::Scalar& upper,
                                 bool training, c10::optional<at::Generator> generator, at::Tensor& out) {
  if (!training) return resultInto(out, at::leaky_relu(self, (lower.toDouble() + upper.toDouble()) / 2));
  if (!supported({&self, &noise, &out}) || noise.sizes() != self.sizes()) {
    auto hostNoise = host(noise);
    auto result = onHost("aten::rrelu_with_noise", [&] {
      return at::rrelu_with_noise(host(self), hostNoise, lower, upper, training, generator);
    });
    const_cast<at::Tensor&>(noise).copy_(hostNoise);
    return resultInto(out, result);
  }
  auto slopes = at::empty_like(self);
  python::uniform_(slopes, lower.toDouble(), upper.toDouble(), generator);
  const_cast<at::Tensor&>(noise).copy_(at::where(self <= 0, slopes, at::ones_like(slopes)));
  return resultInto(out, self * noise);
}
at::Tensor rrelu_with_noise(const at::Tensor& self, const at::Tensor& noise, const at::Scalar& lower, const at::Scalar& upper,
                            bool training, c10::optional<at::Generator> generator) {
  auto out = emptyOn({0}, self.scalar_type());
  return python::rrelu_with_noise_out(self, noise, lower, upper, training, generator, out);
}
at::Tensor& rrelu_with_noise_(at::Tensor& self, const at::Tensor& noise, const at::Scalar& lower, const at::Scalar& upper,
                              bool training, c10::optional<at::Generator> generator) {
  return python::rrelu_with_noise_out(self.clone(), noise, lower, upper, training, generator, self);
}

void registerCreation(torch::Library& m) {
  m.impl("arange.start_out", TORCH_FN(arange_out));
  m.impl("linspace.out", TORCH_FN(linspace_out));
  m.impl("logspace.out", TORCH_FN(logspace_out));
  m.impl("eye.out", TORCH_FN(eye_out));
  m.impl("eye.m_out", TORCH_FN(eye_m_out));
  m.impl("tril_indices", TORCH_FN(python::tril_indices));
  m.impl("triu_indices", TORCH_FN(python::triu_indices));
  m.impl("bernoulli_.float", TORCH_FN(bernoulli_));
  m.impl("uniform_", TORCH_FN(uniform_));
  m.impl("rrelu_with_noise.out", TORCH_FN(rrelu_with_noise_out));
  m.impl("rrelu_with_noise", TORCH_FN(rrelu_with_noise));
  m.impl("rrelu_with_noise_", TORCH_FN(rrelu_with_noise_));
  m.impl("normal_", TORCH_FN(normal_));
  m.impl("exponential_", TORCH_FN(python::exponential_));
  m.impl("bernoulli_.Tensor", TORCH_FN(bernoulli_tensor_));
  m.impl("random_.from", TORCH_FN(random_from_));
  m.impl("normal.Tensor_Tensor_out", TORCH_FN(normal_tensors_out));
  m.impl("normal.Tensor_Tensor", TORCH_FN(normal_tensors));
  m.impl("normal.Tensor_float_out", TORCH_FN(normal_tensor_float_out));
  m.impl("normal.Tensor_float", TORCH_FN(normal_tensor_float));
  m.impl("normal.float_Tensor_out", TORCH_FN(normal_float_tensor_out));
  m.impl("normal.float_Tensor", TORCH_FN(normal_float_tensor));
  m.impl("cauchy_", TORCH_FN(python::cauchy_));
  m.impl("log_normal_", TORCH_FN(python::log_normal_));
  m.impl("geometric_", TORCH_FN(python::geometric_));
  m.impl("_standard_gamma", TORCH_FN(python::_standard_gamma));
  m.impl("_sample_dirichlet", TORCH_FN(python::_sample_dirichlet));
  m.impl("randperm.generator_out", TORCH_FN(randperm_out));
  m.impl("multinomial.out", TORCH_FN(multinomial_out));
  m.impl("multinomial", TORCH_FN(python::multinomial));
}

}  // namespace raccel::python
