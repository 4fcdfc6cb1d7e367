#include "hal/tensor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string_view>

#include "common/limits.h"
#include "hal/device.h"
#include "hal/tensor_kernels_source.h"

namespace raccel::hal {

static_assert(RC_COPY == int(TensorFn::copy) && RC_FILL == int(TensorFn::fill) && RC_ADD == int(TensorFn::add) &&
              RC_MUL == int(TensorFn::mul) && RC_DIV == int(TensorFn::div) && RC_RELU == int(TensorFn::relu) &&
              RC_THRESHOLD_BACKWARD == int(TensorFn::thresholdBackward) && RC_EXPFN == int(TensorFn::exp) &&
              RC_LOGFN == int(TensorFn::log) && RC_AFFINE == int(TensorFn::affine));
static_assert(RC_SQRTFN == int(TensorFn::sqrt) && RC_TANHFN == int(TensorFn::tanh) && RC_SIGMOID == int(TensorFn::sigmoid) &&
              RC_TANH_BACKWARD == int(TensorFn::tanhBackward) && RC_SIGMOID_BACKWARD == int(TensorFn::sigmoidBackward) &&
              RC_ADDCMUL == int(TensorFn::addcmul) && RC_ADDCDIV == int(TensorFn::addcdiv) &&
              RC_MAXIMUM == int(TensorFn::maximum) && RC_MINIMUM == int(TensorFn::minimum) && RC_ABSFN == int(TensorFn::abs) &&
              RC_POWFN == int(TensorFn::pow) && RC_LAYER_NORM == int(TensorFn::layerNorm) &&
              RC_LAYER_NORM_BACKWARD == int(TensorFn::layerNormBackward));
static_assert(RC_GELU == int(TensorFn::gelu) && RC_GELU_BACKWARD == int(TensorFn::geluBackward) && RC_SILU == int(TensorFn::silu) &&
              RC_SILU_BACKWARD == int(TensorFn::siluBackward) && RC_LEAKY_RELU == int(TensorFn::leakyRelu) &&
              RC_LEAKY_RELU_BACKWARD == int(TensorFn::leakyReluBackward) && RC_SOFTPLUS == int(TensorFn::softplus) &&
              RC_SOFTPLUS_BACKWARD == int(TensorFn::softplusBackward) && RC_HARDTANH == int(TensorFn::hardtanh) &&
              RC_HARDTANH_BACKWARD == int(TensorFn::hardtanhBackward) && RC_SOFTMAX == int(TensorFn::softmax) &&
              RC_SOFTMAX_BACKWARD == int(TensorFn::softmaxBackward) && RC_SIGN == int(TensorFn::sign) &&
              RC_EQ == int(TensorFn::eq) && RC_NE == int(TensorFn::ne) && RC_LT == int(TensorFn::lt) &&
              RC_LE == int(TensorFn::le) && RC_GT == int(TensorFn::gt) && RC_GE == int(TensorFn::ge));
static_assert(RC_SUM == int(TensorFn::sum) && RC_WHERE == int(TensorFn::where) && RC_CLAMP == int(TensorFn::clamp) &&
              RC_LOG1PFN == int(TensorFn::log1p) && RC_RECIPROCAL == int(TensorFn::reciprocal) &&
              RC_RSQRT == int(TensorFn::rsqrt) && RC_ELU == int(TensorFn::elu) && RC_ELU_BACKWARD == int(TensorFn::eluBackward) &&
              RC_LERP == int(TensorFn::lerp) && RC_AMAX == int(TensorFn::amax) && RC_AMIN == int(TensorFn::amin) &&
              RC_ARGMAX == int(TensorFn::argmax) && RC_ARGMIN == int(TensorFn::argmin) &&
              RC_INDEX_SELECT == int(TensorFn::indexSelect) && RC_INDEX_ADD == int(TensorFn::indexAdd) &&
              RC_UNIFORM == int(TensorFn::uniform) && RC_BERNOULLI == int(TensorFn::bernoulli) &&
              RC_NORMAL == int(TensorFn::normal) && RC_GATHER_SUM == int(TensorFn::gatherSum) &&
              RC_MAX_POOL == int(TensorFn::maxPool2d) && RC_MAX_POOL_BACKWARD == int(TensorFn::maxPool2dBackward) &&
              RC_HARDSWISH == int(TensorFn::hardswish) && RC_HARDSWISH_BACKWARD == int(TensorFn::hardswishBackward) &&
              RC_HARDSIGMOID == int(TensorFn::hardsigmoid) &&
              RC_HARDSIGMOID_BACKWARD == int(TensorFn::hardsigmoidBackward) && RC_MISH == int(TensorFn::mish) &&
              RC_MISH_BACKWARD == int(TensorFn::mishBackward) && RC_SORT == int(TensorFn::sort));
static_assert(RC_FLOORFN == int(TensorFn::floor) && RC_CEILFN == int(TensorFn::ceil) && RC_ROUNDFN == int(TensorFn::round) &&
              RC_TRUNCFN == int(TensorFn::trunc) && RC_FRACFN == int(TensorFn::frac) && RC_SINFN == int(TensorFn::sin) &&
              RC_COSFN == int(TensorFn::cos) && RC_TANFN == int(TensorFn::tan) && RC_ASINFN == int(TensorFn::asin) &&
              RC_ACOSFN == int(TensorFn::acos) && RC_ATANFN == int(TensorFn::atan) && RC_SINHFN == int(TensorFn::sinh) &&
              RC_COSHFN == int(TensorFn::cosh) && RC_ERFFN == int(TensorFn::erf) && RC_ERFCFN == int(TensorFn::erfc) &&
              RC_EXPM1FN == int(TensorFn::expm1) && RC_LOG2FN == int(TensorFn::log2) && RC_LOG10FN == int(TensorFn::log10) &&
              RC_EXP2FN == int(TensorFn::exp2) && RC_ATAN2FN == int(TensorFn::atan2) && RC_HYPOTFN == int(TensorFn::hypot) &&
              RC_COPYSIGNFN == int(TensorFn::copysign) && RC_FMODFN == int(TensorFn::fmod) &&
              RC_LGAMMAFN == int(TensorFn::lgamma) && RC_DIGAMMAFN == int(TensorFn::digamma) &&
              RC_ERFINVFN == int(TensorFn::erfinv) && RC_BITAND == int(TensorFn::bitwiseAnd) &&
              RC_BITOR == int(TensorFn::bitwiseOr) && RC_BITXOR == int(TensorFn::bitwiseXor) &&
              RC_SHIFT_LEFT == int(TensorFn::shiftLeft) && RC_SHIFT_RIGHT == int(TensorFn::shiftRight) &&
              RC_POLYGAMMAFN == int(TensorFn::polygamma) && RC_CHOLESKY == int(TensorFn::cholesky) &&
              RC_TRIANGULAR_SOLVE == int(TensorFn::triangularSolve) && RC_LU_FACTOR == int(TensorFn::luFactor) &&
              RC_LU_SOLVE == int(TensorFn::luSolve) && RC_GCD == int(TensorFn::gcd) &&
              RC_INDEX_REDUCE == int(TensorFn::indexReduce) && RC_QR_FACTOR == int(TensorFn::qrFactor) &&
              RC_HOUSEHOLDER_PRODUCT == int(TensorFn::householderProduct) &&
              RC_SYMMETRIC_EIGEN == int(TensorFn::symmetricEigen) &&
              RC_SINGULAR_VALUES == int(TensorFn::singularValues) && RC_CTC_LATTICE == int(TensorFn::ctcLattice) &&
              kTensorFns == RC_CTC_LATTICE + 1);
static_assert(RC_T_F32 == int(TensorType::f32) && RC_T_I64 == int(TensorType::i64) && RC_T_BOOL == int(TensorType::boolean) &&
              RC_T_I32 == int(TensorType::i32) && RC_T_F64 == int(TensorType::f64) &&
              RC_T_F16 == int(TensorType::f16) && RC_T_BF16 == int(TensorType::bf16) && kTensorTypes == 7);

namespace {
struct FnInfo {
  const char* name;
  unsigned operands;
  const char* kernel;
};
constexpr FnInfo kFns[kTensorFns] = {
    {"copy", 2, "rc_map"},      {"fill", 1, "rc_map"},
    {"add", 3, "rc_map"},       {"mul", 3, "rc_map"},
    {"div", 3, "rc_map"},       {"relu", 2, "rc_map"},
    {"thresholdBackward", 3, "rc_map"}, {"exp", 2, "rc_map"},
    {"log", 2, "rc_map"},       {"affine", 2, "rc_map"},
    {"sum", 2, "rc_reduce"},       {"matmul", 3, "rc_matmul"},
    {"logSoftmax", 2, "rc_log_softmax"}, {"logSoftmaxBackward", 3, "rc_log_softmax_backward"},
    {"nllLoss", 4, "rc_nll_loss"},       {"nllLossBackward", 4, "rc_nll_loss_backward"},
    {"sqrt", 2, "rc_map"},      {"tanh", 2, "rc_map"},
    {"sigmoid", 2, "rc_map"},   {"tanhBackward", 3, "rc_map"},
    {"sigmoidBackward", 3, "rc_map"}, {"addcmul", 4, "rc_map"},
    {"addcdiv", 4, "rc_map"},   {"maximum", 3, "rc_map"},
    {"minimum", 3, "rc_map"},   {"abs", 2, "rc_map"},
    {"pow", 2, "rc_map"},
    {"layerNorm", 4, "rc_layer_norm"}, {"layerNormBackward", 4, "rc_layer_norm_backward"},
    {"gelu", 2, "rc_map"},      {"geluBackward", 3, "rc_map"},
    {"silu", 2, "rc_map"},      {"siluBackward", 3, "rc_map"},
    {"leakyRelu", 2, "rc_map"}, {"leakyReluBackward", 3, "rc_map"},
    {"softplus", 2, "rc_map"},  {"softplusBackward", 3, "rc_map"},
    {"hardtanh", 2, "rc_map"},  {"hardtanhBackward", 3, "rc_map"},
    {"softmax", 2, "rc_softmax"}, {"softmaxBackward", 3, "rc_softmax_backward"},
    {"sign", 2, "rc_map"},
    {"eq", 3, "rc_map"},        {"ne", 3, "rc_map"},
    {"lt", 3, "rc_map"},        {"le", 3, "rc_map"},
    {"gt", 3, "rc_map"},        {"ge", 3, "rc_map"},
    {"where", 4, "rc_map"},     {"clamp", 2, "rc_map"},
    {"log1p", 2, "rc_map"},     {"reciprocal", 2, "rc_map"},
    {"rsqrt", 2, "rc_map"},     {"elu", 2, "rc_map"},
    {"eluBackward", 3, "rc_map"}, {"lerp", 3, "rc_map"},
    {"amax", 2, "rc_reduce"},   {"amin", 2, "rc_reduce"},
    {"argmax", 2, "rc_reduce"}, {"argmin", 2, "rc_reduce"},
    {"indexSelect", 3, "rc_index_select"}, {"indexAdd", 3, "rc_index_add"},
    {"uniform", 1, "rc_random"}, {"bernoulli", 1, "rc_random"},
    {"normal", 1, "rc_random"}, {"gatherSum", 3, "rc_gather_sum"},
    {"maxPool2d", 3, "rc_max_pool"}, {"maxPool2dBackward", 3, "rc_max_pool_backward"},
    {"hardswish", 2, "rc_map"}, {"hardswishBackward", 3, "rc_map"},
    {"hardsigmoid", 2, "rc_map"}, {"hardsigmoidBackward", 3, "rc_map"},
    {"mish", 2, "rc_map"},      {"mishBackward", 3, "rc_map"},
    {"sort", 4, "rc_sort"},
    {"floor", 2, "rc_map"}, {"ceil", 2, "rc_map"}, {"round", 2, "rc_map"}, {"trunc", 2, "rc_map"},
    {"frac", 2, "rc_map"}, {"sin", 2, "rc_map"}, {"cos", 2, "rc_map"}, {"tan", 2, "rc_map"},
    {"asin", 2, "rc_map"}, {"acos", 2, "rc_map"}, {"atan", 2, "rc_map"}, {"sinh", 2, "rc_map"},
    {"cosh", 2, "rc_map"}, {"erf", 2, "rc_map"}, {"erfc", 2, "rc_map"}, {"expm1", 2, "rc_map"},
    {"log2", 2, "rc_map"}, {"log10", 2, "rc_map"}, {"exp2", 2, "rc_map"},
    {"atan2", 3, "rc_map"}, {"hypot", 3, "rc_map"}, {"copysign", 3, "rc_map"}, {"fmod", 3, "rc_map"},
    {"lgamma", 2, "rc_map"}, {"digamma", 2, "rc_map"}, {"erfinv", 2, "rc_map"},
    {"bitwiseAnd", 3, "rc_map"}, {"bitwiseOr", 3, "rc_map"}, {"bitwiseXor", 3, "rc_map"},
    {"shiftLeft", 3, "rc_map"}, {"shiftRight", 3, "rc_map"}, {"polygamma", 2, "rc_map"},
    {"cholesky", 3, "rc_cholesky"}, {"triangularSolve", 3, "rc_triangular_solve"},
    {"luFactor", 4, "rc_lu_factor"}, {"luSolve", 4, "rc_lu_solve"}, {"gcd", 3, "rc_map"},
    {"indexReduce", 3, "rc_index_reduce"}, {"qrFactor", 3, "rc_qr_factor"},
    {"householderProduct", 3, "rc_householder_product"}, {"symmetricEigen", 4, "rc_symmetric_eigen"},
    {"singularValues", 4, "rc_singular_values"}, {"ctcLattice", 4, "rc_ctc_lattice"},
};
// The functions that take a fused scale are map functions (rc_map applies the scales).
constexpr bool scalesOnlyOnTheMap() {
  for (unsigned f = 0; f < kTensorFns; ++f)
    if (takesFusedScale(TensorFn(f)) && std::string_view(kFns[f].kernel) != "rc_map") return false;
  return true;
}
static_assert(scalesOnlyOnTheMap());
constexpr uint64_t kMaxElements = 1ull << 48;
// One work-item of logSoftmax(Backward) walks a row, nllLoss's walks every row: the work
// of one is never cut (hal/slicing.h), so it is bounded here.
constexpr uint64_t kMaxRowElements = 1ull << 24;
// A work-item of linear algebra walks a whole matrix: a factorization n^3 / 3 steps, a
// solve n^2 (the matrix's order n).
// An eigenproblem's sweeps walk n^3 each.
constexpr uint64_t kMaxFactorOrder = 512, kMaxSolveOrder = 4096, kMaxEigenOrder = 256;
bool factorization(TensorFn fn) {
  return fn == TensorFn::cholesky || fn == TensorFn::luFactor || fn == TensorFn::qrFactor ||
         fn == TensorFn::householderProduct || fn == TensorFn::symmetricEigen || fn == TensorFn::singularValues;
}
// The work of one matrix's factorization, m x n: Householder QR 2 m n^2 - 2 n^3 / 3, its Q
// as much again, an eigenproblem's Jacobi ~8 sweeps of 3 n^3, the singular values' ~8 of
// 4 m n^2.
double factorFlops(TensorFn fn, double m, double n) {
  switch (fn) {
    case TensorFn::cholesky: return n * n * n / 3;
    case TensorFn::luFactor: return 2 * n * n * n / 3;
    case TensorFn::qrFactor:
    case TensorFn::householderProduct: return 2 * m * n * n - 2 * n * n * n / 3;
    case TensorFn::singularValues: return 32 * m * n * n;
    default: return 24 * n * n * n;
  }
}
bool solve(TensorFn fn) { return fn == TensorFn::triangularSolve || fn == TensorFn::luSolve; }

// One work-item per output element, at the same position in every operand (rc_map, and
// rc_random with its output alone).
bool elementwise(TensorFn fn) {
  const std::string_view kernel = kFns[unsigned(fn)].kernel;
  return kernel == "rc_map" || kernel == "rc_random";
}
// One work-item per row of a [rows, cols] shape.
bool rowwise(TensorFn fn) {
  return fn == TensorFn::logSoftmax || fn == TensorFn::logSoftmaxBackward || fn == TensorFn::softmax ||
         fn == TensorFn::softmaxBackward || fn == TensorFn::layerNorm || fn == TensorFn::layerNormBackward;
}
// Over the reduceMask's dimensions (rc_reduce).
bool reduction(TensorFn fn) { return std::string_view(kFns[unsigned(fn)].kernel) == "rc_reduce"; }

// A refusal of an op of function `fn` (a known one): invalidArgument, saying why. The
// message is made only for a refusal: an op that passes (three times an op: where it
// comes in, where it runs, in a sandbox) makes no string.
struct Refuse {
  TensorFn fn;
  std::unexpected<Error> operator()(const std::string& why) const {
    return fail(Code::invalidArgument, std::string("tensor op ") + kFns[unsigned(fn)].name + ": " + why);
  }
};
std::string operandNamed(unsigned i) { return "operand " + std::to_string(i); }

// A float map function (rc_map's, not a copy, fill, comparison, where or an integer
// one) whose operands are f32, f16 or bf16, some of them f16 or bf16: rc_map_half reads
// each as f32 and rounds the result once into out's type.
bool floatMapOverHalves(const TensorOp& op, unsigned operands) {
  switch (op.fn) {
    case TensorFn::copy: case TensorFn::fill: case TensorFn::where:
    case TensorFn::eq: case TensorFn::ne: case TensorFn::lt: case TensorFn::le: case TensorFn::gt: case TensorFn::ge:
    case TensorFn::bitwiseAnd: case TensorFn::bitwiseOr: case TensorFn::bitwiseXor:
    case TensorFn::shiftLeft: case TensorFn::shiftRight: case TensorFn::gcd:
      return false;
    default:
      if (std::string_view(kFns[unsigned(op.fn)].kernel) != "rc_map") return false;
  }
  bool halves = false;
  for (unsigned i = 0; i < operands; ++i) {
    const TensorType t = op.operands[i].type;
    if (t != TensorType::f32 && t != TensorType::f16 && t != TensorType::bf16) return false;
    halves = halves || t != TensorType::f32;
  }
  return halves;
}

// The element types each function takes: every operand f32 but for these.
Status checkTypes(const TensorOp& op, unsigned operands, const Refuse& refuse) {
  auto type = [&](unsigned i) { return op.operands[i].type; };
  auto bad = [&](unsigned i, const char* want) {
    return refuse(operandNamed(i) + " is " + tensorTypeName(type(i)) + " (" + want + ")");
  };
  for (unsigned i = 0; i < operands; ++i)
    if (unsigned(type(i)) >= kTensorTypes)
      return refuse(operandNamed(i) + " has unknown element type " + std::to_string(unsigned(type(i))));
  const bool integral = type(1) != TensorType::f32;
  const bool polygammaOrder = op.alpha == std::trunc(op.alpha) && op.alpha >= 0 && op.alpha <= 64;
  if (op.fn == TensorFn::polygamma && !polygammaOrder) return refuse("polygamma's order (alpha) is an integer in [0, 64]");
  if (floatMapOverHalves(op, operands)) return {};  // (f16 and bf16 read as f32, the result rounded once)
  // (indexSelect's and where's picks move elements: of any type but the index's and the
  // condition's, checked below)
  if (op.fn != TensorFn::copy && op.fn != TensorFn::fill && op.fn != TensorFn::where)
    for (unsigned i = op.fn == TensorFn::indexSelect ? 2 : 0; i < operands; ++i)
      if (storageOnly(type(i))) return bad(i, "a storage type: copies, fills and picks alone");
  // Every operand of one type, or the first that is not.
  auto every = [&](TensorType want, const char* why) -> Status {
    for (unsigned i = 0; i < operands; ++i)
      if (type(i) != want) return bad(i, why);
    return {};
  };
  switch (op.fn) {
    case TensorFn::copy:
    case TensorFn::fill:
      return {};  // any to any: a conversion
    case TensorFn::eq: case TensorFn::ne: case TensorFn::lt: case TensorFn::le: case TensorFn::gt: case TensorFn::ge:
      if (type(0) != TensorType::boolean) return bad(0, "a comparison writes bool");
      if (type(2) != type(1)) return bad(2, "both sides of a comparison have one type");
      return {};
    case TensorFn::add:
    case TensorFn::mul:  // f32, or integers (i64 and bool in any mix: bool's sum and product are or and and)
      if (type(0) == TensorType::f32 && type(1) == TensorType::f32 && type(2) == TensorType::f32) return {};
      for (unsigned i = 0; i < operands; ++i)
        if (type(i) == TensorType::f32) return bad(i, "an integer add or mul takes no f32 operand");
      if (op.alpha != std::trunc(op.alpha) || std::fabs(op.alpha) > 16777216.0f)
        return refuse("an integer add or mul takes an integer alpha (at most 2^24)");
      return {};
    case TensorFn::div:
    case TensorFn::fmod:  // f32, or i64 exactly (all three)
      return integral ? every(TensorType::i64, "an integer division is i64") : every(TensorType::f32, "f32");
    case TensorFn::bitwiseAnd: case TensorFn::bitwiseOr: case TensorFn::bitwiseXor:
    case TensorFn::shiftLeft: case TensorFn::shiftRight:  // i64 (all three)
      return every(TensorType::i64, "bits are i64");
    case TensorFn::gcd:
      return every(TensorType::i64, "gcd is of i64");
    case TensorFn::polygamma:  // f32, of an integer order in [0, 64] (checked above)
      return every(TensorType::f32, "f32");
    case TensorFn::where:
      if (type(1) != TensorType::boolean) return bad(1, "the condition is bool");
      if (type(2) != type(0)) return bad(2, "the output's type");
      if (type(3) != type(0)) return bad(3, "the output's type");
      return {};
    case TensorFn::sum:
      if (type(0) != (integral ? TensorType::i64 : TensorType::f32)) return bad(0, integral ? "an integer sum is i64" : "f32");
      if (integral && (op.alpha != 1 || (op.beta != 0 && op.beta != 1))) return bad(1, "an integer sum takes alpha 1 and beta 0 or 1");
      return {};
    case TensorFn::uniform:
    case TensorFn::bernoulli:
    case TensorFn::normal:
      if (type(0) != TensorType::f32) return bad(0, "random numbers are f32");
      return {};
    case TensorFn::abs:  // f32, or i64 exactly
      if (type(1) == TensorType::boolean) return bad(1, "f32 or i64");
      if (type(0) != type(1)) return bad(0, "the input's type");
      return {};
    case TensorFn::amax:
    case TensorFn::amin:  // f32, or integers (i64, bool) compared exactly
      if (type(0) != type(1)) return bad(0, "the input's type");
      return {};
    case TensorFn::argmax:
    case TensorFn::argmin:
      if (type(0) != TensorType::i64) return bad(0, "a position is i64");
      return {};
    case TensorFn::indexSelect:
      if (type(2) != TensorType::i64) return bad(2, "the index is i64");
      if (type(1) != type(0)) return bad(1, "the output's type");
      return {};
    case TensorFn::indexReduce:
      if (op.alpha != std::trunc(op.alpha) || !(op.alpha >= 0 && op.alpha <= 3) || (op.beta != 0 && op.beta != 1))
        return refuse("indexReduce's alpha is its reduction (0 product, 1 largest, 2 smallest, 3 last) and beta 0 or 1");
      if (op.alpha == 3) {  // the last pick: of any one type
        if (type(2) != TensorType::i64) return bad(2, "the index is i64");
        if (type(1) != type(0)) return bad(1, "the output's type");
        return {};
      }
      [[fallthrough]];
    case TensorFn::indexAdd:
    case TensorFn::gatherSum:
      if (type(2) != TensorType::i64) return bad(2, "the index is i64");
      if (type(0) != TensorType::f32 || type(1) != TensorType::f32) return bad(type(0) != TensorType::f32 ? 0 : 1, "f32");
      return {};
    case TensorFn::nllLoss:
    case TensorFn::nllLossBackward:
      for (unsigned i = 0; i < operands; ++i)
        if (type(i) != (i == 2 ? TensorType::i64 : TensorType::f32)) return bad(i, i == 2 ? "the targets are i64" : "f32");
      return {};
    case TensorFn::maxPool2d:
    case TensorFn::maxPool2dBackward:
      for (unsigned i = 0; i < operands; ++i)
        if (type(i) != (i == 2 ? TensorType::i64 : TensorType::f32)) return bad(i, i == 2 ? "the index is i64" : "f32");
      return {};
    case TensorFn::cholesky:
    case TensorFn::luFactor:
    case TensorFn::luSolve:  // f32 but the info and the pivots, i64
      for (unsigned i = 0; i < operands; ++i) {
        const bool index = i == 2 || (op.fn == TensorFn::luFactor && i == 3);
        if (type(i) != (index ? TensorType::i64 : TensorType::f32)) return bad(i, index ? "pivots and infos are i64" : "f32");
      }
      if (op.fn == TensorFn::luSolve && op.alpha != 0 && op.alpha != 1) return refuse("luSolve's alpha is 0, or 1 for A's transpose");
      return {};
    case TensorFn::ctcLattice:  // the labels and the lengths i64
      for (unsigned i = 0; i < operands; ++i)
        if (type(i) != (i >= 2 ? TensorType::i64 : TensorType::f32)) return bad(i, i >= 2 ? "labels and lengths are i64" : "f32");
      if (op.alpha != 0 && op.alpha != 1) return refuse("ctcLattice's alpha is 0 (the forward variables) or 1 (the backward)");
      return {};
    case TensorFn::triangularSolve:
      if (op.alpha != std::trunc(op.alpha) || !(op.alpha >= 0 && op.alpha <= 3))
        return refuse("triangularSolve's alpha is its flags: 1 upper, 2 unit diagonal (an integer in [0, 3])");
      return every(TensorType::f32, "f32");
    case TensorFn::sort:
      if (type(0) == TensorType::boolean) return bad(0, "f32 or i64");
      if (type(1) != type(0)) return bad(1, "the output's type");
      if (type(2) != TensorType::i64) return bad(2, "the index is i64");
      if (type(3) != TensorType::i64) return bad(3, "the scratch is i64");
      return {};
    default:
      return every(TensorType::f32, "f32");
  }
}
}  // namespace

const char* tensorTypeName(TensorType t) {
  switch (t) {
    case TensorType::f32: return "f32";
    case TensorType::i64: return "i64";
    case TensorType::boolean: return "bool";
    case TensorType::i32: return "i32";
    case TensorType::f64: return "f64";
    case TensorType::f16: return "f16";
    case TensorType::bf16: return "bf16";
  }
  return "unknown";
}

const char* tensorFnName(TensorFn fn) { return unsigned(fn) < kTensorFns ? kFns[unsigned(fn)].name : "unknown"; }
unsigned tensorFnOperands(TensorFn fn) { return unsigned(fn) < kTensorFns ? kFns[unsigned(fn)].operands : 0; }
const char* tensorKernelName(TensorFn fn) { return unsigned(fn) < kTensorFns ? kFns[unsigned(fn)].kernel : ""; }

namespace {

// A work-item of max pooling walks a row of windows (the forward) or a plane (the
// backward), and an op of one plane is never cut (hal/slicing.h): each is bounded.
Status checkPoolWork(const TensorOp& op, uint64_t elements, const Refuse& bad) {
  const unsigned d = op.dims - 4;
  const uint64_t oh = op.shape[d], ow = op.shape[d + 1], inner = limits::satMul(op.shape[d + 2], op.shape[d + 3]);
  if (op.fn == TensorFn::maxPool2d) {
    if (limits::satMul(ow, inner) > kMaxRowElements) return bad("rows of windows of more than 2^24 elements");
  } else if (limits::satAdd(limits::satMul(oh, ow), inner) > kMaxRowElements) {
    return bad("planes of more than 2^24 elements (oh x ow + h x w)");
  }
  if (op.dims == 4 && elements > kMaxRowElements) return bad("one plane of more than 2^24 elements (give it a plane dimension)");
  return {};
}

// The shape each function takes, its bounds, and which dimensions a reduction reduces.
Status checkShape(const TensorOp& op, uint64_t elements, const Refuse& bad) {
  if (elements > kMaxElements) return bad("a shape of more than 2^48 elements");
  if (op.reduceMask >> op.dims) return bad("reduceMask names a dimension past the shape");
  switch (op.fn) {
    case TensorFn::matmul:
      if (op.dims != 3 && op.dims != 4) return bad("takes a shape of 3 dimensions [m, n, k], or 4 with a batch first");
      break;
    case TensorFn::indexSelect:
      if (op.dims < 2) return bad("takes a shape of 2 or more dimensions (the picked rows last)");
      break;
    case TensorFn::indexAdd:
    case TensorFn::indexReduce:
      if (op.dims < 2) return bad("takes a shape of 2 or more dimensions (the rows, then the positions, last)");
      break;
    case TensorFn::gatherSum:
      if (op.dims < 2) return bad("takes a shape of 2 or more dimensions (the picks, then the rows picked from, last)");
      break;
    case TensorFn::logSoftmax:
    case TensorFn::logSoftmaxBackward:
    case TensorFn::softmax:
    case TensorFn::softmaxBackward:
    case TensorFn::nllLoss:
    case TensorFn::nllLossBackward:
      if (op.dims != 2) return bad("takes a shape of 2 dimensions");
      break;
    case TensorFn::layerNorm:
    case TensorFn::layerNormBackward:
      if (op.dims != 2 && op.dims != 3)
        return bad("takes a shape of 2 dimensions [rows, cols], or 3 [rows, outer, cols] (batch norm's channels)");
      break;
    case TensorFn::maxPool2d:
    case TensorFn::maxPool2dBackward:
      if (op.dims < 4)
        return bad(op.fn == TensorFn::maxPool2d ? "takes a shape of 4 to 6 dimensions [planes..., oh, ow, kh, kw]"
                                                : "takes a shape of 4 to 6 dimensions [planes..., oh, ow, h, w]");
      if (auto s = checkPoolWork(op, elements, bad); !s) return s;
      break;
    case TensorFn::qrFactor:
    case TensorFn::householderProduct: {
      if (op.dims < 2) return bad("takes a shape of 2 to 6 dimensions [batch..., m, n]");
      const uint64_t m = op.shape[op.dims - 2], n = op.shape[op.dims - 1];
      if (m > kMaxFactorOrder || n > kMaxFactorOrder)
        return bad("a matrix of " + std::to_string(m) + " x " + std::to_string(n) + " (at most 512 x 512)");
      if (op.fn == TensorFn::householderProduct && n > m) return bad("takes at most as many columns as rows");
      break;
    }
    case TensorFn::singularValues: {
      if (op.dims < 2) return bad("takes a shape of 2 to 6 dimensions [batch..., m, n]");
      const uint64_t m = op.shape[op.dims - 2], n = op.shape[op.dims - 1];
      if (n > m) return bad("takes at most as many columns as rows (a wide matrix's transpose is tall)");
      if (m > kMaxFactorOrder || n > kMaxEigenOrder)
        return bad("a matrix of " + std::to_string(m) + " x " + std::to_string(n) + " (at most 512 x 256)");
      break;
    }
    case TensorFn::ctcLattice:
      if (op.dims != 4) return bad("takes a shape of 4 dimensions [sequences, times, extended labels, classes]");
      if (limits::satMul(op.shape[1], op.shape[2]) > kMaxRowElements)
        return bad("a lattice of " + std::to_string(op.shape[1]) + " x " + std::to_string(op.shape[2]) + " (at most 2^24)");
      break;
    case TensorFn::symmetricEigen: {
      if (op.dims < 2) return bad("takes a shape of 2 to 6 dimensions [batch..., n, n]");
      const uint64_t n = op.shape[op.dims - 1];
      if (op.shape[op.dims - 2] != n) return bad("takes square matrices: the last two dimensions alike");
      if (n > kMaxEigenOrder) return bad("a matrix of order " + std::to_string(n) + " (at most 256)");
      break;
    }
    case TensorFn::cholesky:
    case TensorFn::luFactor:
    case TensorFn::triangularSolve:
    case TensorFn::luSolve: {
      const bool factor = factorization(op.fn);
      if (op.dims < (factor ? 2u : 3u))
        return bad(factor ? "takes a shape of 2 to 6 dimensions [batch..., n, n]" : "takes a shape of 3 to 6 dimensions [batch..., k, n, n]");
      const uint64_t n = op.shape[op.dims - 1];
      if (op.shape[op.dims - 2] != n) return bad("takes square matrices: the last two dimensions alike");
      if (n > (factor ? kMaxFactorOrder : kMaxSolveOrder))
        return bad("a matrix of order " + std::to_string(n) + " (at most " + std::to_string(factor ? kMaxFactorOrder : kMaxSolveOrder) + ")");
      break;
    }
    default:
      break;
  }
  if (const uint64_t row = limits::satMul(op.shape[1], op.dims == 3 ? op.shape[2] : 1); rowwise(op.fn) && row > kMaxRowElements)
    return bad("rows of " + std::to_string(row) + " elements (at most 2^24)");
  if ((op.fn == TensorFn::indexAdd || op.fn == TensorFn::indexReduce) && op.shape[op.dims - 1] > kMaxRowElements)
    return bad("an index of " + std::to_string(op.shape[op.dims - 1]) + " positions (at most 2^24)");
  if (op.fn == TensorFn::sort && op.shape[op.dims - 1] > kMaxRowElements)
    return bad("rows of " + std::to_string(op.shape[op.dims - 1]) + " elements (at most 2^24)");
  if (op.fn == TensorFn::gatherSum && op.shape[op.dims - 2] > kMaxRowElements)
    return bad(std::to_string(op.shape[op.dims - 2]) + " picks per output (at most 2^24)");
  if (op.fn == TensorFn::nllLoss && op.shape[0] > kMaxRowElements)
    return bad("a batch of " + std::to_string(op.shape[0]) + " rows (at most 2^24; split it)");
  if (reduction(op.fn) && op.reduceMask == 0) return bad("reduceMask names no dimension");
  if (!reduction(op.fn) && op.reduceMask != 0) return bad("only a reduction takes a reduceMask");
  if (op.fn != TensorFn::sum && reduction(op.fn)) {
    // Every reduced dimension after every kept one (hal/slicing.h cuts only the kept).
    const uint32_t kept = ~op.reduceMask & ((1u << op.dims) - 1);
    if (kept >> std::countr_zero(op.reduceMask)) return bad("the reduced dimensions must come after the kept ones");
  }
  return {};
}

// A pre- or post-scale: finite, over f32 operands (or f16 and bf16 ones, applied in f32),
// of a function that takes one.
Status checkFusedScale(const TensorOp& op, unsigned operands, const Refuse& bad) {
  if (op.preScale == 1 && op.preShift == 0 && op.postScale == 1 && op.postShift == 0) return {};
  if (!floatMapOverHalves(op, operands))
    for (unsigned i = 0; i < operands; ++i)
      if (op.operands[i].type != TensorType::f32) return bad("takes a pre- or post-scale over f32 operands only");
  if (!takesFusedScale(op.fn)) return bad("takes no pre- or post-scale (only the elementwise map functions do)");
  for (float v : {op.preScale, op.preShift, op.postScale, op.postShift})
    if (!std::isfinite(v)) return bad("a pre- or post-scale that is not a finite number");
  return {};
}

// Every element an operand can reach lies inside its buffer: the highest each reaches
// goes to last[i].
Status checkReach(const TensorOp& op, unsigned operands, LoweredTensorOp& out,
                  std::array<uint64_t, kMaxTensorOperands>& last, const Refuse& bad) {
  for (unsigned i = 0; i < operands; ++i) {
    const TensorOperand& o = op.operands[i];
    if (!o.buffer) return bad(operandNamed(i) + " has no buffer");
    uint64_t reach = o.offset;
    for (unsigned d = 0; d < op.dims && !out.empty; ++d)
      reach = limits::satAdd(reach, limits::satMul(op.shape[d] - 1, o.strides[d]));
    const uint64_t have = o.buffer->size() / tensorTypeBytes(o.type);
    if (!out.empty && reach >= have)
      return bad(operandNamed(i) + " reaches element " + std::to_string(reach) + " of a buffer of " + std::to_string(have) +
                 " elements");
    last[i] = reach;
    out.buffers[i] = o.buffer;
  }
  for (unsigned i = operands; i < kMaxTensorOperands; ++i) out.buffers[i] = op.operands[0].buffer;
  return {};
}

// The layouts each function needs: outputs and scalars that do not move along some
// dimensions, and outputs apart from the inputs that a kernel reads while it writes.
class Layout {
 public:
  Layout(const TensorOp& op, const std::array<uint64_t, kMaxTensorOperands>& last, const Refuse& bad)
      : op_(op), last_(last), bad_(bad) {}

