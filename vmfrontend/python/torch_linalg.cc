// Linear algebra on the card: Cholesky, LU with partial pivoting, the triangular and LU
// solves, Householder QR, the symmetric eigenproblem and the singular values (the hal's
// tensor functions: a work-item a matrix, or a right-hand column), and what PyTorch builds
// from them: solve, inv, det, slogdet, cholesky_solve, solve_triangular, qr, geqrf,
// householder_product, eigh/eigvalsh, svd/svdvals (so the 2-norm and the nuclear norm),
// lstsq (gels, as on CUDA) and matrix_exp over matmuls. Their backwards are PyTorch's own formulas over these and matmuls.
// PyTorch's pivots and infos are int32: made i64 on the card and copied into int32 there
// (i32 is a storage type of copies). Each op follows PyTorch's CPU kernel step for step
// where the backward depends on it (solve and det factor A^T when A is contiguous).
// Matrices past the hal's bounds, other dtypes, and shapes of more dimensions than the
// ops take run on the host, counted.
#include "vmfrontend/python/torch_device.h"

#include <ATen/ops/_linalg_check_errors.h>

namespace raccel::python {
namespace {

// The hal's bounds on a matrix's order (hal/tensor.cc): a factorization's work-item walks
// n^3 / 3 steps, a solve's n^2.
constexpr int64_t kMaxFactorOrder = 512, kMaxSolveOrder = 4096;
// A tensor op takes 6 dimensions: a factorization [batch..., n, n], a solve [batch..., k, n, n].
constexpr int64_t kMaxFactorBatchDims = 4, kMaxSolveBatchDims = 3;

// f32 square matrices on the device, of order at most `order`, at most `batchDims` in front.
bool squareOnCard(const at::Tensor& a, int64_t order, int64_t batchDims) {
  return isF32(a) && a.dim() >= 2 && a.dim() - 2 <= batchDims && a.size(-1) == a.size(-2) && a.size(-1) <= order;
}
std::vector<int64_t> batchOf(const at::Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end() - 2); }

// The identity matrix of each of `like`'s batch entries, on the card.
at::Tensor identityLike(const at::Tensor& like) {
  auto eye = at::zeros_like(like);
  eye.diagonal(0, -2, -1).fill_(1);
  return eye;
}

// t's strides with extra entries spliced in: its batch strides, then `tail`.
std::vector<int64_t> stridesWith(const at::Tensor& t, int64_t keep, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> s(t.strides().begin(), t.strides().begin() + keep);
  s.insert(s.end(), tail);
  return s;
}

// A [batch..., n] tensor's operand over [batch..., m, n]: one element per column.
client::TensorOperand perColumn(const at::Tensor& t) { return operand(t, stridesWith(t, t.dim() - 1, {0, t.stride(-1)})); }
// A fresh vector per matrix of a [batch..., m, n], n long (tau, eigenvalues, singular values).
at::Tensor columnsOf(const at::Tensor& a, at::ScalarType dtype = at::kFloat) {
  auto sizes = batchOf(a);
  sizes.push_back(a.size(-1));
  return emptyOn(sizes, dtype);
}
// fn over a's shape [batch..., m, n], a work-item a matrix.
void sendOverMatrices(TensorFn fn, const at::Tensor& a, std::vector<client::TensorOperand> operands) {
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(a.sizes());
  op.operands = std::move(operands);
  Locked s;
  send(*s, op);
}

// ---- The four tensor functions ---------------------------------------------------------

// cholesky / luFactor of a [batch..., n, n] into fresh tensors: the factor (f32), the
// pivots (i64, [batch..., n], luFactor alone) and the info (i64, [batch...]).
struct Factored {
  at::Tensor factor, pivots, info;
};
Factored factorOnCard(TensorFn fn, const at::Tensor& a) {
  const int64_t b = a.dim() - 2;
  Factored f{emptyOn(a.sizes()), {}, emptyOn(batchOf(a), at::kLong)};
  std::vector<client::TensorOperand> operands = {operand(f.factor, f.factor.strides()), operand(a, a.strides())};
  if (fn == TensorFn::luFactor) {
    f.pivots = columnsOf(a, at::kLong);
    operands.push_back(operand(f.pivots, stridesWith(f.pivots, b, {1, 0})));
  }
  operands.push_back(operand(f.info, stridesWith(f.info, b, {0, 0})));
  sendOverMatrices(fn, a, std::move(operands));
  return f;
}

// The right-hand sides' columns solved against one matrix per batch entry: out [batch...,
// n, k] = M^-1 rhs, M a triangular `matrix` (triangularSolve, alpha its flags) or an LU
// factorization with its i64 pivots (luSolve, alpha 1 for M^T). matrix, pivots and rhs
// are already expanded to out's batch.
void solveOnCard(TensorFn fn, const at::Tensor& out, const at::Tensor& matrix, const at::Tensor* pivots, const at::Tensor& rhs,
                 float alpha) {
  const int64_t b = out.dim() - 2, n = out.size(-2), k = out.size(-1);
  auto shape = batchOf(out);
  shape.insert(shape.end(), {k, n, n});
  client::TensorOp op;
  op.fn = fn;
  op.shape = shapeOf(shape);
  op.alpha = alpha;
  op.operands = {operand(out, stridesWith(out, b, {out.stride(-1), out.stride(-2), 0})),
                 operand(matrix, stridesWith(matrix, b, {0, matrix.stride(-2), matrix.stride(-1)}))};
  if (pivots) op.operands.push_back(operand(*pivots, stridesWith(*pivots, b, {0, pivots->stride(-1), 0})));
  op.operands.push_back(operand(rhs, stridesWith(rhs, b, {rhs.stride(-1), rhs.stride(-2), 0})));
  Locked s;
  send(*s, op);
}

// The batch both broadcast to, with [rows, cols] after it.
std::vector<int64_t> broadcastBatch(const at::Tensor& a, const at::Tensor& b, int64_t rows, int64_t cols) {
  auto shape = at::infer_size(batchOf(a), batchOf(b));
  shape.insert(shape.end(), {rows, cols});
  return shape;
}
at::Tensor expandedTo(const at::Tensor& t, std::vector<int64_t> batch) {
  batch.insert(batch.end(), {t.size(-2), t.size(-1)});
  return t.expand(batch);
}
// X = T^-1 B (left) for a triangular T, or X = B T^-1 (right, as (T^-T B^T)^T), fresh.
at::Tensor triangularSolve(const at::Tensor& t, const at::Tensor& rhs, bool upper, bool left, bool unit) {
  if (!left) return triangularSolve(t.mT(), rhs.mT(), !upper, true, unit).mT();
  auto out = emptyOn(broadcastBatch(t, rhs, rhs.size(-2), rhs.size(-1)));
  auto batch = batchOf(out);
  solveOnCard(TensorFn::triangularSolve, out, expandedTo(t, batch), nullptr, expandedTo(rhs, batch),
              float((upper ? 1 : 0) | (unit ? 2 : 0)));
  return out;
}
bool solvable(const at::Tensor& m, const at::Tensor& rhs) {
  return squareOnCard(m, kMaxSolveOrder, kMaxSolveBatchDims) && isF32(rhs) && rhs.dim() >= 2 && rhs.size(-2) == m.size(-1) &&
         int64_t(at::infer_size(batchOf(m), batchOf(rhs)).size()) <= kMaxSolveBatchDims;
}

// int32 from the card's i64 (pivots, infos): a copy on the card.
void int32Into(at::Tensor& out, const at::Tensor& i64) {
  at::native::resize_output(out, i64.sizes());
  TORCH_CHECK(out.scalar_type() == at::kInt, "raccel: pivots and infos are int32, not ", out.scalar_type());
  elementwise(TensorFn::copy, out, &i64, nullptr);
}

// ---- torch.linalg --------------------------------------------------------------------

void linalg_check_errors(const at::Tensor& info, c10::string_view api, bool isMatrix) {
  at::_linalg_check_errors(info.cpu(), api, isMatrix);  // PyTorch's messages (a read, as on CUDA)
}

std::tuple<at::Tensor&, at::Tensor&> linalg_cholesky_ex_out(const at::Tensor& self, bool upper, bool checkErrors, at::Tensor& L,
                                                            at::Tensor& info) {
  if (!squareOnCard(self, kMaxFactorOrder, kMaxFactorBatchDims) || !isF32(L) || !onDevice(info)) {
    auto [l, i] = onHost("aten::linalg_cholesky_ex", [&] { return at::linalg_cholesky_ex(host(self), upper, checkErrors); });
    resultInto(L, l);
    resultInto(info, i);
    return {L, info};
  }
  // upper: U = L^T, the factor of A^T's lower triangle (A's upper) made through transposes.
  auto f = factorOnCard(TensorFn::cholesky, upper ? self.mT() : self);
  resultInto(L, upper ? f.factor.mT() : f.factor);
  int32Into(info, f.info);
  if (checkErrors) linalg_check_errors(info, "linalg.cholesky_ex", self.dim() == 2);
  return {L, info};
}

// LU of a square matrix (pivoting: PyTorch's CPU has no other), or on the host.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> linalg_lu_factor_ex_out(const at::Tensor& A, bool pivot, bool checkErrors,
                                                                          at::Tensor& LU, at::Tensor& pivots, at::Tensor& info) {
  if (!pivot || !squareOnCard(A, kMaxFactorOrder, kMaxFactorBatchDims) || !isF32(LU) || !onDevice(pivots) || !onDevice(info)) {
    auto [lu, p, i] = onHost("aten::linalg_lu_factor_ex", [&] { return at::linalg_lu_factor_ex(host(A), pivot, checkErrors); });
    resultInto(LU, lu);
    resultInto(pivots, p);
    resultInto(info, i);
    return {LU, pivots, info};
  }
  auto f = factorOnCard(TensorFn::luFactor, A);
  resultInto(LU, f.factor);
  int32Into(pivots, f.pivots);
  int32Into(info, f.info);
  if (checkErrors) linalg_check_errors(info, "torch.linalg.lu_factor_ex", A.dim() == 2);
  return {LU, pivots, info};
}

