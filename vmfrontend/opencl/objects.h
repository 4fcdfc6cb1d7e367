// Internals shared by libraccel-opencl's files: the live-object sets, info helpers,
// the event machinery and the command path. Called with apiLock() held.
#pragma once

#include <thread>
#include <unordered_set>

#include "common/limits.h"
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

using Lock = std::lock_guard<std::recursive_mutex>;

template <class T>
cl_int retainObject(T* o, cl_int invalid) {
  Lock lock(apiLock());
  if (!valid(o)) return invalid;
  o->refs++;
  return CL_SUCCESS;
}

// For a call that returns an object: sets *err (if asked for), returns null.
template <class T>
T* failWith(cl_int* err, cl_int rc) {
  if (err) *err = rc;
  return nullptr;
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
  ImageLimits images;                 // none: CL_DEVICE_IMAGE_SUPPORT is false
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

// ---------------------------------------------------------------------------------
// Buffers (api.cc), as images (images.cc) build on them.

// CL_DEVICE_MEM_BASE_ADDR_ALIGN / 8, as reported: PoCL's alignment. The card's own backend
// refuses a sub-buffer offset its device cannot take, naming its alignment.
inline constexpr size_t kBaseAlignBytes = 128;
inline constexpr size_t kMaxParameterBytes = 4096;

// Rectangles: rows of region[0] bytes, region[1] rows a slice, region[2] slices.
struct Rect {
  size_t origin[3], region[3], rowPitch, slicePitch;
  size_t offsetOf(size_t y, size_t z) const {
    return (origin[2] + z) * slicePitch + (origin[1] + y) * rowPitch + origin[0];
  }
  size_t end() const { return offsetOf(region[1] - 1, region[2] - 1) + region[0]; }
};
// A rectangle whose far end does not fit in a size_t (absurd origins or pitches) is
// CL_INVALID_VALUE: offsetOf() and end() never wrap.
inline cl_int makeRect(const size_t* origin, const size_t* region, size_t rowPitch, size_t slicePitch, Rect& r) {
  using limits::satAdd;
  using limits::satMul;
  if (!origin || !region || !region[0] || !region[1] || !region[2]) return CL_INVALID_VALUE;
  for (int i = 0; i < 3; ++i) r.origin[i] = origin[i], r.region[i] = region[i];
  r.rowPitch = rowPitch ? rowPitch : region[0];
  const uint64_t slice = satMul(r.rowPitch, region[1]);
  r.slicePitch = slicePitch ? slicePitch : slice;
  if (r.rowPitch < region[0] || r.slicePitch < slice) return CL_INVALID_VALUE;
  const uint64_t end = satAdd(satAdd(satMul(satAdd(origin[2], region[2] - 1), r.slicePitch),
                                     satMul(satAdd(origin[1], region[1] - 1), r.rowPitch)),
                              satAdd(origin[0], region[0]));
  return end < UINT64_MAX ? CL_SUCCESS : CL_INVALID_VALUE;
}

// The flags of a new memory object (0 becomes CL_MEM_READ_WRITE) and whether `host` is
// given exactly when they need it.
cl_int checkMemFlags(cl_mem_flags& flags, const void* host);
cl_mem newMem(cl_context c, cl_mem_flags flags, size_t size);
void releaseMem(cl_mem m);
void releaseProgramObject(cl_program p);
// CL_DEVICE_MAX_MEM_ALLOC_SIZE: the largest buffer or image.
cl_ulong maxAllocBytes();
// A queue and a memory object of its context: a buffer, or also an image.
cl_int checkQueueMem(cl_command_queue q, cl_mem m, bool imagesToo = false);
// The commands behind clEnqueue{Read,Write,Copy}BufferRect and clEnqueueMapBuffer, as
// `type`, on a queue and objects already checked.
cl_int enqueueReadRect(cl_command_queue q, cl_mem m, cl_bool blocking, const Rect& b, const Rect& h, void* out,
                       cl_uint nWait, const cl_event* wait, cl_event* event, cl_command_type type);
cl_int enqueueWriteRect(cl_command_queue q, cl_mem m, cl_bool blocking, const Rect& b, const Rect& h, const void* in,
                        cl_uint nWait, const cl_event* wait, cl_event* event, cl_command_type type);
cl_int enqueueCopyRect(cl_command_queue q, cl_mem src, cl_mem dst, const Rect& s, const Rect& d, cl_uint nWait,
                       const cl_event* wait, cl_event* event, cl_command_type type);
void* enqueueMapRange(cl_command_queue q, cl_mem m, cl_bool blocking, cl_map_flags flags, size_t offset, size_t n,
                      cl_uint nWait, const cl_event* wait, cl_event* event, cl_command_type type, cl_int* err);
// `n` bytes from `offset` filled with `pattern` repeated (sent now: call inside a command).
void fillRange(cl_context c, cl_mem m, size_t offset, size_t n, const std::vector<std::byte>& pattern);

// Images and samplers (images.cc): their slots of the dispatch table, and a kernel
// argument that is an image (a global argument whose type isImageTypeName) or a sampler.
void fillImageDispatch(cl_icd_dispatch& d);
cl_int imageArg(cl_context c, size_t size, const void* value, _cl_kernel::ArgValue& a);
cl_int samplerArg(cl_context c, size_t size, const void* value, _cl_kernel::ArgValue& a);
// Whether every card of the vaccel that runs OpenCL C takes images.
bool imagesSupported();

cl_context createContext(const cl_context_properties* props,
                         void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*), void* data, cl_int* err);
void releaseContext(cl_context ctx);
void releaseQueue(cl_command_queue q);

}  // namespace raccel::opencl