  Status check() const {
    switch (op_.fn) {
      case TensorFn::sum:
      case TensorFn::amax:
      case TensorFn::amin:
      case TensorFn::argmax:
      case TensorFn::argmin: return reduction();
      case TensorFn::matmul: return matmul();
      case TensorFn::layerNorm:
      case TensorFn::layerNormBackward: return layerNorm();
      case TensorFn::indexSelect: return indexSelect();
      case TensorFn::indexAdd:
      case TensorFn::indexReduce: return indexAdd();
      case TensorFn::gatherSum: return gatherSum();
      case TensorFn::maxPool2d:
      case TensorFn::maxPool2dBackward: return maxPool();
      case TensorFn::nllLoss:
      case TensorFn::nllLossBackward: return nllLoss();
      case TensorFn::sort: return allApart();
      case TensorFn::cholesky:
      case TensorFn::luFactor: return factorization();
      case TensorFn::qrFactor:
      case TensorFn::householderProduct:
      case TensorFn::symmetricEigen:
      case TensorFn::singularValues: return orthogonal();
      case TensorFn::ctcLattice: return lattice();
      case TensorFn::triangularSolve:
      case TensorFn::luSolve: return solve();
      default: return {};
    }
  }

 private:
  Status reduction() const {
    for (unsigned d = 0; d < op_.dims; ++d)
      if (op_.reduceMask >> d & 1)
        if (auto s = zero(0, d, "the output's strides must be 0 on the summed dimensions"); !s) return s;
    return {};
  }
  Status matmul() const {
    const unsigned m = op_.dims - 3;  // the m dimension (after a batch)
    if (auto s = zero(0, m + 2, "out's k stride must be 0"); !s) return s;
    if (auto s = zero(1, m + 1, "a's n stride must be 0"); !s) return s;
    if (auto s = zero(2, m, "b's m stride must be 0"); !s) return s;
    if (auto s = apart(0, 1); !s) return s;
    return apart(0, 2);
  }
  // The forward writes the mean and rstd (operands 2 and 3), the backward reads rstd:
  // one element per row.
  Status layerNorm() const {
    const bool forward = op_.fn == TensorFn::layerNorm;
    for (unsigned d = 1; d < op_.dims; ++d) {
      if (forward)
        if (auto s = zero(2, d, "the mean is one element per row: its strides past the rows must be 0"); !s) return s;
      if (auto s = zero(3, d, "rstd is one element per row: its strides past the rows must be 0"); !s) return s;
    }
    return forward ? apart(2, 3) : Status{};
  }
  Status indexSelect() const {
    if (auto s = zero(0, op_.dims - 1, "the output's stride over the rows must be 0"); !s) return s;
    return zero(2, op_.dims - 1, "the index's stride over the rows must be 0");
  }
  Status indexAdd() const {
    if (auto s = zero(0, op_.dims - 1, "the output's stride over the positions must be 0"); !s) return s;
    if (auto s = zero(1, op_.dims - 2, "a's stride over the rows must be 0"); !s) return s;
    if (auto s = zero(2, op_.dims - 2, "the index's stride over the rows must be 0"); !s) return s;
    return apartFromInputs();
  }
  Status gatherSum() const {
    for (unsigned d = op_.dims - 2; d < op_.dims; ++d)
      if (auto s = zero(0, d, "the output's strides over the picks and the rows must be 0"); !s) return s;
    if (auto s = zero(2, op_.dims - 1, "the index's stride over the rows must be 0"); !s) return s;
    return apartFromInputs();
  }
  // The forward: out and index over the windows, not their elements. The backward: out
  // over the input's plane; grad and index over the outputs.
  Status maxPool() const {
    const bool forward = op_.fn == TensorFn::maxPool2d;
    for (unsigned d = op_.dims - 2; d < op_.dims; ++d) {
      if (auto s = forward ? zero(0, d, "the output's strides over kh and kw must be 0")
                           : zero(1, d, "grad's strides over h and w must be 0");
          !s)
        return s;
      if (auto s = zero(2, d, forward ? "the index's strides over kh and kw must be 0" : "the index's strides over h and w must be 0");
          !s)
        return s;
      if (!forward)
        if (auto s = zero(0, d - 2, "the output's strides over oh and ow must be 0"); !s) return s;
    }
    if (auto s = apartFromInputs(); !s) return s;
    return forward ? apart(1, 2) : Status{};  // (the forward writes the index too)
  }
  // The scalars: the loss (the forward's output, the backward's input) and the total weight.
  Status nllLoss() const {
    const bool forward = op_.fn == TensorFn::nllLoss;
    for (unsigned d = 0; d < 2; ++d) {
      if (auto s = zero(forward ? 0 : 1, d,
                        forward ? "the loss is a scalar: its strides must be 0" : "the loss's gradient is a scalar: its strides must be 0");
          !s)
        return s;
      if (auto s = zero(3, d, "totalWeight is a scalar: its strides must be 0"); !s) return s;
    }
    if (auto s = zero(2, 1, "the targets' class stride must be 0"); !s) return s;
    return op_.operands[2].buffer == op_.operands[0].buffer ? apart(0, 2) : Status{};
  }