// X = A^-1 B from A's LU (A^-T B with adjoint; right-hand: X A = B as A^T X^T = B^T).
at::Tensor& linalg_lu_solve_out(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B, bool left, bool adjoint,
                                at::Tensor& out) {
  const auto rhs = left ? B : B.mT();
  if (!solvable(LU, rhs) || !onDevice(pivots) || pivots.scalar_type() != at::kInt || pivots.dim() != LU.dim() - 1 || !isF32(out))
    return hostInto("aten::linalg_lu_solve", out,
                    at::linalg_lu_solve(host(LU), host(pivots), host(B), left, adjoint));
  auto x = emptyOn(broadcastBatch(LU, rhs, rhs.size(-2), rhs.size(-1)));
  auto batch = batchOf(x);
  const auto wide = pivots.to(at::kLong);  // int32 -> i64 on the card
  auto pivotBatch = batch;
  pivotBatch.push_back(LU.size(-1));
  const auto widePivots = wide.expand(pivotBatch);
  solveOnCard(TensorFn::luSolve, x, expandedTo(LU, batch), &widePivots, expandedTo(rhs, batch),
              (adjoint != !left) ? 1.0f : 0.0f);
  return resultInto(out, left ? x : x.mT());
}

// PyTorch's linalg_solve_is_vector_rhs: B a vector (per batch entry) rather than a matrix.
bool vectorRhs(const at::Tensor& A, const at::Tensor& B) {
  return B.dim() == 1 || (A.dim() - 1 == B.dim() && B.sizes() == A.sizes().slice(0, A.dim() - 1));
}

