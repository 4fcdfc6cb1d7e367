// Internals shared by libraccel-opencl's files: the live-object sets, info helpers,
// the event machinery and the command path. Called with apiLock() held.
#pragma once

#include <thread>
#include <unordered_set>

#include "vmfrontend/opencl/icd.h"

namespace raccel::opencl {

// The objects of each type that exist: a handle not in its set is invalid.
template <class T>
std::unordered_set<T*>& live() {
  static std::unordered_set<T*> set;
  return set;
}
template <class T>
bool valid(T* object) {
  return object && live<T>().count(object);
}

// Objects are made and buried here, never handed back to the heap: the loader reads an
// object's dispatch pointer before we can check the handle, so a released object's
// memory keeps that pointer (and our check then answers CL_INVALID_<TYPE>). A buried
// object's memory is reused for the next object of its type.
template <class T>
std::vector<T*>& graveyard() {
  static std::vector<T*> dead;
  return dead;
}
template <class T>
T* make() {
  auto& dead = graveyard<T>();
  T* o;
  if (dead.empty()) {
    o = new T();
  } else {
    o = new (dead.back()) T();
    dead.pop_back();
  }
  live<T>().insert(o);
  return o;
}
template <class T>
void bury(T* o) {
  live<T>().erase(o);
  o->~T();
  *reinterpret_cast<cl_icd_dispatch**>(o) = &kDispatch;
  graveyard<T>().push_back(o);
}

cl_platform_id thePlatform();
cl_device_id theDevice();
// Opens the first session, which describes the device; false (with a logged reason)
// when raccel cannot be reached.
bool probeDevice();
const client::CardInfo* openclCard();
Result<std::unique_ptr<client::Session>> openSession();

struct OpenclFeatures {
  std::string extensions;  // CL_DEVICE_EXTENSIONS
  cl_device_fp_config doubleFp = 0;  // 0: no cl_khr_fp64
};
// What every card of the vaccel that runs OpenCL C has (after probeDevice()).
const OpenclFeatures& openclFeatures();

cl_ulong nowNs();
cl_int setInfo(const void* value, size_t size, size_t capacity, void* out, size_t* sizeRet);
cl_int setString(const std::string& s, size_t capacity, void* out, size_t* sizeRet);
template <class T>
cl_int setValue(const T& v, size_t capacity, void* out, size_t* sizeRet) {
  return setInfo(&v, sizeof v, capacity, out, sizeRet);
}
cl_int clCode(Code code);

cl_event newEvent(cl_context ctx, cl_command_queue queue, cl_command_type type);
void retain(cl_event e);
void release(cl_event e);
void complete(cl_event e, cl_int status);
void settle(cl_context ctx);
cl_int fence(cl_context ctx);
// The failure of a command that failed on the card since the last blocking call, once.
cl_int takeUnreported(cl_context ctx);
void loseSession(cl_context ctx, const std::string& why);
void drainHeld(cl_context ctx);
cl_int waitEvent(cl_event e);
cl_int checkWaitList(cl_context ctx, cl_uint n, const cl_event* list);
// Whether enqueue() would hold a command with this wait list on `q` (behind an
// incomplete user event) rather than send it now: such a command keeps its own copies.
bool wouldHold(cl_command_queue q, cl_uint nWait, const cl_event* waitList);
void watchCallbacks(cl_context ctx);

// Runs (or, behind an incomplete user event, holds) one command: `run` sends its
// instructions (or does a synchronous part, such as a read) and returns CL_SUCCESS or
// the command's error. A held command whose wait list fails never runs: what `run`
// holds (references, host memory) is let go when it is destroyed, with the lock held. Blocking commands wait for it. The event, if asked for, is the
// caller's.
cl_int enqueue(cl_command_queue q, cl_uint nWait, const cl_event* waitList, cl_event* eventOut, cl_command_type type,
               bool blocking, std::function<cl_int()> run);

cl_context createContext(const cl_context_properties* props,
                         void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*), void* data, cl_int* err);
void releaseContext(cl_context ctx);
void releaseQueue(cl_command_queue q);

}  // namespace raccel::opencl
