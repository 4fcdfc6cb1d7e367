// Connectionist temporal classification on the card (speech and handwriting models'
// loss): PyTorch's _ctc_loss and its backward over the hal's ctcLattice, a work-item a
// sequence walking its forward (alpha) or backward (beta) variables in log space. The
// extended labels l' (blank, label, blank...) are picked from the targets on the card,
// where to pick them made on the host from the lengths PyTorch gives as numbers. The
// gradient is PyTorch's CPU formula: exp(lp) - exp(log sum over s with l'(s) = c of
// alpha beta + nll - lp), the sums a scatter over the classes. Other dtypes, bad lengths
// (PyTorch's own errors) and lattices past the hal's bound run on the host, counted.
#include "vmfrontend/python/torch_device.h"

namespace raccel::python {
namespace {

constexpr int64_t kMaxLattice = int64_t{1} << 24;  // T x S' a sequence (hal/tensor.cc)

// The extended labels [N, S'] (i64, negative past each sequence's 2 L + 1) and the input
// lengths [N] (i64), on the card.
struct Lattice {
  at::Tensor labels, lengths;
  int64_t extended = 0;  // S' = 2 max(L) + 1
};

// Whether the card takes these: f32 log_probs [T, N, C], i64 targets [N, S] or the
// sequences' concatenation, every length within what PyTorch accepts.
bool onCard(const at::Tensor& lp, const at::Tensor& targets, c10::IntArrayRef inputLengths, c10::IntArrayRef targetLengths,
            int64_t blank) {
  if (!isF32(lp) || lp.dim() != 3 || !onDevice(targets) || targets.scalar_type() != at::kLong ||
      (targets.dim() != 1 && targets.dim() != 2))
    return false;
  const int64_t T = lp.size(0), N = lp.size(1), C = lp.size(2);
  if (N < 1 || int64_t(inputLengths.size()) != N || int64_t(targetLengths.size()) != N || blank < 0 || blank >= C) return false;
  int64_t longest = 0, total = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (inputLengths[n] < 1 || inputLengths[n] > T || targetLengths[n] < 0) return false;
    longest = std::max(longest, targetLengths[n]);
    total += targetLengths[n];
  }
  if (targets.dim() == 2 ? (targets.size(0) != N || targets.size(1) < longest) : targets.numel() < total) return false;
  return longest < kMaxLattice && T * (2 * longest + 1) <= kMaxLattice;
}

Lattice latticeOf(const at::Tensor& targets, c10::IntArrayRef inputLengths, c10::IntArrayRef targetLengths, int64_t blank) {
  const int64_t N = int64_t(inputLengths.size());
  Lattice l;
  const int64_t longest = *std::max_element(targetLengths.begin(), targetLengths.end());
  l.extended = 2 * longest + 1;
  // Where each label sits in the targets (flattened), and which of l' are blanks or past the end.
  auto picks = at::zeros({N, std::max<int64_t>(longest, 1)}, at::kLong);
  auto past = at::zeros({N, l.extended}, at::kBool);
  auto p = picks.accessor<int64_t, 2>();
  auto e = past.accessor<bool, 2>();
  for (int64_t n = 0, offset = 0; n < N; ++n) {
    for (int64_t i = 0; i < targetLengths[n]; ++i) p[n][i] = targets.dim() == 2 ? n * longest + i : offset + i;
    for (int64_t s = 2 * targetLengths[n] + 1; s < l.extended; ++s) e[n][s] = true;
    offset += targetLengths[n];
  }
  const auto dev = targets.device();
  const auto flat = (targets.dim() == 2 ? targets.narrow(1, 0, longest) : targets).reshape({-1});
  l.labels = at::full({N, l.extended}, blank, targets.options());
  if (longest > 0) {  // the labels at l''s odd positions
    auto odd = l.labels.narrow(1, 1, 2 * longest).view({N, longest, 2}).select(2, 0);
    odd.copy_(flat.index_select(0, picks.to(dev).reshape({-1})).view({N, longest}));
  }
  l.labels.masked_fill_(past.to(dev), -1);
  l.lengths = at::tensor(inputLengths, at::kLong).to(dev);
  return l;
}

// log alpha (backward false) or log beta [N, T, S'] of every sequence.
at::Tensor latticeOnCard(const at::Tensor& lp, const Lattice& l, bool backward) {
  const int64_t T = lp.size(0), N = lp.size(1), C = lp.size(2);
  auto out = emptyOn({N, T, l.extended});
  client::TensorOp op;
  op.fn = TensorFn::ctcLattice;
  op.shape = shapeOf({N, T, l.extended, C});
  op.alpha = backward ? 1.0f : 0.0f;
  op.operands = {operand(out, {out.stride(0), out.stride(1), out.stride(2), 0}),
                 operand(lp, {lp.stride(1), lp.stride(0), 0, lp.stride(2)}),
                 operand(l.labels, {l.labels.stride(0), 0, l.labels.stride(1), 0}),
                 operand(l.lengths, {l.lengths.stride(0), 0, 0, 0})};
  Locked s;
  send(*s, op);
  return out;
}

// Positions in a [N, T, S'] lattice, flattened: (n, length - 1, s) for each n.
at::Tensor lastTimeAt(c10::IntArrayRef inputLengths, int64_t T, int64_t extended, const std::vector<int64_t>& s,
                      c10::Device dev) {
  std::vector<int64_t> positions(s.size());
  for (size_t n = 0; n < s.size(); ++n) positions[n] = (int64_t(n) * T + inputLengths[n] - 1) * extended + s[n];
  return at::tensor(positions, at::kLong).to(dev);
}

std::tuple<at::Tensor, at::Tensor> ctc_loss(const at::Tensor& lp, const at::Tensor& targets, c10::IntArrayRef inputLengths,
                                            c10::IntArrayRef targetLengths, int64_t blank, bool zeroInfinity) {
  if (!onCard(lp, targets, inputLengths, targetLengths, blank)) {
    auto [nll, alpha] = onHost("aten::_ctc_loss", [&] {
      return at::_ctc_loss(host(lp), host(targets), inputLengths, targetLengths, blank, zeroInfinity);
    });
    return {nll.to(lp.device()), alpha.to(lp.device())};
  }
  const int64_t T = lp.size(0), N = lp.size(1);
  const auto l = latticeOf(targets, inputLengths, targetLengths, blank);
  auto alpha = latticeOnCard(lp, l, false);
  // nll = -log(alpha at the last time, over the last label and the blank after it).
  std::vector<int64_t> last(N), label(N);
  auto empty = at::zeros({N}, at::kBool);
  for (int64_t n = 0; n < N; ++n) {
    last[n] = 2 * targetLengths[n];
    label[n] = std::max<int64_t>(last[n] - 1, 0);
    if (targetLengths[n] == 0) empty[n].fill_(true);
  }
  const auto flat = alpha.view({-1});
  auto a = flat.index_select(0, lastTimeAt(inputLengths, T, l.extended, last, lp.device()));
  auto b = flat.index_select(0, lastTimeAt(inputLengths, T, l.extended, label, lp.device()));
  b.masked_fill_(empty.to(lp.device()), -INFINITY);
  return {-at::logaddexp(a, b), alpha};
}

at::Tensor ctc_loss_backward(const at::Tensor& grad, const at::Tensor& lp, const at::Tensor& targets, c10::IntArrayRef inputLengths,
                             c10::IntArrayRef targetLengths, const at::Tensor& nll, const at::Tensor& logAlpha, int64_t blank,
                             bool zeroInfinity) {
  const bool ok = onCard(lp, targets, inputLengths, targetLengths, blank) && isF32(grad) && isF32(nll) && isF32(logAlpha) &&
                  logAlpha.dim() == 3;
  if (!ok)
    return onHost("aten::_ctc_loss_backward", [&] {
      return at::_ctc_loss_backward(host(grad), host(lp), host(targets), inputLengths, targetLengths, host(nll), host(logAlpha),
                                    blank, zeroInfinity)
          .to(lp.device());
    });
  const int64_t T = lp.size(0), N = lp.size(1), C = lp.size(2);
  const auto l = latticeOf(targets, inputLengths, targetLengths, blank);
  TORCH_CHECK(logAlpha.sizes() == at::IntArrayRef({N, T, l.extended}), "raccel: ctc_loss_backward's log_alpha is ",
              logAlpha.sizes(), ", not the forward's [", N, ", ", T, ", ", l.extended, "]");
  const auto ab = logAlpha + latticeOnCard(lp, l, true);  // [N, T, S']
  auto top = ab.amax(-1, true);
  top.masked_fill_(top == -INFINITY, 0);
  auto sums = at::zeros({N, T, C}, lp.options())
                  .scatter_add_(2, l.labels.clamp_min(0).unsqueeze(1).expand({N, T, l.extended}), (ab - top).exp());
  const auto lpt = lp.permute({1, 0, 2});
  auto g = (lpt.exp() - sums * (top + nll.reshape({N, 1, 1}) - lpt).exp()) * grad.reshape({N, 1, 1});
  auto after = at::zeros({N, T}, at::kBool);  // the times past each sequence's input
  for (int64_t n = 0; n < N; ++n) after[n].narrow(0, inputLengths[n], T - inputLengths[n]).fill_(true);
  g.masked_fill_(after.to(lp.device()).unsqueeze(-1), 0);
  if (zeroInfinity) g.masked_fill_((nll == INFINITY).reshape({N, 1, 1}), 0);
  return g.permute({1, 0, 2}).contiguous();
}

}  // namespace

void registerCtc(torch::Library& m) {
  m.impl("_ctc_loss", TORCH_FN(ctc_loss));
  m.impl("_ctc_loss_backward", TORCH_FN(ctc_loss_backward));
}

}  // namespace raccel::python