// As PyTorch's CPU kernel: the LU of A^T when A is contiguous (solved with adjoint), which
// linalg_solve's backward assumes of the LU it is given.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&> linalg_solve_ex_out(const at::Tensor& A, const at::Tensor& B, bool left,
                                                                                 bool checkErrors, at::Tensor& result, at::Tensor& LU,
                                                                                 at::Tensor& pivots, at::Tensor& info) {
  const bool vector = vectorRhs(A, B);
  const auto rhs = vector ? B.unsqueeze(-1) : B;
  if (!squareOnCard(A, kMaxFactorOrder, kMaxSolveBatchDims) || !solvable(A, left ? rhs : rhs.mT()) || (vector && !left)) {
    auto r = onHost("aten::_linalg_solve_ex", [&] { return at::_linalg_solve_ex(host(A), host(B), left, checkErrors); });
    resultInto(result, std::get<0>(r));
    resultInto(LU, std::get<1>(r));
    resultInto(pivots, std::get<2>(r));
    resultInto(info, std::get<3>(r));
    return {result, LU, pivots, info};
  }
  const bool useAT = A.is_contiguous();
  python::linalg_lu_factor_ex_out(useAT ? A.mT() : A, true, false, LU, pivots, info);
  if (checkErrors) linalg_check_errors(info, "torch.linalg.solve_ex", A.dim() == 2);
  auto x = emptyOn({0});
  python::linalg_lu_solve_out(LU, pivots, rhs, left, useAT, x);
  resultInto(result, vector ? x.squeeze(-1) : x);
  return {result, LU, pivots, info};
}

std::tuple<at::Tensor&, at::Tensor&> linalg_inv_ex_out(const at::Tensor& A, bool checkErrors, at::Tensor& inverse, at::Tensor& info) {
  if (!squareOnCard(A, kMaxFactorOrder, kMaxSolveBatchDims) || !isF32(inverse) || !onDevice(info)) {
    auto [inv, i] = onHost("aten::linalg_inv_ex", [&] { return at::linalg_inv_ex(host(A), checkErrors); });
    resultInto(inverse, inv);
    resultInto(info, i);
    return {inverse, info};
  }
  const auto eye = identityLike(A);
  auto LU = emptyOn({0}), pivots = emptyOn({0}, at::kInt);
  python::linalg_solve_ex_out(A, eye, true, false, inverse, LU, pivots, info);
  if (checkErrors) linalg_check_errors(info, "linalg.inv_ex", A.dim() == 2);
  return {inverse, info};
}

