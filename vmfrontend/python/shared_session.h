// The session the Python binding (_raccel) opens and the torch device (_torch) drives:
// one libraccel Session behind one lock, handed from one module to the other as a
// capsule. Both modules link the same shared libraccel (libraccel.so beside them), so
// the object is the same code on both sides.
#pragma once

#include <memory>
#include <mutex>  // std::recursive_mutex

#include "vmfrontend/raccel.h"

namespace raccel::python {

inline constexpr const char* kSessionCapsule = "raccel.SharedSession";

struct SharedSession {
  std::recursive_mutex mu;  // every call on `session` holds it (the autograd engine has threads of its own)
  std::unique_ptr<client::Session> session;
};

}  // namespace raccel::python
