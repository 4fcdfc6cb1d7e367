// libraccel-opencl: the OpenCL 1.2 API over raccel, as an installable client driver
// (ICD) that the system's OpenCL loader finds through /etc/OpenCL/vendors/raccel.icd.
//
// One platform with one device: the program's virtual accelerator. A context is one
// libraccel Session (one vaccel); every queue of a context feeds that session's single
// ordered instruction stream, so commands run in the order they were enqueued (an
// out-of-order queue is accepted and runs in order). Enqueues are asynchronous: nothing
// waits for the scheduler unless the program asks for data (a blocking read or map, an
// event's completion, clFinish). Commands behind a user event that has not completed
// are held in the ICD and sent when it completes.
//
// Threading: OpenCL's API is thread-safe; here one process-wide lock serializes every
// call (a Session is not thread-safe). Waits for user events release it.
//
// Every object begins with the loader's dispatch table pointer and is checked against
// the set of live objects of its type on every call: a released (or made-up) handle gets
// CL_INVALID_<TYPE>, never a crash.
#pragma once

#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_0_APIS
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl_icd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/program_units.h"
#include "vmfrontend/raccel.h"

namespace raccel::opencl {

struct Held;  // a command waiting for a user event (objects.cc)
extern cl_icd_dispatch kDispatch;  // dispatch.cc
void fillDispatch(cl_icd_dispatch& d);

// The process-wide lock (recursive: callbacks may call back into the API).
std::recursive_mutex& apiLock();
// Logs one line to stderr when RACCEL_OPENCL_LOG is set (or always for `always`).
void logLine(const std::string& line, bool always = false);

// What a context asks of raccel: from the environment (RACCEL_TFLOPS, RACCEL_PRIORITY,
// RACCEL_KINDS, RACCEL_SOCKET, RACCEL_PROGRAM, RACCEL_WAIT_MS, RACCEL_TIMEOUT_MS for
// hello, reads and waits, default 120000) over a config file
// (RACCEL_OPENCL_CONFIG, default /etc/raccel/opencl.conf: key = value lines).
client::Options sessionOptions(std::string* problem);

}  // namespace raccel::opencl

// The objects the loader hands back to us. Each begins with the dispatch pointer.
struct _cl_platform_id {
  cl_icd_dispatch* dispatch;
};

struct _cl_device_id {
  cl_icd_dispatch* dispatch;
  raccel::client::VaccelInfo vaccel;  // as the first session's welcome described it
};

// Counted objects: the dispatch pointer first (the loader reads it at offset 0).
struct RcObject {
  cl_icd_dispatch* dispatch = &raccel::opencl::kDispatch;
  std::atomic<cl_uint> refs{1};
};

struct _cl_event;

struct _cl_context : RcObject {
  std::unique_ptr<raccel::client::Session> session;
  std::vector<cl_context_properties> properties;
  void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*) = nullptr;
  void* notifyData = nullptr;
  // Events of commands sent and not yet known complete, by their last sequence number.
  std::multimap<uint64_t, _cl_event*> inFlight;
  // The sequence ranges of commands sent without an event (nobody can ask after them)
  // and not yet known complete, adjacent ones merged: a failure in one is still
  // `unreported` below. Bounded as inFlight is, by what the session keeps unanswered.
  std::deque<std::pair<uint64_t, uint64_t>> anonymous;
  std::condition_variable_any changed;  // an event completed, a user event was set
  uint64_t buildSeq = 0;                // the loadProgram a clBuildProgram waits on
  std::optional<raccel::Error> buildError;  // its failure, with the compiler's log
  bool lost = false;                    // the session failed for good
  // A command that failed on the card after its enqueue returned: its event says so, and
  // the next blocking call (a finish, a blocking read or write, a wait) returns it too,
  // so a program that never asks its events still learns of it.
  cl_int unreported = CL_SUCCESS;
  std::unique_ptr<std::thread> watcher;  // completes events that have callbacks
  bool watcherStop = false;
};

struct _cl_command_queue : RcObject {
  cl_context context;
  cl_command_queue_properties properties;
  // Commands held behind an incomplete user event, in order.
  std::deque<std::shared_ptr<raccel::opencl::Held>> held;
};

struct _cl_mem : RcObject {
  cl_context context;
  cl_mem_flags flags;
  size_t size;
  raccel::client::Handle handle;  // the parent's, for a sub-buffer
  uint64_t serial = 0;            // this object's own, never reused (its memory is)
  cl_mem parent = nullptr;
  size_t origin = 0;
  void* hostPtr = nullptr;
  int mapCount = 0;
  struct Mapping {
    size_t offset, size;
    bool write;
    bool owned;  // allocated here (not the USE_HOST_PTR memory)
    int count;   // times mapped and not yet unmapped
  };
  std::map<void*, Mapping> maps;
  std::vector<std::pair<void(CL_CALLBACK*)(cl_mem, void*), void*>> destructors;
  // An image: its pixels lie packed in the buffer (common/images.h), read as this says.
  // A 1D image of a buffer has that buffer as its parent.
  std::optional<raccel::ImageDesc> image;
  cl_image_format format{};
  size_t pixelBytes = 0;
};

struct _cl_program : RcObject {
  cl_context context;
  std::string source;
  std::string options;
  raccel::client::Handle handle = 0;  // 0 until built
  cl_build_status status = CL_BUILD_NONE;
  std::string log;
  raccel::client::ProgramInfo info;
  cl_uint kernelsAttached = 0;
  // Separate compilation: a compiled object or library keeps its units (compiled again
  // and linked on the card by clLinkProgram); an executable linked from units keeps
  // them too, for its binary.
  cl_program_binary_type binaryType = CL_PROGRAM_BINARY_TYPE_NONE;
  raccel::ProgramUnits units;
};

struct _cl_kernel : RcObject {
  cl_program program;
  const raccel::client::KernelInfo* info;  // in program->info
  struct ArgValue {
    bool set = false;
    raccel::client::Arg arg{raccel::client::Arg::Type::u64, 0};
    std::vector<std::byte> bytes;  // a by-value argument's bytes
    // Not retained (clSetKernelArg keeps no reference: a buffer released while set is
    // destroyed, its callbacks run); a launch checks it still lives by its serial.
    cl_mem mem = nullptr;
    uint64_t memSerial = 0;
  };
  std::vector<ArgValue> args;
};

struct _cl_event : RcObject {
  cl_context context;
  cl_command_queue queue = nullptr;  // null for a user event
  cl_command_type type;
  cl_int status = CL_QUEUED;
  uint64_t firstSeq = 0, lastSeq = 0;  // the instructions it sent (0 = none)
  cl_ulong queued = 0, submitted = 0, started = 0, ended = 0;  // ns
  std::vector<std::pair<void(CL_CALLBACK*)(cl_event, cl_int, void*), void*>> callbacks[3];  // complete, running, submitted
};

struct _cl_sampler : RcObject {
  cl_context context;
  cl_bool normalized;
  cl_addressing_mode addressing;
  cl_filter_mode filter;
};