// The determinant's sign from the pivots: -1 for each row an LU step swapped.
at::Tensor pivotSign(const Factored& f) {
  const int64_t n = f.pivots.size(-1);
  auto steps = at::arange(1, n + 1, f.pivots.options());
  auto swaps = f.pivots.ne(steps).sum(-1);
  return (1 - 2 * swaps.remainder(2)).to(at::kFloat);
}
// det and slogdet as PyTorch's CPU kernels: the LU of A^T when A is contiguous (det(A^T)
// = det(A); their backwards assume it of the LU and pivots they are given).
Factored detFactors(const at::Tensor& A, at::Tensor& LU, at::Tensor& pivots) {
  auto f = factorOnCard(TensorFn::luFactor, A.is_contiguous() ? A.mT() : A);
  resultInto(LU, f.factor);
  int32Into(pivots, f.pivots);
  return f;
}
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> linalg_det_out(const at::Tensor& A, at::Tensor& result, at::Tensor& LU,
                                                                 at::Tensor& pivots) {
  if (!squareOnCard(A, kMaxFactorOrder, kMaxFactorBatchDims) || !isF32(result)) {
    auto r = onHost("aten::_linalg_det", [&] { return at::_linalg_det(host(A)); });
    resultInto(result, std::get<0>(r));
    resultInto(LU, std::get<1>(r));
    resultInto(pivots, std::get<2>(r));
    return {result, LU, pivots};
  }
  auto f = detFactors(A, LU, pivots);
  resultInto(result, pivotSign(f) * f.factor.diagonal(0, -2, -1).prod(-1));
  return {result, LU, pivots};
}
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&> linalg_slogdet_out(const at::Tensor& A, at::Tensor& sign,
                                                                                at::Tensor& logabsdet, at::Tensor& LU,
                                                                                at::Tensor& pivots) {
  if (!squareOnCard(A, kMaxFactorOrder, kMaxFactorBatchDims) || !isF32(sign) || !isF32(logabsdet)) {
    auto r = onHost("aten::_linalg_slogdet", [&] { return at::_linalg_slogdet(host(A)); });
    resultInto(sign, std::get<0>(r));
    resultInto(logabsdet, std::get<1>(r));
    resultInto(LU, std::get<2>(r));
    resultInto(pivots, std::get<3>(r));
    return {sign, logabsdet, LU, pivots};
  }
  auto f = detFactors(A, LU, pivots);
  auto diagonal = f.factor.diagonal(0, -2, -1);
  resultInto(sign, pivotSign(f) * diagonal.sign().prod(-1));
  resultInto(logabsdet, diagonal.abs().log().sum(-1));
  return {sign, logabsdet, LU, pivots};
}

at::Tensor& linalg_solve_triangular_out(const at::Tensor& self, const at::Tensor& B, bool upper, bool left, bool unitriangular,
                                        at::Tensor& out) {
  if (!solvable(left ? self : self.mT(), left ? B : B.mT()) || !isF32(out))
    return hostInto("aten::linalg_solve_triangular", out, at::linalg_solve_triangular(host(self), host(B), upper, left, unitriangular));
  return resultInto(out, triangularSolve(self, B, upper, left, unitriangular));
}
at::Tensor linalg_solve_triangular(const at::Tensor& self, const at::Tensor& B, bool upper, bool left, bool unitriangular) {
  if (!solvable(left ? self : self.mT(), left ? B : B.mT()))
    return onHost("aten::linalg_solve_triangular",
                  [&] { return at::linalg_solve_triangular(host(self), host(B), upper, left, unitriangular).to(self.device()); });
  return triangularSolve(self, B, upper, left, unitriangular);
}

// cholesky_solve's kernel (its arguments already broadcast): X = (L L^T)^-1 B, or
// (U^T U)^-1 B: two triangular solves.
at::Tensor cholesky_solve_helper(const at::Tensor& self, const at::Tensor& A, bool upper) {
  if (!solvable(A, self))
    return onHost("aten::_cholesky_solve_helper",
                  [&] { return at::_cholesky_solve_helper(host(self), host(A), upper).to(self.device()); });
  auto y = triangularSolve(upper ? A.mT() : A, self, false, true, false);
  return triangularSolve(upper ? A : A.mT(), y, true, true, false);
}

