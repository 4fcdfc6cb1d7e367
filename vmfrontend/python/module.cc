// raccel._raccel: libraccel's session API for Python (pybind11). `raccel.Session`
// opens a virtual accelerator through raccel-guestd (or a VM's socket) and sends it
// instructions; like libraccel, everything but read() and fence() is asynchronous, and
// a failure is raised by the next fence() or read(). The GIL is released while a call
// waits for the scheduler.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <memory>

#include "vmfrontend/python/shared_session.h"

namespace py = pybind11;
using raccel::client::Handle;
using raccel::python::SharedSession;

namespace {

struct PySession {
  std::shared_ptr<SharedSession> shared = std::make_shared<SharedSession>();
  raccel::client::Session& s() {
    if (!shared->session) throw std::runtime_error("this raccel session is closed");
    return *shared->session;
  }
};

[[noreturn]] void raise(const raccel::Error& e) {
  throw std::runtime_error(std::string(raccel::codeName(e.code)) + ": " + e.message);
}
void check(const raccel::Status& s) {
  if (!s) raise(s.error());
}

raccel::client::TensorFn fnNamed(const std::string& name) {
  static const char* names[] = {"copy", "fill", "add", "mul", "div", "relu", "threshold_backward", "exp", "log", "affine",
                                "sum", "matmul", "log_softmax", "log_softmax_backward", "nll_loss", "nll_loss_backward",
                                "sqrt", "tanh", "sigmoid", "tanh_backward", "sigmoid_backward", "addcmul", "addcdiv",
                                "maximum", "minimum", "abs", "pow", "layer_norm", "layer_norm_backward",
                                "gelu", "gelu_backward", "silu", "silu_backward", "leaky_relu", "leaky_relu_backward",
                                "softplus", "softplus_backward", "hardtanh", "hardtanh_backward", "softmax",
                                "softmax_backward", "sign", "eq", "ne", "lt", "le", "gt", "ge", "where", "clamp",
                                "log1p", "reciprocal", "rsqrt", "elu", "elu_backward", "lerp", "amax", "amin",
                                "argmax", "argmin", "index_select", "index_add", "uniform", "bernoulli",
                                "normal", "gather_sum", "max_pool2d", "max_pool2d_backward", "hardswish",
                                "hardswish_backward", "hardsigmoid", "hardsigmoid_backward", "mish", "mish_backward",
                                "sort", "floor", "ceil", "round", "trunc", "frac", "sin", "cos", "tan", "asin", "acos",
                                "atan", "sinh", "cosh", "erf", "erfc", "expm1", "log2", "log10", "exp2", "atan2", "hypot",
                                "copysign", "fmod", "lgamma", "digamma", "erfinv", "bitwise_and", "bitwise_or",
                                "bitwise_xor", "shift_left", "shift_right", "polygamma", "cholesky",
                                "triangular_solve", "lu_factor", "lu_solve", "gcd",
                                "index_reduce", "qr_factor", "householder_product", "symmetric_eigen", "singular_values", "ctc_lattice"};
  static_assert(std::size(names) == raccel::kTensorFns);
  for (size_t i = 0; i < std::size(names); ++i)
    if (name == names[i]) return static_cast<raccel::client::TensorFn>(i);
  throw py::value_error("no tensor function '" + name + "'");
}

raccel::client::TensorType typeNamed(const std::string& name) {
  if (name == "f32") return raccel::client::TensorType::f32;
  if (name == "i64") return raccel::client::TensorType::i64;
  if (name == "bool") return raccel::client::TensorType::boolean;
  if (name == "i32") return raccel::client::TensorType::i32;
  if (name == "f64") return raccel::client::TensorType::f64;
  if (name == "f16") return raccel::client::TensorType::f16;
  if (name == "bf16") return raccel::client::TensorType::bf16;
  throw py::value_error("no tensor element type '" + name + "' (f32, i64, bool, i32, f64, f16 or bf16)");
}

py::dict vaccelDict(const raccel::client::VaccelInfo& v) {
  py::dict d;
  d["id"] = v.id;
  d["block_tflops"] = v.blockTflops;
  d["blocks"] = v.blocks;
  d["memory_quota"] = v.memoryQuota;
  py::list cards;
  for (auto& c : v.cards) {
    py::dict card;
    card["node"] = c.node;
    card["index"] = c.index;
    card["kind"] = raccel::kindName(c.kind);
    card["model"] = c.model;
    card["blocks"] = c.blocks;
    card["memory_bytes"] = c.memoryBytes;
    cards.append(card);
  }
  d["cards"] = cards;
  d["description"] = v.describe();
  return d;
}

void fence(PySession& p) {
  raccel::Status s;
  {
    py::gil_scoped_release unlocked;
    std::lock_guard lock(p.shared->mu);
    s = p.s().fence();
  }
  check(s);
}

// A session call that only queues work, made under the session's lock.
template <typename R, typename... A>
auto locked(R (raccel::client::Session::*method)(A...)) {
  return [method](PySession& p, A... args) -> R {
    std::lock_guard lock(p.shared->mu);
    return (p.s().*method)(args...);
  };
}

// Session(...): a virtual accelerator opened through raccel-guestd (or `socket`).
PySession* openSession(double tflops, std::vector<std::string> kinds, std::string socket, std::string program, int priority,
                       int timeoutMs, unsigned admitWaitMs) {
  raccel::client::Options o;
  if (socket.empty()) socket = std::getenv("RACCEL_SOCKET") ? std::getenv("RACCEL_SOCKET") : "";
  if (!socket.empty()) o.socket = socket;
  o.program = program;
  o.tflops = tflops;
  o.priority = priority;
  o.timeoutMs = timeoutMs;
  o.admitWaitMs = admitWaitMs;
  for (auto& k : kinds) {
    auto kind = raccel::parseKind(k);
    if (!kind) throw py::value_error(kind.error().message);
    o.kinds.push_back(*kind);
  }
  raccel::Result<std::unique_ptr<raccel::client::Session>> opened;
  {
    py::gil_scoped_release unlocked;
    opened = raccel::client::Session::open(o);
  }
  if (!opened) raise(opened.error());
  auto self = std::make_unique<PySession>();
  self->shared->session = std::move(*opened);
  return self.release();
}

void writeBytes(PySession& p, Handle h, uint64_t offset, py::object data) {
  Py_buffer view;
  if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  std::unique_ptr<Py_buffer, decltype(&PyBuffer_Release)> release(&view, &PyBuffer_Release);  // also on a throw
  std::lock_guard lock(p.shared->mu);
  p.s().write(h, offset, std::span(static_cast<const std::byte*>(view.buf), static_cast<size_t>(view.len)));
}

py::bytes readBytes(PySession& p, Handle h, uint64_t offset, size_t nbytes) {
  std::string out(nbytes, '\0');
  raccel::Status s;
  {
    py::gil_scoped_release unlocked;
    std::lock_guard lock(p.shared->mu);
    s = p.s().read(h, offset, std::as_writable_bytes(std::span(out)));
  }
  check(s);
  return py::bytes(out);
}

void tensorOp(PySession& p, const std::string& fn, std::vector<uint64_t> shape,
              std::vector<std::tuple<Handle, uint64_t, std::vector<uint64_t>>> operands, float alpha, float beta,
              uint32_t reduceMask, int64_t ignoreIndex, bool mean, const std::vector<std::string>& types) {
  raccel::client::TensorOp op;
  op.fn = fnNamed(fn);
  op.shape = std::move(shape);
  if (types.size() > operands.size()) throw py::value_error("more types than operands");
  for (auto& [h, offset, strides] : operands) op.operands.push_back({h, offset, strides});
  for (size_t i = 0; i < types.size(); ++i) op.operands[i].type = typeNamed(types[i]);
  op.alpha = alpha, op.beta = beta, op.reduceMask = reduceMask, op.ignoreIndex = ignoreIndex, op.mean = mean;
  std::lock_guard lock(p.shared->mu);
  p.s().tensor(op);
}

}  // namespace