  Status zero(unsigned operand, unsigned dim, const char* what) const {
    if (op_.operands[operand].strides[dim] != 0) return bad_(what);
    return {};
  }
  // Operands x and y share no byte. Compared as byte ranges: operands of different types
  // count elements of different sizes. (Saturating: an empty op's offsets were never
  // bounded by a reach.)
  Status apart(unsigned x, unsigned y) const {
    const TensorOperand &a = op_.operands[x], &b = op_.operands[y];
    auto begin = [&](const TensorOperand& o) { return limits::satMul(o.offset, tensorTypeBytes(o.type)); };
    auto end = [&](unsigned i) { return limits::satMul(limits::satAdd(last_[i], 1), tensorTypeBytes(op_.operands[i].type)); };
    if (a.buffer == b.buffer && !(end(x) <= begin(b) || end(y) <= begin(a)))
      return bad_("operand " + std::to_string(x) + " overlaps operand " + std::to_string(y));
    return {};
  }
  // [batch..., n, n]: the info a scalar per matrix, the pivots a vector (over the rows).
  Status factorization() const {
    const unsigned r = op_.dims - 2, c = op_.dims - 1, info = op_.fn == TensorFn::cholesky ? 2 : 3;
    if (auto s = zero(info, r, "the info is one element per matrix: its strides over the last two dimensions must be 0"); !s) return s;
    if (auto s = zero(info, c, "the info is one element per matrix: its strides over the last two dimensions must be 0"); !s) return s;
    if (op_.fn == TensorFn::luFactor)
      if (auto s = zero(2, c, "the pivots are one element per row: their stride over the last dimension must be 0"); !s) return s;
    return allApart(tensorFnOperands(op_.fn));
  }
  // [N, T, S', C]: the lattice no class's, log_probs no label's, the labels one per (n, s),
  // the lengths one per n; the lattice apart from what it reads.
  Status lattice() const {
    const char* why[] = {"the lattice's stride over the classes must be 0", "log_probs' stride over the labels must be 0",
                         "the labels are one per sequence and position: their strides over times and classes must be 0",
                         "the lengths are one per sequence: their strides after the first dimension must be 0"};
    const unsigned zeros[][3] = {{3, 3, 3}, {2, 2, 2}, {1, 3, 3}, {1, 2, 3}};
    for (unsigned i = 0; i < 4; ++i)
      for (unsigned d : zeros[i])
        if (auto s = zero(i, d, why[i]); !s) return s;
    for (unsigned i = 1; i < 4; ++i)
      if (auto s = apart(0, i); !s) return s;
    return {};
  }
  // [batch..., m, n]: tau and the eigenvalues one element per column.
  Status orthogonal() const {
    const char* why = op_.fn == TensorFn::symmetricEigen ? "the eigenvalues are one element per column: their stride over the rows must be 0"
                      : op_.fn == TensorFn::singularValues
                          ? "the singular values are one element per column: their stride over the rows must be 0"
                          : "tau is one element per column: its stride over the rows must be 0";
    if (auto s = zero(2, op_.dims - 2, why); !s) return s;
    return allApart(tensorFnOperands(op_.fn));
  }
  // [batch..., k, n, n]: out and b a column per k, the matrix (and pivots) the same for each.
  Status solve() const {
    const unsigned k = op_.dims - 3, c = op_.dims - 1, b = op_.fn == TensorFn::luSolve ? 3 : 2;
    if (auto s = zero(0, c, "the output is a column per k: its stride over the last dimension must be 0"); !s) return s;
    if (auto s = zero(b, c, "b is a column per k: its stride over the last dimension must be 0"); !s) return s;
    if (auto s = zero(1, k, "the matrix is one for every k: its stride over k must be 0"); !s) return s;
    if (op_.fn == TensorFn::luSolve) {
      if (auto s = zero(2, k, "the pivots are one vector for every k: their strides over k and the last dimension must be 0"); !s) return s;
      if (auto s = zero(2, c, "the pivots are one vector for every k: their strides over k and the last dimension must be 0"); !s) return s;
    }
    for (unsigned i = 1; i < tensorFnOperands(op_.fn); ++i)
      if (auto s = apart(0, i); !s) return s;
    return {};
  }
  Status allApart(unsigned operands = 4) const {  // every operand from every other (sort writes three of its four)
    for (unsigned x = 0; x < operands; ++x)
      for (unsigned y = x + 1; y < operands; ++y)
        if (auto s = apart(x, y); !s) return s;
    return {};
  }
  Status apartFromInputs() const {  // the output from operands 1 and 2
    if (auto s = apart(0, 1); !s) return s;
    return apart(0, 2);
  }