// A = P L U unpacked from a square LU and its pivots: L's unit diagonal and U's triangle
// cut from LU, and P from the pivots' swaps as the luSolve kernel applies them (to the
// identity, with an identity for L and U: it gives P^T).
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> lu_unpack_out(const at::Tensor& LU, const at::Tensor& pivots, bool unpackData,
                                                                bool unpackPivots, at::Tensor& P, at::Tensor& L, at::Tensor& U) {
  if (!squareOnCard(LU, kMaxSolveOrder, kMaxSolveBatchDims) || !onDevice(pivots) || pivots.scalar_type() != at::kInt ||
      pivots.dim() != LU.dim() - 1 || !isF32(P) || !isF32(L) || !isF32(U)) {
    auto [p, l, u] = onHost("aten::lu_unpack", [&] { return at::lu_unpack(host(LU), host(pivots), unpackData, unpackPivots); });
    resultInto(P, p), resultInto(L, l), resultInto(U, u);
    return {P, L, U};
  }
  const auto eye = identityLike(LU);
  if (unpackData) {
    resultInto(L, LU.tril(-1) + eye);
    resultInto(U, LU.triu());
  } else {
    at::native::resize_output(L, {0});
    at::native::resize_output(U, {0});
  }
  if (!unpackPivots) {
    at::native::resize_output(P, {0});
    return {P, L, U};
  }
  const auto wide = pivots.to(at::kLong);  // int32 -> i64 on the card
  auto transposed = emptyOn(LU.sizes());
  solveOnCard(TensorFn::luSolve, transposed, eye, &wide, eye, 0);
  resultInto(P, transposed.mT());
  return {P, L, U};
}

// torch.linalg.lu: the factorization, unpacked.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> linalg_lu_out(const at::Tensor& A, bool pivot, at::Tensor& P, at::Tensor& L,
                                                                at::Tensor& U) {
  if (!pivot || !squareOnCard(A, kMaxFactorOrder, kMaxSolveBatchDims) || !isF32(P) || !isF32(L) || !isF32(U)) {
    auto [p, l, u] = onHost("aten::linalg_lu", [&] { return at::linalg_lu(host(A), pivot); });
    resultInto(P, p), resultInto(L, l), resultInto(U, u);
    return {P, L, U};
  }
  auto LU = emptyOn({0}), pivots = emptyOn({0}, at::kInt), info = emptyOn({0}, at::kInt);
  python::linalg_lu_factor_ex_out(A, true, false, LU, pivots, info);
  return lu_unpack_out(LU, pivots, true, true, P, L, U);
}

// ---- Orthogonal factorizations: QR, the symmetric eigenproblem, the singular values ------

// The hal's bounds (hal/tensor.cc): a QR's m and n at most 512, an eigenproblem's n 256,
// the singular values' m 512 and n 256 (n <= m).
constexpr int64_t kMaxEigenOrder = 256;
bool matrixOnCard(const at::Tensor& a, int64_t order) {
  return isF32(a) && a.dim() >= 2 && a.dim() - 2 <= kMaxFactorBatchDims && a.size(-2) <= order && a.size(-1) <= order;
}
// geqrf of [batch..., m, n] into fresh tensors: R over the Householder vectors, and tau
// [batch..., min(m, n)].
std::pair<at::Tensor, at::Tensor> qrOnCard(const at::Tensor& a) {
  auto factor = emptyOn(a.sizes()), tau = columnsOf(a);
  sendOverMatrices(TensorFn::qrFactor, a, {operand(factor, factor.strides()), operand(a, a.strides()), perColumn(tau)});
  return {factor, tau.narrow(-1, 0, std::min(a.size(-2), a.size(-1)))};
}
// The first n columns of H_0 ... H_{k-1} from reflectors [batch..., m, n] (n <= m) and tau
// [batch..., k] (k <= n; the rest taken as 0, the identity), fresh.
at::Tensor householderOnCard(const at::Tensor& reflectors, const at::Tensor& tau) {
  auto full = tau;
  if (tau.size(-1) < reflectors.size(-1)) {
    full = at::zeros_like(columnsOf(reflectors));
    full.narrow(-1, 0, tau.size(-1)).copy_(tau);
  }
  auto q = emptyOn(reflectors.sizes());
  sendOverMatrices(TensorFn::householderProduct, reflectors,
                   {operand(q, q.strides()), operand(reflectors, reflectors.strides()), perColumn(full)});
  return q;
}

// The whole m x m Q of a geqrf of [batch..., m, n] (n < m): its reflectors in the first n
// columns of an m x m, the rest identities.
at::Tensor completeQ(const at::Tensor& factor, const at::Tensor& tau) {
  auto square = batchOf(factor);
  square.insert(square.end(), {factor.size(-2), factor.size(-2)});
  auto reflectors = at::zeros(square, factor.options());
  reflectors.narrow(-1, 0, factor.size(-1)).copy_(factor);
  return householderOnCard(reflectors, tau);
}