PYBIND11_MODULE(_raccel, m) {
  m.doc() = "libraccel's session API: a virtual accelerator's buffers, built-in ops and tensor ops";
  py::class_<PySession>(m, "Session")
      .def(py::init(&openSession),
           py::arg("tflops") = 1.0, py::arg("kinds") = std::vector<std::string>{}, py::arg("socket") = "",
           py::arg("program") = "python", py::arg("priority") = 0, py::arg("timeout_ms") = 120000,
           py::arg("admit_wait_ms") = 0,
           "Opens a virtual accelerator of `tflops` (socket: $RACCEL_SOCKET, else raccel-guestd's)")
      .def_property_readonly("vaccel", [](PySession& p) { return vaccelDict(p.s().vaccel()); })
      .def("alloc", locked(&raccel::client::Session::alloc), py::arg("nbytes"))
      .def("free", locked(&raccel::client::Session::free))
      .def("write", &writeBytes, py::arg("buffer"), py::arg("offset"), py::arg("data"), "Writes a contiguous bytes-like object")
      .def("read", &readBytes, py::arg("buffer"), py::arg("offset"), py::arg("nbytes"), "Waits for the bytes (and raises an earlier failure)")
      .def("copy", locked(&raccel::client::Session::copy))
      .def("fill", locked(&raccel::client::Session::fill))
      .def("gemm", locked(&raccel::client::Session::gemm), "c[m x n] = alpha * a[m x k] b[k x n] + beta * c (f32, row-major)")
      .def("axpy", locked(&raccel::client::Session::axpy))
      .def("vadd", locked(&raccel::client::Session::vadd))
      .def("reduce_sum", locked(&raccel::client::Session::reduceSum))
      .def("tensor", &tensorOp,
           py::arg("fn"), py::arg("shape"), py::arg("operands"), py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f,
           py::arg("reduce_mask") = 0u, py::arg("ignore_index") = -100, py::arg("mean") = true,
           py::arg("types") = std::vector<std::string>{},
           "A tensor op (schema/guest.capnp TensorOp); operands are (buffer, element offset, strides), the output "
           "first; types names their element types in order (f32, i64 or bool; f32 where not named)")
      .def("fence", &fence, "Waits for everything sent; raises the first failure not yet reported")
      .def("sync", &fence, "The same as fence()")
      .def("close", [](PySession& p) {
             py::gil_scoped_release unlocked;
             std::lock_guard lock(p.shared->mu);
             p.shared->session.reset();
           })
      .def("_capsule", [](PySession& p) {
             // A new reference to the shared session for another module (raccel.torch).
             auto* keep = new std::shared_ptr<SharedSession>(p.shared);
             return py::capsule(keep, raccel::python::kSessionCapsule, [](PyObject* c) {
               delete static_cast<std::shared_ptr<SharedSession>*>(PyCapsule_GetPointer(c, raccel::python::kSessionCapsule));
             });
           });
}
