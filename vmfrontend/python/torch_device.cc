// raccel._torch: PyTorch's out-of-tree device (torch 1.13 calls it `privateuseone`)
// over a raccel session, so an unchanged training loop runs on the virtual accelerator.
//
// Memory: a tensor's storage is a range of a larger raccel buffer (chunks of 4 MiB, each
// twice the last up to 64 MiB: a small model's session holds, and its failover
// checkpoints read back, little more than it uses; a storage past 16 MiB gets a buffer
// of its own), so a tensor is no round trip. Its
// data pointer is an address in a private space, (chunk + 1) << 40 | byte offset, that
// is never dereferenced on the host: every kernel here turns it back into a buffer
// handle and an element offset.
//
// Compute: the training step's ops are raccel tensor ops (schema/guest.capnp TensorOp),
// sent asynchronously; only reading a value (.item(), .cpu(), printing) waits. Every
// other op goes to PyTorch's CPU fallback, which copies its operands to the host and
// back; each such op is counted (fallbacks(), and RACCEL_TORCH_FALLBACKS=1 prints them
// at exit). Ops on dtypes other than f32 (and i64 targets) fall back the same way.
//
// Threads: PyTorch's autograd engine runs backward on a thread of its own; every call
// on the session holds its lock (shared_session.h).
//
// The kernels live one family to a file (torch_<family>.cc), over the vocabulary of
// torch_device.h; this file holds the CPU fallback, the registration of every family,
// and the Python module.
#include <ATen/native/CPUFallback.h>
#include <pybind11/stl.h>

#include <cstdio>

#include "vmfrontend/python/torch_device.h"

namespace py = pybind11;

namespace raccel::python {
namespace {

// ---- Everything else: PyTorch's CPU fallback, counted ----------------------------------

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  // The _foreach_ ops (the optimizers' foreach paths, zero_grad's) are, on the CPU, loops
  // over the per-tensor ops: run here, each of those dispatches to this device's own. Not
  // a fallback: nothing leaves the card. (Through PyTorch's CPU fallback their in-place
  // forms changed CPU copies: the parameters never moved.)
  if (name.name.rfind("aten::_foreach_", 0) == 0) return op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  // Nor does that fallback copy back a list of tensors an op writes: refused, not wrong.
  for (const auto& arg : op.schema().arguments())
    TORCH_CHECK(!(arg.alias_info() && arg.alias_info()->isWrite() && arg.type()->kind() == c10::TypeKind::ListType),
                "raccel: ", name.name, " writes a list of tensors (", arg.name(), "), which the device cannot run on the host");
  countFallback(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
  const size_t arguments = op.schema().arguments().size();
  for (size_t i = stack->size() - std::min(arguments, stack->size()); i < stack->size(); ++i)
    if ((*stack)[i].isOptionalTensorList()) (*stack)[i] = hostIndices((*stack)[i].toOptionalTensorList());
  at::native::cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

// The ops that run on the card, registered by family.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  registerTensors(m);
  registerArithmetic(m);
  registerElementwise(m);
  registerComparisons(m);
  registerReductions(m);
  registerComposed(m);
  registerIndexing(m);
  registerCreation(m);
  registerConvolutions(m);
  registerPooling(m);
  registerResampling(m);
  registerNormsAndLosses(m);
  registerLinalg(m);
  registerCtc(m);
}

void printFallbacks() {
  std::lock_guard lock(state().countsMu);
  std::fprintf(stderr, "raccel.torch: %zu op%s fell back to the CPU%s\n", state().fallbacks.size(),
               state().fallbacks.size() == 1 ? "" : "s", state().fallbacks.empty() ? "" : " (op: calls)");
  for (auto& [op, n] : state().fallbacks) std::fprintf(stderr, "  %s: %llu\n", op.c_str(), static_cast<unsigned long long>(n));
}

}  // namespace
}  // namespace raccel::python

PYBIND11_MODULE(_torch, m) {
  using namespace raccel::python;
  m.doc() = "PyTorch's privateuseone device over a raccel session (use raccel.torch)";
  m.def("attach", [](py::capsule capsule) {
    auto* shared = static_cast<std::shared_ptr<SharedSession>*>(PyCapsule_GetPointer(capsule.ptr(), kSessionCapsule));
    if (!shared) throw py::error_already_set();
    auto previous = state().shared;
    if (previous && previous != *shared) throw std::runtime_error("raccel.torch is already attached to another session");
    state().shared = *shared;
  }, "Makes the device's tensors live in this session (a raccel.Session's _capsule())");
  m.def("attached", [] { return state().shared != nullptr; });
  m.def("read_storage", &readStorage, "A device storage's bytes (its data_ptr() and nbytes())");
  m.def("fallbacks", [] {
    std::lock_guard lock(state().countsMu);
    return state().fallbacks;
  }, "The ops that ran on the CPU instead, with how often");
  m.def("reset_fallbacks", [] {
    std::lock_guard lock(state().countsMu);
    state().fallbacks.clear();
  });
  m.def("print_fallbacks", &printFallbacks);
  m.def("index_reads", [] { return state().indexReads.load(); },
        "How many index checks have read an index's bounds from the card (each one wait)");
}