std::tuple<at::Tensor&, at::Tensor&> geqrf_out(const at::Tensor& self, at::Tensor& a, at::Tensor& tau) {
  if (!matrixOnCard(self, kMaxFactorOrder) || !isF32(a) || !isF32(tau)) {
    auto [f, t] = onHost("aten::geqrf", [&] { return at::geqrf(host(self)); });
    resultInto(a, f), resultInto(tau, t);
    return {a, tau};
  }
  auto [f, t] = qrOnCard(self);
  resultInto(a, f), resultInto(tau, t);
  return {a, tau};
}
std::tuple<at::Tensor, at::Tensor> geqrf(const at::Tensor& self) {
  auto a = emptyOn({0}), tau = emptyOn({0});
  geqrf_out(self, a, tau);
  return {a, tau};
}

at::Tensor& linalg_householder_product_out(const at::Tensor& input, const at::Tensor& tau, at::Tensor& out) {
  const bool ok = matrixOnCard(input, kMaxFactorOrder) && isF32(tau) && isF32(out) && input.size(-1) <= input.size(-2) &&
                  tau.dim() == input.dim() - 1 && tau.size(-1) <= input.size(-1) &&
                  tau.sizes().slice(0, tau.dim() - 1) == input.sizes().slice(0, input.dim() - 2);
  if (!ok)
    return hostInto("aten::linalg_householder_product", out, at::linalg_householder_product(host(input), host(tau)));
  return resultInto(out, householderOnCard(input, tau));
}
at::Tensor linalg_householder_product(const at::Tensor& input, const at::Tensor& tau) {
  auto out = emptyOn({0});
  return linalg_householder_product_out(input, tau, out);
}

// A = Q R (mode reduced: Q [m, k], R [k, n], k = min(m, n); complete: Q [m, m], R [m, n];
// r: R alone): LAPACK's geqrf and orgqr, as PyTorch's CPU (R's diagonal of either sign).
std::tuple<at::Tensor&, at::Tensor&> linalg_qr_out(const at::Tensor& A, c10::string_view mode, at::Tensor& Q, at::Tensor& R) {
  const bool known = mode == "reduced" || mode == "complete" || mode == "r";
  if (!known || !matrixOnCard(A, kMaxFactorOrder) || !isF32(Q) || !isF32(R)) {
    auto [q, r] = onHost("aten::linalg_qr", [&] { return at::linalg_qr(host(A), mode); });
    resultInto(Q, q), resultInto(R, r);
    return {Q, R};
  }
  const int64_t m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  auto [factor, tau] = qrOnCard(A);
  const bool complete = mode == "complete" && m > n;
  resultInto(R, (complete ? factor : factor.narrow(-2, 0, k)).triu());
  if (mode == "r") {
    at::native::resize_output(Q, {0});
    return {Q, R};
  }
  return {resultInto(Q, complete ? completeQ(factor, tau) : householderOnCard(factor.narrow(-1, 0, k), tau)), R};
}

// The eigenvalues (ascending) and unit eigenvectors of symmetric matrices, from the lower
// triangle (UPLO "L") or the upper: Jacobi's rotations on the card. The vectors' signs are
// the rotations', not LAPACK's: either is an eigenvector.
std::tuple<at::Tensor&, at::Tensor&> linalg_eigh_out(const at::Tensor& A, c10::string_view uplo, bool computeV,
                                                     at::Tensor& eigenvalues, at::Tensor& eigenvectors) {
  const bool ok = (uplo == "L" || uplo == "U" || uplo == "l" || uplo == "u") && matrixOnCard(A, kMaxEigenOrder) &&
                  A.size(-1) == A.size(-2) && isF32(eigenvalues) && (!computeV || isF32(eigenvectors));
  if (!ok) {
    auto [w, v] = onHost("aten::_linalg_eigh", [&] { return at::_linalg_eigh(host(A), uplo, computeV); });
    resultInto(eigenvalues, w), resultInto(eigenvectors, v);
    return {eigenvalues, eigenvectors};
  }
  const auto lower = uplo == "L" || uplo == "l" ? A : A.mT();
  auto v = emptyOn(A.sizes()), scratch = emptyOn(A.sizes()), w = columnsOf(A);
  sendOverMatrices(TensorFn::symmetricEigen, A,
                   {operand(v, v.strides()), operand(lower, lower.strides()), perColumn(w), operand(scratch, scratch.strides())});
  resultInto(eigenvalues, w);
  if (computeV) resultInto(eigenvectors, v);
  else at::native::resize_output(eigenvectors, {0});
  return {eigenvalues, eigenvectors};
}