  const TensorOp& op_;
  const std::array<uint64_t, kMaxTensorOperands>& last_;
  const Refuse& bad_;
};

Status checkLayout(const TensorOp& op, const std::array<uint64_t, kMaxTensorOperands>& last, const Refuse& bad) {
  return Layout(op, last, bad).check();
}

// The kernels' geometry: shapes, strides (0 where a dimension has one element), offsets
// and element types, as signed 64-bit numbers.
Status buildGeometry(const TensorOp& op, unsigned operands, kernels::RcGeom& g, const Refuse& bad) {
  g.fn = int(op.fn);
  g.alpha = op.alpha;
  g.beta = op.beta;
  g.pre[0] = op.preScale, g.pre[1] = op.preShift;
  g.post[0] = op.postScale, g.post[1] = op.postShift;
  g.mean = op.mean ? 1 : 0;
  g.ignoreIndex = op.ignoreIndex;
  g.drawOrigin = op.drawOrigin;
  g.dims = op.dims;
  // From here every shape, stride and offset is bounded by a buffer's elements (the
  // reach above: (shape - 1) * stride + offset < elements <= 2^50), so the signed 64-bit
  // geometry cannot overflow; the conversions are checked all the same.
  for (unsigned d = 0; d < op.dims; ++d) {
    g.shape[d] = limits::toSigned(op.shape[d]);
    for (unsigned i = 0; i < kMaxTensorOperands; ++i)
      // A dimension of one element never moves: its stride (however large) is 0.
      g.stride[i][d] = i < operands && op.shape[d] > 1 ? limits::toSigned(op.operands[i].strides[d]) : 0;
  }
  for (unsigned i = 0; i < kMaxTensorOperands; ++i) {
    g.offset[i] = i < operands ? limits::toSigned(op.operands[i].offset) : 0;
    g.type[i] = i < operands ? int(op.operands[i].type) : int(TensorType::f32);
  }
  for (unsigned d = 0; d < op.dims; ++d)
    for (unsigned i = 0; i < kMaxTensorOperands; ++i)
      if (g.shape[d] < 0 || g.stride[i][d] < 0 || g.offset[i] < 0) return bad("a shape, stride or offset past 2^63");

  return {};
}

// Merges g's neighbouring dimensions in [from, to) that every operand walks contiguously
// (a dimension's stride is the next one's stride times its length, in every operand):
// one dimension where there were several, the same elements in the same order. The
// dimensions after `to` move down to follow.
void mergeDims(kernels::RcGeom& g, unsigned operands, int64_t from, int64_t to) {
  auto moveTo = [&](int64_t into, int64_t d) {
    g.shape[into] = g.shape[d];
    for (unsigned i = 0; i < kMaxTensorOperands; ++i) g.stride[i][into] = g.stride[i][d];
  };
  int64_t dims = from;
  for (int64_t d = from; d < to; ++d) {
    bool merge = dims > from;
    for (unsigned i = 0; i < operands && merge; ++i)
      merge = uint64_t(g.stride[i][dims - 1]) == limits::satMul(uint64_t(g.stride[i][d]), uint64_t(g.shape[d]));
    if (!merge) {
      moveTo(dims++, d);
      continue;
    }
    g.shape[dims - 1] *= g.shape[d];
    for (unsigned i = 0; i < kMaxTensorOperands; ++i) g.stride[i][dims - 1] = g.stride[i][d];
  }
  for (int64_t d = to; d < g.dims; ++d) moveTo(dims++, d);
  g.dims = dims;
}

// How the work is cut into work-items (n of them, `inner` steps each) and what it costs.
void shapeWork(const TensorOp& op, unsigned operands, uint64_t elements, LoweredTensorOp& out) {
  kernels::RcGeom& g = out.geom;
  if (elementwise(op.fn)) {
    mergeDims(g, operands, 0, g.dims);  // a contiguous op indexes in one dimension
    g.n = static_cast<int64_t>(elements);
    g.inner = 1;
    out.flops = double(elements);
  } else if (reduction(op.fn)) {
    // The kept dimensions first, then the reduced ones.
    kernels::RcGeom sorted = g;
    int64_t at = 0, kept = 1, inner = 1;
    for (int pass = 0; pass < 2; ++pass)
      for (unsigned d = 0; d < op.dims; ++d) {
        if ((op.reduceMask >> d & 1) != unsigned(pass)) continue;
        sorted.shape[at] = g.shape[d];
        for (unsigned i = 0; i < kMaxTensorOperands; ++i) sorted.stride[i][at] = g.stride[i][d];
        (pass ? inner : kept) *= g.shape[d];
        ++at;
      }
    g = sorted;
    g.n = kept;
    g.inner = inner;
    // The reduced dimensions merged among themselves (a per-channel sum over [N, C, H, W]
    // reduces [N, H x W]: a row of H x W neighbours), then the kept ones.
    const int64_t keptDims = int64_t(op.dims) - std::popcount(op.reduceMask & ((1u << op.dims) - 1));
    mergeDims(g, operands, keptDims, g.dims);
    mergeDims(g, operands, 0, keptDims);
    out.flops = double(elements);
  } else if (op.fn == TensorFn::matmul) {  // a work-item per RC_MM_COLS outputs of a row
    g.inner = g.shape[op.dims - 1];
    const int64_t cols = g.shape[op.dims - 2];
    g.n = static_cast<int64_t>(elements) / g.inner / cols * ((cols + RC_MM_COLS - 1) / RC_MM_COLS);
    out.flops = 2.0 * double(elements);
  } else if (rowwise(op.fn)) {
    g.n = g.shape[0];
    g.inner = op.dims == 3 ? g.shape[1] * g.shape[2] : g.shape[1];
    out.flops = 4.0 * double(elements);
  } else if (op.fn == TensorFn::indexSelect) {  // one work-item per output element, rows last
    g.inner = g.shape[op.dims - 1];
    g.n = static_cast<int64_t>(elements) / g.inner;
    out.flops = double(g.n);
  } else if (op.fn == TensorFn::indexAdd || op.fn == TensorFn::indexReduce) {  // one per output element, walking the index
    g.inner = g.shape[op.dims - 1];
    g.n = static_cast<int64_t>(elements) / g.inner;
    out.flops = double(elements);
  } else if (op.fn == TensorFn::gatherSum) {  // one per RC_GATHER_RUN output elements, walking their picks
    g.inner = g.shape[op.dims - 2];
    const int64_t outputs = static_cast<int64_t>(elements) / (g.inner * g.shape[op.dims - 1]);
    g.n = (outputs + RC_GATHER_RUN - 1) / RC_GATHER_RUN;
    out.flops = double(outputs) * double(g.inner);
  } else if (op.fn == TensorFn::maxPool2d) {  // a work-item per row of windows
    g.inner = g.shape[op.dims - 3];
    g.n = static_cast<int64_t>(elements) / (g.inner * g.shape[op.dims - 2] * g.shape[op.dims - 1]);
    out.flops = double(elements);
  } else if (op.fn == TensorFn::maxPool2dBackward) {  // a work-item per plane
    const int64_t outputs = g.shape[op.dims - 4] * g.shape[op.dims - 3], inputs = g.shape[op.dims - 2] * g.shape[op.dims - 1];
    g.n = static_cast<int64_t>(elements) / (outputs * inputs);
    g.inner = outputs + inputs;
    out.flops = double(g.n) * double(g.inner);
  } else if (op.fn == TensorFn::sort) {  // a work-item a row
    g.inner = g.shape[op.dims - 1];
    g.n = static_cast<int64_t>(elements) / g.inner;
    out.flops = double(elements) * std::max(1.0, std::log2(double(g.inner)));
  } else if (factorization(op.fn)) {  // a work-item a matrix
    const double m = double(g.shape[op.dims - 2]), n = double(g.shape[op.dims - 1]);
    g.inner = g.shape[op.dims - 1];
    g.n = static_cast<int64_t>(elements) / (g.shape[op.dims - 2] * g.inner);
    out.flops = double(g.n) * factorFlops(op.fn, m, n);
  } else if (solve(op.fn)) {  // a work-item a right-hand column
    g.inner = g.shape[op.dims - 1];
    g.n = static_cast<int64_t>(elements) / (g.inner * g.inner);
    out.flops = double(elements) * (op.fn == TensorFn::luSolve ? 2.0 : 1.0);
  } else if (op.fn == TensorFn::ctcLattice) {  // a work-item a sequence, walking its times and labels
    g.n = g.shape[0];
    g.inner = g.shape[1] * g.shape[2];
    out.flops = 3.0 * double(g.n) * double(g.inner);
  } else if (op.fn == TensorFn::nllLoss) {
    g.n = 1;
    g.inner = 1;
    out.flops = double(op.shape[0]);
  } else {  // nllLossBackward
    g.n = static_cast<int64_t>(elements);
    g.inner = 1;
    out.flops = double(elements);
  }
}
}  // namespace

Result<LoweredTensorOp> lowerTensorOp(const TensorOp& op) {
  if (unsigned(op.fn) >= kTensorFns) return fail(Code::invalidArgument, "tensor op: unknown function " + std::to_string(unsigned(op.fn)));
  const Refuse bad{op.fn};
  if (op.dims < 1 || op.dims > kMaxTensorDims)
    return bad("a shape of " + std::to_string(op.dims) + " dimensions (1 to " + std::to_string(kMaxTensorDims) + ")");
  const unsigned operands = tensorFnOperands(op.fn);
  LoweredTensorOp out;
  out.op = op;
  uint64_t elements = 1;
  for (unsigned d = 0; d < op.dims; ++d) {
    if (op.shape[d] == 0) out.empty = true;
    elements = limits::satMul(elements, op.shape[d]);
  }
  std::array<uint64_t, kMaxTensorOperands> last{};
  Status s = checkShape(op, elements, bad);
  if (s) s = checkTypes(op, operands, bad);
  if (s) s = checkFusedScale(op, operands, bad);
  if (s) s = checkReach(op, operands, out, last, bad);
  if (s) s = checkLayout(op, last, bad);
  if (!s) return std::unexpected(s.error());
  // A shape with a zero runs nothing: its strides and offsets were never bounded by a
  // reach, so no geometry is computed from them.
  if (out.empty) return out;
  if (s = buildGeometry(op, operands, out.geom, bad); !s) return std::unexpected(s.error());
  shapeWork(op, operands, elements, out);
  return out;
}

kernels::RcGeom matmulEntry(const kernels::RcGeom& batched, int64_t entry) {
  kernels::RcGeom g = batched;
  g.dims = 3;
  for (unsigned d = 0; d < 3; ++d) g.shape[d] = batched.shape[d + 1];
  g.shape[3] = 1;
  for (unsigned i = 0; i < kMaxTensorOperands; ++i) {
    g.offset[i] = batched.offset[i] + entry * batched.stride[i][0];
    for (unsigned d = 0; d < 3; ++d) g.stride[i][d] = batched.stride[i][d + 1];
    g.stride[i][3] = 0;
  }
  g.n = g.shape[0] * g.shape[1];
  return g;
}

std::string_view tensorKernelSource() { return kTensorKernelSource; }

}  // namespace raccel::hal