// Q [batch..., m, k] with orthonormal columns, completed to [batch..., m, m]: the columns
// of the complete Q of Q's own QR past its k (orthogonal to Q's span).
at::Tensor completedBasis(const at::Tensor& q) {
  auto [factor, tau] = qrOnCard(q);
  return at::cat({q, completeQ(factor, tau).narrow(-1, q.size(-1), q.size(-2) - q.size(-1))}, -1);
}

// A = U diag(S) Vh, S descending: one-sided Jacobi on the card over A, or over A^T when A
// is wide (A^T = V S U^T). full_matrices completes the longer side's vectors to a basis.
// The vectors' signs are the rotations', not LAPACK's: either pair gives A.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> linalg_svd_out(const at::Tensor& A, bool fullMatrices, bool computeUV,
                                                                 c10::optional<c10::string_view> driver, at::Tensor& U,
                                                                 at::Tensor& S, at::Tensor& Vh) {
  const bool wide = A.dim() >= 2 && A.size(-2) < A.size(-1);
  const auto tall = wide ? A.mT() : A;
  const bool ok = !driver && isF32(A) && A.dim() >= 2 && A.dim() - 2 <= kMaxFactorBatchDims && tall.size(-2) <= kMaxFactorOrder &&
                  tall.size(-1) <= kMaxEigenOrder && isF32(S) && (!computeUV || (isF32(U) && isF32(Vh)));
  if (!ok) {
    auto [u, s, vh] = onHost("aten::_linalg_svd", [&] { return at::_linalg_svd(host(A), fullMatrices, computeUV, driver); });
    resultInto(U, u), resultInto(S, s), resultInto(Vh, vh);
    return {U, S, Vh};
  }
  auto u = emptyOn(tall.sizes()), v = emptyOn(tall.sizes()), s = columnsOf(tall);
  sendOverMatrices(TensorFn::singularValues, tall, {operand(u, u.strides()), operand(tall, tall.strides()), perColumn(s),
                                                    operand(v, v.strides())});
  resultInto(S, s);
  if (!computeUV) {
    at::native::resize_output(U, {0});
    at::native::resize_output(Vh, {0});
    return {U, S, Vh};
  }
  auto left = u, right = v.narrow(-2, 0, tall.size(-1));  // tall = left diag(s) right^T
  if (fullMatrices && tall.size(-2) != tall.size(-1)) left = completedBasis(left);
  resultInto(U, wide ? right : left);
  resultInto(Vh, (wide ? left : right).mT());
  return {U, S, Vh};
}

// min ||A X - B|| as LAPACK's gels (PyTorch's driver on CUDA; A taken to be of full rank):
// a tall A through its QR, X = R^-1 Q^T B, with the residuals ||A X - B||^2 per column
// when m > n; a wide A through A^T's, the least-norm X = Q R^-T B. rank and
// singular_values are left empty, as gels leaves them. Other drivers run on the host.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&> linalg_lstsq_out(const at::Tensor& A, const at::Tensor& B,
                                                                                c10::optional<double> rcond,
                                                                                c10::optional<c10::string_view> driver,
                                                                                at::Tensor& solution, at::Tensor& residuals,
                                                                                at::Tensor& rank, at::Tensor& singularValues) {
  const bool vector = A.dim() >= 2 && vectorRhs(A, B);
  const auto rhs = vector ? B.unsqueeze(-1) : B;
  const bool ok = (!driver || *driver == "gels") && matrixOnCard(A, kMaxFactorOrder) && A.dim() - 2 <= kMaxSolveBatchDims &&
                  isF32(rhs) && rhs.dim() >= 2 && rhs.size(-2) == A.size(-2) &&
                  int64_t(at::infer_size(batchOf(A), batchOf(rhs)).size()) <= kMaxSolveBatchDims && isF32(solution) &&
                  isF32(residuals);
  if (!ok) {
    auto r = onHost("aten::linalg_lstsq", [&] { return at::linalg_lstsq(host(A), host(B), rcond, driver); });
    resultInto(solution, std::get<0>(r)), resultInto(residuals, std::get<1>(r));
    resultInto(rank, std::get<2>(r)), resultInto(singularValues, std::get<3>(r));
    return {solution, residuals, rank, singularValues};
  }
  const int64_t m = A.size(-2), n = A.size(-1);
  at::Tensor x;
  if (m >= n) {
    auto [factor, tau] = qrOnCard(A);
    x = triangularSolve(factor.narrow(-2, 0, n), at::matmul(householderOnCard(factor, tau).mT(), rhs), true, true, false);
  } else {
    auto [factor, tau] = qrOnCard(A.mT());
    x = at::matmul(householderOnCard(factor, tau), triangularSolve(factor.narrow(-2, 0, m).mT(), rhs, false, true, false));
  }
  if (m > n) resultInto(residuals, (at::matmul(A, x) - rhs).pow(2).sum(-2));
  else at::native::resize_output(residuals, {0});
  resultInto(solution, vector ? x.squeeze(-1) : x);
  at::native::resize_output(rank, {0});
  at::native::resize_output(singularValues, {0});
  return {solution, residuals, rank, singularValues};
}

// exp(A) of square matrices: A / 2^s, s from the batch's largest 1-norm (one read, as
// PyTorch's CUDA kernel reads its norms), through Taylor's series to degree 18 by Horner's
// steps (matmuls), squared s times. With the norm at most 1, the series' remainder (under
// e / 19!) is far below f32's rounding. Its backward is PyTorch's: this of a block matrix.
at::Tensor linalg_matrix_exp(const at::Tensor& self) {
  if (!isF32(self) || self.dim() < 2 || self.dim() > 6 || self.size(-1) != self.size(-2))
    return onHost("aten::linalg_matrix_exp", [&] { return at::linalg_matrix_exp(host(self)).to(self.device()); });
  if (self.numel() == 0) return emptyOn(self.sizes());
  const double norm = self.abs().sum(-2).amax(-1).max().item<double>();
  if (!std::isfinite(norm)) return at::full_like(self, std::numeric_limits<float>::quiet_NaN());
  const int squarings = norm > 1 ? std::min(128, int(std::ceil(std::log2(norm)))) : 0;
  const auto a = self * std::ldexp(1.0, -squarings);
  const auto eye = identityLike(self);
  auto e = eye + a / 18;
  for (int k = 17; k >= 1; --k) e = at::matmul(a, e).div_(k).add_(eye);
  for (int i = 0; i < squarings; ++i) e = at::matmul(e, e);
  return e;
}

// a x b along `dim` (of size 3): each component from the other two, rolled into place.
at::Tensor& linalg_cross_out(const at::Tensor& self, const at::Tensor& other, int64_t dim, at::Tensor& out) {
  if (!supported({&self, &other, &out}) || self.dim() == 0 || other.dim() == 0 || self.dim() != other.dim())
    return hostInto("aten::linalg_cross", out, at::linalg_cross(host(self), host(other), dim));
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(self.size(dim) == 3 && other.size(dim) == 3, "linalg.cross: inputs dimension ", dim, " must have length 3. Got ",
              self.size(dim), " and ", other.size(dim));
  auto x = self.roll(-1, dim) * other.roll(-2, dim) - self.roll(-2, dim) * other.roll(-1, dim);
  return resultInto(out, x);
}

}  // namespace

void registerLinalg(torch::Library& m) {
  m.impl("_linalg_check_errors", TORCH_FN(linalg_check_errors));
  m.impl("linalg_cholesky_ex.L", TORCH_FN(linalg_cholesky_ex_out));
  m.impl("linalg_lu_factor_ex.out", TORCH_FN(linalg_lu_factor_ex_out));
  m.impl("linalg_lu_solve.out", TORCH_FN(linalg_lu_solve_out));
  m.impl("_linalg_solve_ex.result", TORCH_FN(linalg_solve_ex_out));
  m.impl("linalg_inv_ex.inverse", TORCH_FN(linalg_inv_ex_out));
  m.impl("_linalg_det.result", TORCH_FN(linalg_det_out));
  m.impl("_linalg_slogdet.sign", TORCH_FN(linalg_slogdet_out));
  m.impl("linalg_solve_triangular.out", TORCH_FN(linalg_solve_triangular_out));
  m.impl("linalg_solve_triangular", TORCH_FN(linalg_solve_triangular));
  m.impl("_cholesky_solve_helper", TORCH_FN(cholesky_solve_helper));
  m.impl("linalg_cross.out", TORCH_FN(linalg_cross_out));
  m.impl("lu_unpack.out", TORCH_FN(lu_unpack_out));
  m.impl("linalg_lu.out", TORCH_FN(linalg_lu_out));
  m.impl("geqrf.a", TORCH_FN(geqrf_out));
  m.impl("geqrf", TORCH_FN(geqrf));
  m.impl("linalg_householder_product.out", TORCH_FN(linalg_householder_product_out));
  m.impl("linalg_householder_product", TORCH_FN(linalg_householder_product));
  m.impl("linalg_qr.out", TORCH_FN(linalg_qr_out));
  m.impl("_linalg_eigh.eigenvalues", TORCH_FN(linalg_eigh_out));
  m.impl("_linalg_svd.U", TORCH_FN(linalg_svd_out));
  m.impl("linalg_matrix_exp", TORCH_FN(linalg_matrix_exp));
  m.impl("linalg_lstsq.out", TORCH_FN(linalg_lstsq_out));
}

}  // namespace raccel::python
