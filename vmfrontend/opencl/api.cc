// The OpenCL 1.2 entry points of libraccel-opencl (see icd.h), and the dispatch table
// the loader calls them through. Every entry point takes the API lock, checks its
// handles against the live objects, and answers with the standard error codes.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <bit>
#include <fstream>
#include <sstream>
#include <set>
#include <tuple>

#include "vmfrontend/opencl/objects.h"

extern "C" {
void* CL_API_CALL clGetExtensionFunctionAddress(const char* name);
void* CL_API_CALL clGetExtensionFunctionAddressForPlatform(cl_platform_id p, const char* name);
}

namespace raccel::opencl {
namespace {

constexpr char kBinaryMagic[] = "RACCEL-OPENCL-C 1\n";  // a "binary" is this, the options line, then the source
// The binary of a compiled object, a library or an executable linked from units: this,
// one of 'O', 'L', 'E', then the units (common/program_units.h).
constexpr char kUnitsMagic[] = "RACCEL-OPENCL-UNITS 1\n";

std::string binaryOf(cl_program p) {
  if (p->units.units.empty()) return kBinaryMagic + p->source;
  char type = p->binaryType == CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT ? 'O'
              : p->binaryType == CL_PROGRAM_BINARY_TYPE_LIBRARY       ? 'L'
                                                                      : 'E';
  auto units = encodeUnits(p->units);
  return kUnitsMagic + std::string(1, type) + std::string(reinterpret_cast<const char*>(units.data()), units.size());
}


// ---------------------------------------------------------------------------------
// Platform and device

cl_int CL_API_CALL getPlatformIDs(cl_uint n, cl_platform_id* out, cl_uint* count) {
  if ((n == 0 && out) || (!out && !count)) return CL_INVALID_VALUE;
  if (out) out[0] = thePlatform();
  if (count) *count = 1;
  return CL_SUCCESS;
}

cl_int CL_API_CALL getPlatformInfo(cl_platform_id p, cl_platform_info what, size_t size, void* out, size_t* ret) {
  if (p && p != thePlatform()) return CL_INVALID_PLATFORM;
  switch (what) {
    case CL_PLATFORM_PROFILE: return setString("FULL_PROFILE", size, out, ret);
    case CL_PLATFORM_VERSION: return setString("OpenCL 1.2 raccel", size, out, ret);
    case CL_PLATFORM_NAME: return setString("raccel", size, out, ret);
    case CL_PLATFORM_VENDOR: return setString("raccel", size, out, ret);
    case CL_PLATFORM_EXTENSIONS: return setString("cl_khr_icd", size, out, ret);
    case CL_PLATFORM_ICD_SUFFIX_KHR: return setString("raccel", size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_device_type deviceType() {
  const client::CardInfo* c = openclCard();
  if (!c) return CL_DEVICE_TYPE_DEFAULT;
  switch (c->kind) {
    case CardKind::gpu: return CL_DEVICE_TYPE_GPU;
    case CardKind::cpu: return CL_DEVICE_TYPE_CPU;
    default: return CL_DEVICE_TYPE_ACCELERATOR;
  }
}

cl_int CL_API_CALL getDeviceIDs(cl_platform_id p, cl_device_type type, cl_uint n, cl_device_id* out, cl_uint* count) {
  Lock lock(apiLock());
  if (p && p != thePlatform()) return CL_INVALID_PLATFORM;
  if ((n == 0 && out) || (!out && !count)) return CL_INVALID_VALUE;
  const cl_device_type known = CL_DEVICE_TYPE_DEFAULT | CL_DEVICE_TYPE_CPU | CL_DEVICE_TYPE_GPU |
                               CL_DEVICE_TYPE_ACCELERATOR | CL_DEVICE_TYPE_CUSTOM;
  if (type != CL_DEVICE_TYPE_ALL && (type == 0 || (type & ~known))) return CL_INVALID_DEVICE_TYPE;
  if (!probeDevice()) return CL_DEVICE_NOT_FOUND;
  if (type != CL_DEVICE_TYPE_ALL && type != CL_DEVICE_TYPE_DEFAULT && !(type & deviceType())) return CL_DEVICE_NOT_FOUND;
  if (out) out[0] = theDevice();
  if (count) *count = 1;
  return CL_SUCCESS;
}

cl_int CL_API_CALL getDeviceInfo(cl_device_id d, cl_device_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (d != theDevice() || !probeDevice()) return CL_INVALID_DEVICE;
  const client::VaccelInfo& v = d->vaccel;
  const client::CardInfo* card = openclCard();
  uint64_t memory = 0;
  for (auto& c : v.cards) memory += c.memoryBytes;
  if (v.memoryQuota && (memory == 0 || v.memoryQuota < memory)) memory = v.memoryQuota;
  uint32_t units = 0;
  for (auto& c : v.cards) units += c.computeUnits;
  size_t wg = card && card->maxWorkGroupSize ? card->maxWorkGroupSize : 256;
  cl_ulong local = card && card->localMemBytes ? card->localMemBytes : 32768;
  bool compiler = card && card->runs(ProgramKind::openclC);
  const ImageLimits& images = openclFeatures().images;
  std::string name = "raccel vaccel #" + std::to_string(v.id) + " (" + std::to_string(v.cards.size()) + " card(s):";
  for (auto& c : v.cards) name += std::string(" ") + kindName(c.kind) + " " + c.model + " x" + std::to_string(c.blocks);
  name += ")";
  auto u = [&](cl_uint x) { return setValue(x, size, out, ret); };
  auto ul = [&](cl_ulong x) { return setValue(x, size, out, ret); };
  auto sz = [&](size_t x) { return setValue(x, size, out, ret); };
  auto b = [&](cl_bool x) { return setValue(x, size, out, ret); };
  switch (what) {
    case CL_DEVICE_TYPE: return setValue(deviceType(), size, out, ret);
    case CL_DEVICE_VENDOR_ID: return u(0x7261);
    case CL_DEVICE_MAX_COMPUTE_UNITS: return u(std::max<uint32_t>(units, 1));
    case CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS: return u(3);
    case CL_DEVICE_MAX_WORK_ITEM_SIZES: {
      size_t sizes[3] = {wg, wg, wg};
      return setInfo(sizes, sizeof sizes, size, out, ret);
    }
    case CL_DEVICE_MAX_WORK_GROUP_SIZE: return sz(wg);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_CHAR: case CL_DEVICE_NATIVE_VECTOR_WIDTH_CHAR: return u(16);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_SHORT: case CL_DEVICE_NATIVE_VECTOR_WIDTH_SHORT: return u(8);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_INT: case CL_DEVICE_NATIVE_VECTOR_WIDTH_INT: return u(4);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_LONG: case CL_DEVICE_NATIVE_VECTOR_WIDTH_LONG: return u(2);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT: case CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT: return u(4);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_DOUBLE: case CL_DEVICE_NATIVE_VECTOR_WIDTH_DOUBLE:
      return u(openclFeatures().doubleFp ? 2 : 0);
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_HALF: case CL_DEVICE_NATIVE_VECTOR_WIDTH_HALF: return u(0);
    case CL_DEVICE_MAX_CLOCK_FREQUENCY: return u(1000);
    case CL_DEVICE_ADDRESS_BITS: return u(64);
    // One buffer lives on one card: as much as the OpenCL card's share holds (never below
    // the standard's minimum of a quarter of the memory, or 128 MiB).
    case CL_DEVICE_MAX_MEM_ALLOC_SIZE:
      return ul(std::max<cl_ulong>({memory / 4, std::min<cl_ulong>(memory, 128ull << 20),
                                   std::min<cl_ulong>(memory, card ? card->memoryBytes : 0)}));
    case CL_DEVICE_GLOBAL_MEM_SIZE: return ul(memory);
    // Images: what every card that runs OpenCL C for the vaccel takes (none: all 0).
    case CL_DEVICE_IMAGE_SUPPORT: return b(images.supported());
    case CL_DEVICE_MAX_READ_IMAGE_ARGS: return u(images.maxReadArgs);
    case CL_DEVICE_MAX_WRITE_IMAGE_ARGS: case CL_DEVICE_MAX_READ_WRITE_IMAGE_ARGS: return u(images.maxWriteArgs);
    case CL_DEVICE_MAX_SAMPLERS: return u(images.maxSamplers);
    case CL_DEVICE_IMAGE2D_MAX_WIDTH: return sz(images.max2dWidth);
    case CL_DEVICE_IMAGE2D_MAX_HEIGHT: return sz(images.max2dHeight);
    case CL_DEVICE_IMAGE3D_MAX_WIDTH: return sz(images.max3dWidth);
    case CL_DEVICE_IMAGE3D_MAX_HEIGHT: return sz(images.max3dHeight);
    case CL_DEVICE_IMAGE3D_MAX_DEPTH: return sz(images.max3dDepth);
    case CL_DEVICE_IMAGE_MAX_BUFFER_SIZE: return sz(images.maxBufferPixels);
    case CL_DEVICE_IMAGE_MAX_ARRAY_SIZE: return sz(images.maxArraySize);
    case CL_DEVICE_IMAGE_PITCH_ALIGNMENT: case CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT: return u(images.supported() ? 1 : 0);
    case CL_DEVICE_MAX_PARAMETER_SIZE: return sz(kMaxParameterBytes);
    case CL_DEVICE_MEM_BASE_ADDR_ALIGN: return u(kBaseAlignBytes * 8);
    case CL_DEVICE_MIN_DATA_TYPE_ALIGN_SIZE: return u(128);
    case CL_DEVICE_SINGLE_FP_CONFIG:
      return setValue(cl_device_fp_config(CL_FP_DENORM | CL_FP_INF_NAN | CL_FP_ROUND_TO_NEAREST | CL_FP_FMA), size, out, ret);
    case CL_DEVICE_DOUBLE_FP_CONFIG: return setValue(openclFeatures().doubleFp, size, out, ret);
    case CL_DEVICE_HALF_FP_CONFIG: return setValue(cl_device_fp_config(0), size, out, ret);
    case CL_DEVICE_GLOBAL_MEM_CACHE_TYPE: return setValue(cl_device_mem_cache_type(CL_NONE), size, out, ret);
    case CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE: return u(64);
    case CL_DEVICE_GLOBAL_MEM_CACHE_SIZE: return ul(0);
    case CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE: return ul(64 * 1024);
    case CL_DEVICE_MAX_CONSTANT_ARGS: return u(8);
    case CL_DEVICE_LOCAL_MEM_TYPE: return setValue(cl_device_local_mem_type(CL_LOCAL), size, out, ret);
    case CL_DEVICE_LOCAL_MEM_SIZE: return ul(local);
    case CL_DEVICE_ERROR_CORRECTION_SUPPORT: return b(CL_FALSE);
    case CL_DEVICE_HOST_UNIFIED_MEMORY: return b(CL_FALSE);
    case CL_DEVICE_PROFILING_TIMER_RESOLUTION: return sz(1);
    case CL_DEVICE_ENDIAN_LITTLE: return b(CL_TRUE);
    case CL_DEVICE_AVAILABLE: return b(CL_TRUE);
    case CL_DEVICE_COMPILER_AVAILABLE: return b(compiler ? CL_TRUE : CL_FALSE);
    case CL_DEVICE_LINKER_AVAILABLE: return b(card && card->runs(ProgramKind::openclUnits) ? CL_TRUE : CL_FALSE);
    case CL_DEVICE_EXECUTION_CAPABILITIES: return setValue(cl_device_exec_capabilities(CL_EXEC_KERNEL), size, out, ret);
    case CL_DEVICE_QUEUE_PROPERTIES:
      return setValue(cl_command_queue_properties(CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_PROFILING_ENABLE), size,
                      out, ret);
    case CL_DEVICE_PLATFORM: return setValue(thePlatform(), size, out, ret);
    case CL_DEVICE_NAME: return setString(name, size, out, ret);
    case CL_DEVICE_VENDOR: return setString("raccel", size, out, ret);
    case CL_DRIVER_VERSION: return setString("1.0", size, out, ret);
    case CL_DEVICE_PROFILE: return setString("FULL_PROFILE", size, out, ret);
    case CL_DEVICE_VERSION: return setString("OpenCL 1.2 raccel", size, out, ret);
    case CL_DEVICE_OPENCL_C_VERSION: return setString("OpenCL C 1.2 ", size, out, ret);
    case CL_DEVICE_EXTENSIONS: return setString(openclFeatures().extensions, size, out, ret);
    case CL_DEVICE_PRINTF_BUFFER_SIZE: return sz(0);
    case CL_DEVICE_PREFERRED_INTEROP_USER_SYNC: return b(CL_TRUE);
    case CL_DEVICE_PARENT_DEVICE: return setValue(cl_device_id(nullptr), size, out, ret);
    case CL_DEVICE_PARTITION_MAX_SUB_DEVICES: return u(0);
    case CL_DEVICE_PARTITION_PROPERTIES: case CL_DEVICE_PARTITION_TYPE:
      return setValue(cl_device_partition_property(0), size, out, ret);
    case CL_DEVICE_PARTITION_AFFINITY_DOMAIN: return setValue(cl_device_affinity_domain(0), size, out, ret);
    case CL_DEVICE_REFERENCE_COUNT: return u(1);
    case CL_DEVICE_BUILT_IN_KERNELS: return setString("", size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

}  // namespace

cl_ulong maxAllocBytes() {
  cl_ulong maxAlloc = 0;
  getDeviceInfo(theDevice(), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof maxAlloc, &maxAlloc, nullptr);
  return maxAlloc;
}

namespace {

cl_int CL_API_CALL retainDevice(cl_device_id d) { return d == theDevice() ? CL_SUCCESS : CL_INVALID_DEVICE; }
cl_int CL_API_CALL releaseDevice(cl_device_id d) { return d == theDevice() ? CL_SUCCESS : CL_INVALID_DEVICE; }
cl_int CL_API_CALL createSubDevices(cl_device_id d, const cl_device_partition_property*, cl_uint, cl_device_id*, cl_uint*) {
  if (d != theDevice()) return CL_INVALID_DEVICE;
  logLine("clCreateSubDevices: a vaccel is not partitioned; ask for a smaller one instead (RACCEL_TFLOPS)", true);
  return CL_INVALID_VALUE;
}

// ---------------------------------------------------------------------------------
// Contexts

bool ourDevices(cl_uint n, const cl_device_id* devices) {
  if (n == 0 || !devices) return false;
  for (cl_uint i = 0; i < n; ++i)
    if (devices[i] != theDevice()) return false;
  return true;
}

cl_context CL_API_CALL createContext(const cl_context_properties* props, cl_uint n, const cl_device_id* devices,
                                     void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*), void* data,
                                     cl_int* err) {
  Lock lock(apiLock());
  if (!devices || n == 0 || (!notify && data)) return failWith<_cl_context>(err, CL_INVALID_VALUE);
  if (!ourDevices(n, devices)) return failWith<_cl_context>(err, CL_INVALID_DEVICE);
  return opencl::createContext(props, notify, data, err);
}

cl_context CL_API_CALL createContextFromType(const cl_context_properties* props, cl_device_type type,
                                             void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*), void* data,
                                             cl_int* err) {
  Lock lock(apiLock());
  if (!notify && data) return failWith<_cl_context>(err, CL_INVALID_VALUE);
  if (!probeDevice()) return failWith<_cl_context>(err, CL_DEVICE_NOT_FOUND);
  if (type != CL_DEVICE_TYPE_ALL && type != CL_DEVICE_TYPE_DEFAULT && !(type & deviceType()))
    return failWith<_cl_context>(err, CL_DEVICE_NOT_FOUND);
  return opencl::createContext(props, notify, data, err);
}

cl_int CL_API_CALL retainContext(cl_context c) { return retainObject(c, CL_INVALID_CONTEXT); }

cl_int CL_API_CALL releaseContext(cl_context c) {
  Lock lock(apiLock());
  if (!valid(c)) return CL_INVALID_CONTEXT;
  opencl::releaseContext(c);
  return CL_SUCCESS;
}

cl_int CL_API_CALL getContextInfo(cl_context c, cl_context_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(c)) return CL_INVALID_CONTEXT;
  cl_device_id d = theDevice();
  switch (what) {
    case CL_CONTEXT_REFERENCE_COUNT: return setValue(cl_uint(c->refs), size, out, ret);
    case CL_CONTEXT_NUM_DEVICES: return setValue(cl_uint(1), size, out, ret);
    case CL_CONTEXT_DEVICES: return setValue(d, size, out, ret);
    case CL_CONTEXT_PROPERTIES:
      return setInfo(c->properties.data(), c->properties.size() * sizeof(cl_context_properties), size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

// ---------------------------------------------------------------------------------
// Queues

cl_command_queue makeQueue(cl_context c, cl_device_id d, cl_command_queue_properties props, cl_int* err) {
  if (!valid(c)) return failWith<_cl_command_queue>(err, CL_INVALID_CONTEXT);
  if (d != theDevice()) return failWith<_cl_command_queue>(err, CL_INVALID_DEVICE);
  // Bits the standard does not define are invalid values; defined ones this device lacks
  // (OpenCL 2's on-device queues) are unsupported properties.
  const cl_command_queue_properties supported = CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_PROFILING_ENABLE;
  const cl_command_queue_properties defined = supported | (1 << 2) | (1 << 3);  // CL_QUEUE_ON_DEVICE(_DEFAULT)
  if (props & ~defined) return failWith<_cl_command_queue>(err, CL_INVALID_VALUE);
  if (props & ~supported) return failWith<_cl_command_queue>(err, CL_INVALID_QUEUE_PROPERTIES);
  auto* q = make<_cl_command_queue>();
  q->context = c;
  q->properties = props;
  c->refs++;
  if (err) *err = CL_SUCCESS;
  return q;
}

cl_command_queue CL_API_CALL createCommandQueue(cl_context c, cl_device_id d, cl_command_queue_properties props,
                                                cl_int* err) {
  Lock lock(apiLock());
  return makeQueue(c, d, props, err);
}

cl_command_queue CL_API_CALL createCommandQueueWithProperties(cl_context c, cl_device_id d,
                                                              const cl_queue_properties* props, cl_int* err) {
  Lock lock(apiLock());
  cl_command_queue_properties flags = 0;
  for (const cl_queue_properties* p = props; p && *p; p += 2) {
    if (p[0] == CL_QUEUE_PROPERTIES) flags = p[1];
    else return failWith<_cl_command_queue>(err, CL_INVALID_VALUE);
  }
  return makeQueue(c, d, flags, err);
}

cl_int CL_API_CALL retainCommandQueue(cl_command_queue q) { return retainObject(q, CL_INVALID_COMMAND_QUEUE); }

cl_int CL_API_CALL releaseCommandQueue(cl_command_queue q) {
  Lock lock(apiLock());
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  // An implicit flush. (Held commands keep their queue: their events hold it.)
  if (q->refs == 1 && !q->context->lost) (void)q->context->session->flush();
  releaseQueue(q);
  return CL_SUCCESS;
}

cl_int CL_API_CALL getCommandQueueInfo(cl_command_queue q, cl_command_queue_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  switch (what) {
    case CL_QUEUE_CONTEXT: return setValue(q->context, size, out, ret);
    case CL_QUEUE_DEVICE: return setValue(theDevice(), size, out, ret);
    case CL_QUEUE_REFERENCE_COUNT: return setValue(cl_uint(q->refs), size, out, ret);
    case CL_QUEUE_PROPERTIES: return setValue(q->properties, size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL setCommandQueueProperty(cl_command_queue q, cl_command_queue_properties, cl_bool,
                                           cl_command_queue_properties*) {
  Lock lock(apiLock());
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  logLine("clSetCommandQueueProperty is deprecated since OpenCL 1.1 and not supported", true);
  return CL_INVALID_OPERATION;
}

cl_int CL_API_CALL flush(cl_command_queue q) {
  Lock lock(apiLock());
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  if (q->context->lost) return CL_OUT_OF_RESOURCES;
  if (auto s = q->context->session->flush(); !s) {
    loseSession(q->context, s.error().message);
    return CL_OUT_OF_RESOURCES;
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL finish(cl_command_queue q) {
  Lock lock(apiLock());
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  cl_context ctx = q->context;
  q->refs++;
  while (!q->held.empty() && !ctx->lost) {  // behind a user event another thread sets
    std::unique_lock<std::recursive_mutex> wait(apiLock(), std::adopt_lock);
    ctx->changed.wait(wait);
    wait.release();
  }
  cl_int rc = fence(ctx);
  if (rc == CL_SUCCESS) rc = takeUnreported(ctx);
  releaseQueue(q);
  return rc;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Buffers (external: images.cc builds on them)

cl_int checkMemFlags(cl_mem_flags& flags, const void* host) {
  if (flags == 0) flags = CL_MEM_READ_WRITE;
  const cl_mem_flags access = CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY;
  const cl_mem_flags hostAccess = CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
  if (flags & ~(access | hostAccess | CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR))
    return CL_INVALID_VALUE;
  if (std::popcount(flags & access) > 1 || std::popcount(flags & hostAccess) > 1 ||
      ((flags & CL_MEM_USE_HOST_PTR) && (flags & (CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR))))
    return CL_INVALID_VALUE;
  bool needsHost = flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR);
  return needsHost == (host != nullptr) ? CL_SUCCESS : CL_INVALID_HOST_PTR;
}

cl_mem newMem(cl_context c, cl_mem_flags flags, size_t size) {
  static uint64_t serials = 0;
  auto* m = make<_cl_mem>();
  m->serial = ++serials;
  m->context = c;
  m->flags = flags;
  m->size = size;
  c->refs++;
  return m;
}

cl_mem CL_API_CALL createBuffer(cl_context c, cl_mem_flags flags, size_t size, void* host, cl_int* err) {
  Lock lock(apiLock());
  if (!valid(c)) return failWith<_cl_mem>(err, CL_INVALID_CONTEXT);
  if (cl_int rc = checkMemFlags(flags, host); rc != CL_SUCCESS) return failWith<_cl_mem>(err, rc);
  bool needsHost = flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR);
  if (size == 0 || size > maxAllocBytes()) return failWith<_cl_mem>(err, CL_INVALID_BUFFER_SIZE);
  if (c->lost) return failWith<_cl_mem>(err, CL_OUT_OF_RESOURCES);
  cl_mem m = newMem(c, flags, size);
  m->handle = c->session->alloc(size);
  if (flags & CL_MEM_USE_HOST_PTR) m->hostPtr = host;
  if (needsHost) c->session->write(m->handle, 0, std::span(static_cast<const std::byte*>(host), size));
  if (err) *err = CL_SUCCESS;
  return m;
}

cl_mem CL_API_CALL createSubBuffer(cl_mem parent, cl_mem_flags flags, cl_buffer_create_type type, const void* info,
                                   cl_int* err) {
  Lock lock(apiLock());
  if (!valid(parent) || parent->parent || parent->image) return failWith<_cl_mem>(err, CL_INVALID_MEM_OBJECT);
  if (type != CL_BUFFER_CREATE_TYPE_REGION || !info) return failWith<_cl_mem>(err, CL_INVALID_VALUE);
  auto* region = static_cast<const cl_buffer_region*>(info);
  if (region->size == 0) return failWith<_cl_mem>(err, CL_INVALID_BUFFER_SIZE);
  if (region->origin > parent->size || region->size > parent->size - region->origin)
    return failWith<_cl_mem>(err, CL_INVALID_VALUE);
  if (region->origin % kBaseAlignBytes) return failWith<_cl_mem>(err, CL_MISALIGNED_SUB_BUFFER_OFFSET);
  if (flags & (CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR)) return failWith<_cl_mem>(err, CL_INVALID_VALUE);
  if (!(flags & (CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY)))
    flags |= parent->flags & (CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY);
  cl_mem m = newMem(parent->context, flags | (parent->flags & CL_MEM_USE_HOST_PTR), region->size);
  m->handle = parent->handle;
  m->parent = parent;
  m->origin = region->origin;
  if (parent->hostPtr) m->hostPtr = static_cast<char*>(parent->hostPtr) + region->origin;
  parent->refs++;
  if (err) *err = CL_SUCCESS;
  return m;
}

cl_int CL_API_CALL retainMemObject(cl_mem m) { return retainObject(m, CL_INVALID_MEM_OBJECT); }

void releaseMem(cl_mem m) {
  if (--m->refs > 0) return;
  for (auto it = m->destructors.rbegin(); it != m->destructors.rend(); ++it) it->first(m, it->second);
  for (auto& [ptr, map] : m->maps)
    if (map.owned) std::free(ptr);
  cl_context c = m->context;
  if (m->parent) releaseMem(m->parent);
  else if (!c->lost) c->session->free(m->handle);
  bury(m);
  opencl::releaseContext(c);
}

cl_int CL_API_CALL releaseMemObject(cl_mem m) {
  Lock lock(apiLock());
  if (!valid(m)) return CL_INVALID_MEM_OBJECT;
  releaseMem(m);
  return CL_SUCCESS;
}

cl_int CL_API_CALL setMemObjectDestructorCallback(cl_mem m, void(CL_CALLBACK* fn)(cl_mem, void*), void* data) {
  Lock lock(apiLock());
  if (!valid(m)) return CL_INVALID_MEM_OBJECT;
  if (!fn) return CL_INVALID_VALUE;
  m->destructors.emplace_back(fn, data);
  return CL_SUCCESS;
}

cl_int CL_API_CALL getMemObjectInfo(cl_mem m, cl_mem_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(m)) return CL_INVALID_MEM_OBJECT;
  switch (what) {
    case CL_MEM_TYPE: return setValue(cl_mem_object_type(m->image ? m->image->type : CL_MEM_OBJECT_BUFFER), size, out, ret);
    case CL_MEM_FLAGS: return setValue(m->flags, size, out, ret);
    case CL_MEM_SIZE: return setValue(m->size, size, out, ret);
    case CL_MEM_HOST_PTR: return setValue(m->hostPtr, size, out, ret);
    case CL_MEM_MAP_COUNT: return setValue(cl_uint(m->mapCount), size, out, ret);
    case CL_MEM_REFERENCE_COUNT: return setValue(cl_uint(m->refs), size, out, ret);
    case CL_MEM_CONTEXT: return setValue(m->context, size, out, ret);
    case CL_MEM_ASSOCIATED_MEMOBJECT: return setValue(m->parent, size, out, ret);
    case CL_MEM_OFFSET: return setValue(m->image ? size_t{0} : m->origin, size, out, ret);
    case CL_MEM_USES_SVM_POINTER: return setValue(cl_bool(CL_FALSE), size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int checkQueueMem(cl_command_queue q, cl_mem m, bool imagesToo) {
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  if (!valid(m) || (m->image && !imagesToo)) return CL_INVALID_MEM_OBJECT;
  if (m->context != q->context) return CL_INVALID_CONTEXT;
  return CL_SUCCESS;
}

bool inRange(cl_mem m, size_t offset, size_t n) { return offset <= m->size && n <= m->size - offset; }

cl_int readInto(cl_context c, cl_mem m, size_t offset, size_t n, void* out) {
  if (n == 0) return CL_SUCCESS;
  auto s = c->session->read(m->handle, m->origin + offset, std::span(static_cast<std::byte*>(out), n));
  if (!s) {
    logLine("read failed: " + s.error().message, true);
    if (s.error().code == Code::unavailable) loseSession(c, s.error().message);
    return clCode(s.error().code);
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL enqueueReadBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t offset, size_t n, void* out,
                                     cl_uint nWait, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, m); rc != CL_SUCCESS) return rc;
  if (!out || !inRange(m, offset, n)) return CL_INVALID_VALUE;
  cl_context c = q->context;
  return enqueue(q, nWait, wait, event, CL_COMMAND_READ_BUFFER, blocking,
                 [=] { return readInto(c, m, offset, n, out); });
}

cl_int CL_API_CALL enqueueWriteBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t offset, size_t n,
                                      const void* in, cl_uint nWait, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, m); rc != CL_SUCCESS) return rc;
  if (!in || !inRange(m, offset, n)) return CL_INVALID_VALUE;
  cl_context c = q->context;
  // Sent (or copied into the send queue) before this returns, so the caller's memory is
  // free at once; a held command keeps a copy.
  std::shared_ptr<std::vector<std::byte>> copy;
  if (wouldHold(q, nWait, wait)) copy = std::make_shared<std::vector<std::byte>>(static_cast<const std::byte*>(in), static_cast<const std::byte*>(in) + n);
  return enqueue(q, nWait, wait, event, CL_COMMAND_WRITE_BUFFER, blocking, [=] {
    const std::byte* from = copy ? copy->data() : static_cast<const std::byte*>(in);
    if (n) c->session->write(m->handle, m->origin + offset, std::span(from, n));
    return CL_SUCCESS;
  });
}

cl_int CL_API_CALL enqueueCopyBuffer(cl_command_queue q, cl_mem src, cl_mem dst, size_t srcOffset, size_t dstOffset,
                                     size_t n, cl_uint nWait, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, src); rc != CL_SUCCESS) return rc;
  if (cl_int rc = checkQueueMem(q, dst); rc != CL_SUCCESS) return rc;
  if (!inRange(src, srcOffset, n) || !inRange(dst, dstOffset, n)) return CL_INVALID_VALUE;
  if (src->handle == dst->handle) {
    size_t a = src->origin + srcOffset, b = dst->origin + dstOffset;
    if (std::max(a, b) < std::min(a, b) + n) return CL_MEM_COPY_OVERLAP;
  }
  cl_context c = q->context;
  return enqueue(q, nWait, wait, event, CL_COMMAND_COPY_BUFFER, false, [=] {
    if (n) c->session->copy(dst->handle, dst->origin + dstOffset, src->handle, src->origin + srcOffset, n);
    return CL_SUCCESS;
  });
}

cl_int CL_API_CALL enqueueFillBuffer(cl_command_queue q, cl_mem m, const void* pattern, size_t patternSize, size_t offset,
                                     size_t n, cl_uint nWait, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, m); rc != CL_SUCCESS) return rc;
  if (!pattern || patternSize == 0 || patternSize > 128 || (patternSize & (patternSize - 1)) || offset % patternSize ||
      n % patternSize || !inRange(m, offset, n))
    return CL_INVALID_VALUE;
  cl_context c = q->context;
  std::vector<std::byte> bytes(static_cast<const std::byte*>(pattern), static_cast<const std::byte*>(pattern) + patternSize);
  return enqueue(q, nWait, wait, event, CL_COMMAND_FILL_BUFFER, false, [=] {
    fillRange(c, m, offset, n, bytes);
    return CL_SUCCESS;
  });
}

void fillRange(cl_context c, cl_mem m, size_t offset, size_t n, const std::vector<std::byte>& bytes) {
  if (n == 0) return;
  size_t at = m->origin + offset;
  bool uniform = std::all_of(bytes.begin(), bytes.end(), [&](std::byte b) { return b == bytes[0]; });
  if (uniform) {
    c->session->fill(m->handle, at, n, static_cast<uint8_t>(bytes[0]));
    return;
  }
  // The pattern once, then doubling copies of what is filled so far (on the card).
  c->session->write(m->handle, at, std::span(bytes.data(), std::min(bytes.size(), n)));
  for (size_t done = bytes.size(); done < n;) {
    size_t k = std::min(done, n - done);
    c->session->copy(m->handle, at + done, m->handle, at, k);
    done += k;
  }
}

cl_int CL_API_CALL enqueueReadBufferRect(cl_command_queue q, cl_mem m, cl_bool blocking, const size_t* bufferOrigin,
                                         const size_t* hostOrigin, const size_t* region, size_t bufferRow,
                                         size_t bufferSlice, size_t hostRow, size_t hostSlice, void* out, cl_uint nWait,
                                         const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, m); rc != CL_SUCCESS) return rc;
  Rect b, h;
  if (!out || makeRect(bufferOrigin, region, bufferRow, bufferSlice, b) || makeRect(hostOrigin, region, hostRow, hostSlice, h))
    return CL_INVALID_VALUE;
  return enqueueReadRect(q, m, blocking, b, h, out, nWait, wait, event, CL_COMMAND_READ_BUFFER_RECT);
}

cl_int enqueueReadRect(cl_command_queue q, cl_mem m, cl_bool blocking, const Rect& b, const Rect& h, void* out,
                       cl_uint nWait, const cl_event* wait, cl_event* event, cl_command_type type) {
  if (b.end() > m->size) return CL_INVALID_VALUE;
  cl_context c = q->context;
  return enqueue(q, nWait, wait, event, type, blocking, [=] {
    // One read of the span the rectangle covers, then its rows put in place.
    size_t first = b.offsetOf(0, 0), span = b.end() - first;
    std::vector<std::byte> tmp(span);
    if (cl_int rc = readInto(c, m, first, span, tmp.data()); rc != CL_SUCCESS) return rc;
    for (size_t z = 0; z < b.region[2]; ++z)
      for (size_t y = 0; y < b.region[1]; ++y)
        std::memcpy(static_cast<char*>(out) + h.offsetOf(y, z), tmp.data() + b.offsetOf(y, z) - first, b.region[0]);
    return CL_SUCCESS;
  });
}

cl_int CL_API_CALL enqueueWriteBufferRect(cl_command_queue q, cl_mem m, cl_bool blocking, const size_t* bufferOrigin,
                                          const size_t* hostOrigin, const size_t* region, size_t bufferRow,
                                          size_t bufferSlice, size_t hostRow, size_t hostSlice, const void* in,
                                          cl_uint nWait, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, m); rc != CL_SUCCESS) return rc;
  Rect b, h;
  if (!in || makeRect(bufferOrigin, region, bufferRow, bufferSlice, b) || makeRect(hostOrigin, region, hostRow, hostSlice, h))
    return CL_INVALID_VALUE;
  return enqueueWriteRect(q, m, blocking, b, h, in, nWait, wait, event, CL_COMMAND_WRITE_BUFFER_RECT);
}

cl_int enqueueWriteRect(cl_command_queue q, cl_mem m, cl_bool blocking, const Rect& b, const Rect& h, const void* in,
                        cl_uint nWait, const cl_event* wait, cl_event* event, cl_command_type type) {
  if (b.end() > m->size) return CL_INVALID_VALUE;
  cl_context c = q->context;
  // The rows, gathered now (the caller's memory is free once this returns).
  auto rows = std::make_shared<std::vector<std::byte>>(b.region[0] * b.region[1] * b.region[2]);
  size_t at = 0;
  for (size_t z = 0; z < b.region[2]; ++z)
    for (size_t y = 0; y < b.region[1]; ++y, at += b.region[0])
      std::memcpy(rows->data() + at, static_cast<const char*>(in) + h.offsetOf(y, z), b.region[0]);
  return enqueue(q, nWait, wait, event, type, blocking, [=] {
    // Rows that follow each other in the buffer go as one write.
    const bool packed = b.rowPitch == b.region[0] && (b.region[2] == 1 || b.slicePitch == b.region[0] * b.region[1]);
    if (packed) {
      c->session->write(m->handle, m->origin + b.offsetOf(0, 0), std::span(rows->data(), rows->size()));
      return CL_SUCCESS;
    }
    size_t at = 0;
    for (size_t z = 0; z < b.region[2]; ++z)
      for (size_t y = 0; y < b.region[1]; ++y, at += b.region[0])
        c->session->write(m->handle, m->origin + b.offsetOf(y, z), std::span(rows->data() + at, b.region[0]));
    return CL_SUCCESS;
  });
}

cl_int CL_API_CALL enqueueCopyBufferRect(cl_command_queue q, cl_mem src, cl_mem dst, const size_t* srcOrigin,
                                         const size_t* dstOrigin, const size_t* region, size_t srcRow, size_t srcSlice,
                                         size_t dstRow, size_t dstSlice, cl_uint nWait, const cl_event* wait,
                                         cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, src); rc != CL_SUCCESS) return rc;
  if (cl_int rc = checkQueueMem(q, dst); rc != CL_SUCCESS) return rc;
  Rect s, d;
  if (makeRect(srcOrigin, region, srcRow, srcSlice, s) || makeRect(dstOrigin, region, dstRow, dstSlice, d))
    return CL_INVALID_VALUE;
  return enqueueCopyRect(q, src, dst, s, d, nWait, wait, event, CL_COMMAND_COPY_BUFFER_RECT);
}

cl_int enqueueCopyRect(cl_command_queue q, cl_mem src, cl_mem dst, const Rect& s, const Rect& d, cl_uint nWait,
                       const cl_event* wait, cl_event* event, cl_command_type type) {
  if (s.end() > src->size || d.end() > dst->size) return CL_INVALID_VALUE;
  if (src->handle == dst->handle) {
    size_t a = src->origin + s.offsetOf(0, 0), b = dst->origin + d.offsetOf(0, 0);
    if (a < dst->origin + d.end() && b < src->origin + s.end()) return CL_MEM_COPY_OVERLAP;
  }
  cl_context c = q->context;
  return enqueue(q, nWait, wait, event, type, false, [=] {
    const bool packed = s.rowPitch == s.region[0] && d.rowPitch == d.region[0] &&
                        (s.region[2] == 1 || (s.slicePitch == s.region[0] * s.region[1] && d.slicePitch == d.region[0] * d.region[1]));
    if (packed) {
      c->session->copy(dst->handle, dst->origin + d.offsetOf(0, 0), src->handle, src->origin + s.offsetOf(0, 0),
                       s.region[0] * s.region[1] * s.region[2]);
      return CL_SUCCESS;
    }
    for (size_t z = 0; z < s.region[2]; ++z)
      for (size_t y = 0; y < s.region[1]; ++y)
        c->session->copy(dst->handle, dst->origin + d.offsetOf(y, z), src->handle, src->origin + s.offsetOf(y, z), s.region[0]);
    return CL_SUCCESS;
  });
}

void* CL_API_CALL enqueueMapBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, cl_map_flags flags, size_t offset,
                                   size_t n, cl_uint nWait, const cl_event* wait, cl_event* event, cl_int* err) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, m); rc != CL_SUCCESS) return failWith<void>(err, rc);
  return enqueueMapRange(q, m, blocking, flags, offset, n, nWait, wait, event, CL_COMMAND_MAP_BUFFER, err);
}

void* enqueueMapRange(cl_command_queue q, cl_mem m, cl_bool blocking, cl_map_flags flags, size_t offset, size_t n,
                      cl_uint nWait, const cl_event* wait, cl_event* event, cl_command_type type, cl_int* err) {
  if (!inRange(m, offset, n) || n == 0 ||
      (flags & ~cl_map_flags(CL_MAP_READ | CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION)) ||
      ((flags & CL_MAP_WRITE_INVALIDATE_REGION) && (flags & (CL_MAP_READ | CL_MAP_WRITE))))
    return failWith<void>(err, CL_INVALID_VALUE);
  bool owned = m->hostPtr == nullptr;
  void* ptr = owned ? std::aligned_alloc(kBaseAlignBytes, (n + kBaseAlignBytes - 1) / kBaseAlignBytes * kBaseAlignBytes)
                    : static_cast<char*>(m->hostPtr) + offset;
  if (!ptr) return failWith<void>(err, CL_OUT_OF_HOST_MEMORY);
  bool writes = flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION);
  if (auto it = m->maps.find(ptr); it != m->maps.end()) {
    // The same region of a USE_HOST_PTR buffer mapped again: one pointer, counted.
    it->second.count++;
    it->second.write = it->second.write || writes;
    it->second.size = std::max(it->second.size, n);
  } else {
    m->maps[ptr] = _cl_mem::Mapping{offset, n, writes, owned, 1};
  }
  ++m->mapCount;
  cl_context c = q->context;
  bool read = !(flags & CL_MAP_WRITE_INVALIDATE_REGION);
  cl_int rc = enqueue(q, nWait, wait, event, type, blocking,
                      [=] { return read ? readInto(c, m, offset, n, ptr) : CL_SUCCESS; });
  if (err) *err = rc;
  if (rc != CL_SUCCESS && rc != CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) {
    if (--m->maps[ptr].count == 0) m->maps.erase(ptr);
    --m->mapCount;
    if (owned) std::free(ptr);
    return nullptr;
  }
  return ptr;
}

// What a command that may be held (behind a user event) keeps until it is destroyed,
// run or not: references on the buffers and program it uses, copies of by-value bytes,
// host memory to free. Destroyed with the API lock held (see enqueue()).
struct Kept {
  std::vector<cl_mem> mems;
  cl_program program = nullptr;
  std::vector<std::vector<std::byte>> bytes;
  void* hostMemory = nullptr;
  Kept() = default;
  Kept(const Kept&) = delete;
  ~Kept() {
    for (cl_mem m : mems) releaseMem(m);
    if (program) releaseProgramObject(program);
    std::free(hostMemory);
  }
};

cl_int CL_API_CALL enqueueUnmapMemObject(cl_command_queue q, cl_mem m, void* ptr, cl_uint nWait, const cl_event* wait,
                                         cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, m, true); rc != CL_SUCCESS) return rc;
  auto it = m->maps.find(ptr);
  if (it == m->maps.end()) return CL_INVALID_VALUE;
  _cl_mem::Mapping map = it->second;
  --m->mapCount;
  if (--it->second.count == 0) m->maps.erase(it);
  else map.owned = false;  // mapped again: the memory stays
  cl_context c = q->context;
  auto kept = std::make_shared<Kept>();
  m->refs++;
  kept->mems.push_back(m);
  if (map.owned) kept->hostMemory = ptr;
  return enqueue(q, nWait, wait, event, CL_COMMAND_UNMAP_MEM_OBJECT, false, [=, kept = std::move(kept)] {
    if (map.write && !c->lost) c->session->write(m->handle, m->origin + map.offset, std::span(static_cast<std::byte*>(ptr), map.size));
    return CL_SUCCESS;
  });
}

cl_int CL_API_CALL enqueueMigrateMemObjects(cl_command_queue q, cl_uint n, const cl_mem* mems, cl_mem_migration_flags,
                                            cl_uint nWait, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  if (n == 0 || !mems) return CL_INVALID_VALUE;
  for (cl_uint i = 0; i < n; ++i)
    if (cl_int rc = checkQueueMem(q, mems[i], true); rc != CL_SUCCESS) return rc;
  // Buffers live where the scheduler keeps them (the vaccel's primary card).
  return enqueue(q, nWait, wait, event, CL_COMMAND_MIGRATE_MEM_OBJECTS, false, [] { return CL_SUCCESS; });
}

namespace {

// ---------------------------------------------------------------------------------
// Programs

cl_program newProgram(cl_context c) {
  auto* p = make<_cl_program>();
  p->context = c;
  c->refs++;
  return p;
}

cl_program CL_API_CALL createProgramWithSource(cl_context c, cl_uint count, const char** strings, const size_t* lengths,
                                               cl_int* err) {
  Lock lock(apiLock());
  if (!valid(c)) return failWith<_cl_program>(err, CL_INVALID_CONTEXT);
  if (count == 0 || !strings) return failWith<_cl_program>(err, CL_INVALID_VALUE);
  std::string source;
  for (cl_uint i = 0; i < count; ++i) {
    if (!strings[i]) return failWith<_cl_program>(err, CL_INVALID_VALUE);
    if (lengths && lengths[i]) source.append(strings[i], lengths[i]);
    else source.append(strings[i]);
  }
  cl_program p = newProgram(c);
  p->source = std::move(source);
  if (err) *err = CL_SUCCESS;
  return p;
}

cl_program CL_API_CALL createProgramWithBinary(cl_context c, cl_uint n, const cl_device_id* devices, const size_t* lengths,
                                               const unsigned char** binaries, cl_int* status, cl_int* err) {
  Lock lock(apiLock());
  if (!valid(c)) return failWith<_cl_program>(err, CL_INVALID_CONTEXT);
  if (!ourDevices(n, devices)) return failWith<_cl_program>(err, n && devices ? CL_INVALID_DEVICE : CL_INVALID_VALUE);
  if (!lengths || !binaries || !binaries[0] || lengths[0] == 0) return failWith<_cl_program>(err, CL_INVALID_VALUE);
  // A binary of this ICD is its source behind a magic line (what CL_PROGRAM_BINARIES gave).
  std::string bytes(reinterpret_cast<const char*>(binaries[0]), lengths[0]);
  if (bytes.rfind(kUnitsMagic, 0) == 0 && bytes.size() > std::strlen(kUnitsMagic)) {
    char type = bytes[std::strlen(kUnitsMagic)];
    auto units = decodeUnits(std::as_bytes(std::span(bytes)).subspan(std::strlen(kUnitsMagic) + 1));
    if (units && (type == 'O' || type == 'L' || type == 'E')) {
      if (status)
        for (cl_uint i = 0; i < n; ++i) status[i] = CL_SUCCESS;
      cl_program p = newProgram(c);
      p->units = std::move(*units);
      p->binaryType = type == 'O' ? CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT
                      : type == 'L' ? CL_PROGRAM_BINARY_TYPE_LIBRARY
                                    : CL_PROGRAM_BINARY_TYPE_EXECUTABLE;
      if (type != 'E') p->status = CL_BUILD_SUCCESS;  // an executable is built (linked) by clBuildProgram
      if (err) *err = CL_SUCCESS;
      return p;
    }
  }
  if (bytes.rfind(kBinaryMagic, 0) != 0) {
    if (status) status[0] = CL_INVALID_BINARY;
    return failWith<_cl_program>(err, CL_INVALID_BINARY);
  }
  if (status)
    for (cl_uint i = 0; i < n; ++i) status[i] = CL_SUCCESS;
  cl_program p = newProgram(c);
  p->source = bytes.substr(std::strlen(kBinaryMagic));
  if (err) *err = CL_SUCCESS;
  return p;
}

cl_int CL_API_CALL retainProgram(cl_program p) { return retainObject(p, CL_INVALID_PROGRAM); }

}  // namespace

void releaseProgramObject(cl_program p) {
  if (--p->refs > 0) return;
  cl_context c = p->context;
  if (p->handle && !c->lost) c->session->free(p->handle);
  bury(p);
  opencl::releaseContext(c);
}

namespace {

cl_int CL_API_CALL releaseProgram(cl_program p) {
  Lock lock(apiLock());
  if (!valid(p)) return CL_INVALID_PROGRAM;
  releaseProgramObject(p);
  return CL_SUCCESS;
}

// Loads `code` on the card and describes it: the program's handle, kernels and log, or
// (false) its failure with the compiler's log in p->log and the why in *why.
bool loadOnCard(cl_program p, ProgramKind kind, std::span<const std::byte> code, const std::string& options, Error* why) {
  cl_context c = p->context;
  if (p->handle) c->session->free(p->handle);
  p->status = CL_BUILD_IN_PROGRESS;
  p->handle = c->session->loadProgram(kind, "opencl", code, options);
  c->buildSeq = c->session->lastSequence();
  c->buildError.reset();
  auto info = c->session->describeProgram(p->handle);
  c->buildSeq = 0;
  if (!info && c->buildError) info = std::unexpected(*c->buildError);  // the load's own failure, with the log
  if (info) {
    p->status = CL_BUILD_SUCCESS;
    p->info = std::move(*info);
    p->log = p->info.buildLog;
    return true;
  }
  // The load's failure, as the card's compiler put it (with its log).
  *why = info.error();
  const std::string logMark = "Build log:\n";
  auto at = why->message.find(logMark);
  p->log = at == std::string::npos ? why->message : why->message.substr(at + logMark.size());
  p->status = CL_BUILD_ERROR;
  p->info = {};
  c->session->free(p->handle);
  p->handle = 0;
  if (why->code == Code::unavailable) loseSession(c, why->message);
  return false;
}

// A failed load's standard code: `failure` for the compiler's (or linker's) refusal of
// the program, `badOptions` for its refusal of the options.
cl_int loadFailure(const Error& why, cl_int failure, cl_int badOptions) {
  // The card's driver says so with its own code; raccel's bound on the options' length
  // ("build options of N bytes") is the same refusal.
  if (why.openclError == CL_INVALID_BUILD_OPTIONS || why.openclError == CL_INVALID_COMPILER_OPTIONS ||
      why.openclError == CL_INVALID_LINKER_OPTIONS ||
      (why.code == Code::invalidArgument && why.message.find(" options of ") != std::string::npos))
    return badOptions;
  if (why.code == Code::invalidArgument) return failure;
  if (why.code == Code::unimplemented) return failure == CL_LINK_PROGRAM_FAILURE ? CL_LINKER_NOT_AVAILABLE : CL_COMPILER_NOT_AVAILABLE;
  return CL_OUT_OF_RESOURCES;
}

// The card cannot see the guest's files: a program's `#include`s that the guest's -I
// folders hold are read here and sent as named headers (followed into the headers they
// include), and the -I options stay here. At most 256 headers of 4 MiB in all.
struct GuestIncludes {
  std::string options;  // without -I
  std::vector<std::pair<std::string, std::string>> headers;
};

GuestIncludes guestIncludes(const std::string& source, const std::string& options) {
  GuestIncludes out;
  std::vector<std::string> folders;
  std::istringstream words(options);
  for (std::string w; words >> w;) {
    if (w == "-I") {
      if (words >> w) folders.push_back(w);
    } else if (w.rfind("-I", 0) == 0) {
      folders.push_back(w.substr(2));
    } else {
      out.options += (out.options.empty() ? "" : " ") + w;
    }
  }
  if (folders.empty()) return {options, {}};
  std::set<std::string> seen;
  size_t bytes = 0;
  // Texts to scan, each with the folder (relative to an -I folder) its quoted includes
  // are looked for first, as the preprocessor does.
  std::vector<std::pair<std::string, std::string>> pending{{source, ""}};
  while (!pending.empty()) {
    auto [text, base] = std::move(pending.back());
    pending.pop_back();
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      auto hash = line.find_first_not_of(" \t");
      if (hash == std::string::npos || line[hash] != '#') continue;
      auto word = line.find("include", hash + 1);
      if (word == std::string::npos || line.find_first_not_of(" \t", hash + 1) != word) continue;
      auto open = line.find_first_of("\"<", word + 7);
      if (open == std::string::npos) continue;
      auto close = line.find(line[open] == '"' ? '"' : '>', open + 1);
      if (close == std::string::npos || close == open + 1) continue;
      std::string include = line.substr(open + 1, close - open - 1);
      std::vector<std::string> names;
      if (line[open] == '"' && !base.empty()) names.push_back(base + "/" + include);
      names.push_back(include);
      for (auto& name : names) {
        if (seen.count(name)) break;
        bool found = false;
        for (auto& folder : folders) {
          std::ifstream file(folder + "/" + name, std::ios::binary);
          if (!file) continue;
          std::string body((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
          if (bytes + body.size() > (4u << 20) || out.headers.size() >= 256) break;
          bytes += body.size();
          seen.insert(name);
          auto slash = name.rfind('/');
          pending.emplace_back(body, slash == std::string::npos ? "" : name.substr(0, slash));
          out.headers.emplace_back(name, std::move(body));
          found = true;
          break;
        }
        if (found) break;
      }
    }
  }
  return out;
}

// The program's source as the card compiles it. The card's compiler may define
// __IMAGE_SUPPORT__; where this device offers no images (a card lacks them), the macro
// goes (#line keeps the build log's line numbers the program's own).
std::string cardSource(cl_program p) {
  return imagesSupported() ? p->source : "#undef __IMAGE_SUPPORT__\n#line 1\n" + p->source;
}

bool validHeaders(cl_uint n, const cl_program* headers, const char** names) {
  if ((n == 0) != (headers == nullptr) || (n == 0) != (names == nullptr)) return false;
  for (cl_uint i = 0; i < n; ++i)
    if (!valid(headers[i]) || !names[i] || !*names[i]) return false;
  return true;
}

cl_int CL_API_CALL buildProgram(cl_program p, cl_uint n, const cl_device_id* devices, const char* options,
                                void(CL_CALLBACK* notify)(cl_program, void*), void* data) {
  Lock lock(apiLock());
  if (!valid(p)) return CL_INVALID_PROGRAM;
  if ((n == 0) != (devices == nullptr) || (!notify && data)) return CL_INVALID_VALUE;
  if (n && !ourDevices(n, devices)) return CL_INVALID_DEVICE;
  if (p->kernelsAttached) return CL_INVALID_OPERATION;
  if (p->binaryType == CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT || p->binaryType == CL_PROGRAM_BINARY_TYPE_LIBRARY)
    return CL_INVALID_BINARY;
  cl_context c = p->context;
  if (c->lost) return CL_OUT_OF_RESOURCES;
  p->options = options ? options : "";
  Error why;
  bool built;
  if (!p->units.units.empty()) {  // an executable's binary from clLinkProgram: linked again
    auto bytes = encodeUnits(p->units);
    built = loadOnCard(p, ProgramKind::openclUnits, bytes, p->options, &why);
  } else {
    const std::string source = cardSource(p);
    GuestIncludes includes = guestIncludes(p->source, p->options);
    if (includes.headers.empty()) {
      built = loadOnCard(p, ProgramKind::openclC, std::as_bytes(std::span(source)), includes.options, &why);
    } else {  // one unit, compiled with the guest's headers and linked on the card
      ProgramUnits units{.compileOnly = false, .units = {{source, includes.options, std::move(includes.headers)}}};
      auto bytes = encodeUnits(units);
      built = loadOnCard(p, ProgramKind::openclUnits, bytes, "", &why);
    }
  }
  cl_int rc = CL_SUCCESS;
  if (built) {
    p->binaryType = CL_PROGRAM_BINARY_TYPE_EXECUTABLE;
  } else {
    rc = loadFailure(why, CL_BUILD_PROGRAM_FAILURE, CL_INVALID_BUILD_OPTIONS);
    logLine("clBuildProgram: " + why.message);
  }
  if (notify) notify(p, data);
  return rc;
}

cl_int CL_API_CALL compileProgram(cl_program p, cl_uint n, const cl_device_id* devices, const char* options, cl_uint nHeaders,
                                  const cl_program* headers, const char** names, void(CL_CALLBACK* notify)(cl_program, void*),
                                  void* data) {
  Lock lock(apiLock());
  if (!valid(p)) return CL_INVALID_PROGRAM;
  if ((n == 0) != (devices == nullptr) || (!notify && data) || !validHeaders(nHeaders, headers, names)) return CL_INVALID_VALUE;
  if (n && !ourDevices(n, devices)) return CL_INVALID_DEVICE;
  if (p->kernelsAttached || p->source.empty()) return CL_INVALID_OPERATION;
  cl_context c = p->context;
  if (c->lost) return CL_OUT_OF_RESOURCES;
  ProgramUnit unit;
  unit.source = cardSource(p);
  GuestIncludes includes = guestIncludes(p->source, options ? options : "");
  unit.options = includes.options;
  for (cl_uint i = 0; i < nHeaders; ++i) unit.headers.emplace_back(names[i], headers[i]->source);
  for (auto& h : includes.headers)  // the headers the program names come first
    if (std::none_of(unit.headers.begin(), unit.headers.end(), [&](auto& given) { return given.first == h.first; }))
      unit.headers.push_back(std::move(h));
  ProgramUnits units{.compileOnly = true, .units = {unit}};
  p->options = options ? options : "";
  Error why;
  // Compiled on the card for its errors and log; the object itself is compiled again
  // when linked (the card keeps nothing meanwhile).
  auto bytes = encodeUnits(units);
  bool compiled = loadOnCard(p, ProgramKind::openclUnits, bytes, "", &why);
  cl_int rc = CL_SUCCESS;
  if (compiled) {
    if (p->handle) c->session->free(p->handle);
    p->handle = 0;
    p->info = {};
    p->binaryType = CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT;
    units.compileOnly = false;
    p->units = std::move(units);
  } else {
    p->binaryType = CL_PROGRAM_BINARY_TYPE_NONE;
    rc = loadFailure(why, CL_COMPILE_PROGRAM_FAILURE, CL_INVALID_COMPILER_OPTIONS);
    logLine("clCompileProgram: " + why.message);
  }
  if (notify) notify(p, data);
  return rc;
}

cl_program CL_API_CALL linkProgram(cl_context c, cl_uint n, const cl_device_id* devices, const char* options, cl_uint nInputs,
                                   const cl_program* inputs, void(CL_CALLBACK* notify)(cl_program, void*), void* data,
                                   cl_int* err) {
  Lock lock(apiLock());
  if (!valid(c)) return failWith<_cl_program>(err, CL_INVALID_CONTEXT);
  if ((n == 0) != (devices == nullptr) || (!notify && data) || nInputs == 0 || !inputs)
    return failWith<_cl_program>(err, CL_INVALID_VALUE);
  if (n && !ourDevices(n, devices)) return failWith<_cl_program>(err, CL_INVALID_DEVICE);
  ProgramUnits units;
  for (cl_uint i = 0; i < nInputs; ++i) {
    if (!valid(inputs[i]) || inputs[i]->context != c) return failWith<_cl_program>(err, CL_INVALID_PROGRAM);
    if (inputs[i]->binaryType != CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT && inputs[i]->binaryType != CL_PROGRAM_BINARY_TYPE_LIBRARY)
      return failWith<_cl_program>(err, CL_INVALID_OPERATION);
    for (auto& u : inputs[i]->units.units) units.units.push_back(u);
  }
  if (units.units.size() > kMaxProgramUnits) return failWith<_cl_program>(err, CL_INVALID_VALUE);
  if (c->lost) return failWith<_cl_program>(err, CL_OUT_OF_RESOURCES);
  std::string linkOptions = options ? options : "";
  cl_program p = newProgram(c);
  p->options = linkOptions;
  p->units = std::move(units);
  cl_int rc = CL_SUCCESS;
  if ((" " + linkOptions + " ").find(" -create-library ") != std::string::npos) {
    p->binaryType = CL_PROGRAM_BINARY_TYPE_LIBRARY;  // linked when an executable is
    p->status = CL_BUILD_SUCCESS;
  } else {
    Error why;
    auto bytes = encodeUnits(p->units);
    if (loadOnCard(p, ProgramKind::openclUnits, bytes, linkOptions, &why)) {
      p->binaryType = CL_PROGRAM_BINARY_TYPE_EXECUTABLE;
    } else {
      rc = loadFailure(why, CL_LINK_PROGRAM_FAILURE, CL_INVALID_LINKER_OPTIONS);
      logLine("clLinkProgram: " + why.message);
    }
  }
  if (notify) notify(p, data);
  if (err) *err = rc;
  return p;  // a failed link's program too: its log tells why
}

bool executable(cl_program p) { return p->status == CL_BUILD_SUCCESS && p->binaryType == CL_PROGRAM_BINARY_TYPE_EXECUTABLE; }

std::string kernelNames(cl_program p) {
  std::string names;
  for (auto& k : p->info.kernels) names += (names.empty() ? "" : ";") + k.name;
  return names;
}

cl_int CL_API_CALL getProgramInfo(cl_program p, cl_program_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(p)) return CL_INVALID_PROGRAM;
  std::string binary = binaryOf(p);
  switch (what) {
    case CL_PROGRAM_REFERENCE_COUNT: return setValue(cl_uint(p->refs), size, out, ret);
    case CL_PROGRAM_CONTEXT: return setValue(p->context, size, out, ret);
    case CL_PROGRAM_NUM_DEVICES: return setValue(cl_uint(1), size, out, ret);
    case CL_PROGRAM_DEVICES: return setValue(theDevice(), size, out, ret);
    case CL_PROGRAM_SOURCE: return setString(p->source, size, out, ret);
    case CL_PROGRAM_BINARY_SIZES: return setValue(size_t(p->status == CL_BUILD_SUCCESS ? binary.size() : 0), size, out, ret);
    case CL_PROGRAM_BINARIES: {
      if (ret) *ret = sizeof(unsigned char*);
      if (!out) return CL_SUCCESS;
      if (size < sizeof(unsigned char*)) return CL_INVALID_VALUE;
      auto** into = static_cast<unsigned char**>(out);
      if (into[0] && p->status == CL_BUILD_SUCCESS) std::memcpy(into[0], binary.data(), binary.size());
      return CL_SUCCESS;
    }
    case CL_PROGRAM_NUM_KERNELS:
      if (!executable(p)) return CL_INVALID_PROGRAM_EXECUTABLE;
      return setValue(size_t(p->info.kernels.size()), size, out, ret);
    case CL_PROGRAM_KERNEL_NAMES:
      if (!executable(p)) return CL_INVALID_PROGRAM_EXECUTABLE;
      return setString(kernelNames(p), size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL getProgramBuildInfo(cl_program p, cl_device_id d, cl_program_build_info what, size_t size, void* out,
                                       size_t* ret) {
  Lock lock(apiLock());
  if (!valid(p)) return CL_INVALID_PROGRAM;
  if (d != theDevice()) return CL_INVALID_DEVICE;
  switch (what) {
    case CL_PROGRAM_BUILD_STATUS: return setValue(p->status, size, out, ret);
    case CL_PROGRAM_BUILD_OPTIONS: return setString(p->options, size, out, ret);
    case CL_PROGRAM_BUILD_LOG: return setString(p->log, size, out, ret);
    case CL_PROGRAM_BINARY_TYPE:
      return setValue(p->status == CL_BUILD_SUCCESS ? p->binaryType : cl_program_binary_type(CL_PROGRAM_BINARY_TYPE_NONE), size,
                      out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL unloadCompiler() { return CL_SUCCESS; }
cl_int CL_API_CALL unloadPlatformCompiler(cl_platform_id p) { return p == thePlatform() ? CL_SUCCESS : CL_INVALID_PLATFORM; }

// ---------------------------------------------------------------------------------
// Kernels

cl_kernel makeKernel(cl_program p, const client::KernelInfo& info) {
  auto* k = make<_cl_kernel>();
  k->program = p;
  k->info = &info;
  k->args.resize(info.args.size());
  p->refs++;
  p->kernelsAttached++;
  return k;
}

cl_kernel CL_API_CALL createKernel(cl_program p, const char* name, cl_int* err) {
  Lock lock(apiLock());
  if (!valid(p)) return failWith<_cl_kernel>(err, CL_INVALID_PROGRAM);
  if (!name) return failWith<_cl_kernel>(err, CL_INVALID_VALUE);
  if (!executable(p)) return failWith<_cl_kernel>(err, CL_INVALID_PROGRAM_EXECUTABLE);
  for (auto& k : p->info.kernels)
    if (k.name == name) {
      if (err) *err = CL_SUCCESS;
      return makeKernel(p, k);
    }
  return failWith<_cl_kernel>(err, CL_INVALID_KERNEL_NAME);
}

cl_int CL_API_CALL createKernelsInProgram(cl_program p, cl_uint n, cl_kernel* out, cl_uint* count) {
  Lock lock(apiLock());
  if (!valid(p)) return CL_INVALID_PROGRAM;
  if (!executable(p)) return CL_INVALID_PROGRAM_EXECUTABLE;
  if (out && n < p->info.kernels.size()) return CL_INVALID_VALUE;
  if (out)
    for (size_t i = 0; i < p->info.kernels.size(); ++i) out[i] = makeKernel(p, p->info.kernels[i]);
  if (count) *count = static_cast<cl_uint>(p->info.kernels.size());
  return CL_SUCCESS;
}

cl_int CL_API_CALL retainKernel(cl_kernel k) { return retainObject(k, CL_INVALID_KERNEL); }

void dropArg(_cl_kernel::ArgValue& a) { a = {}; }

cl_int CL_API_CALL releaseKernel(cl_kernel k) {
  Lock lock(apiLock());
  if (!valid(k)) return CL_INVALID_KERNEL;
  if (--k->refs > 0) return CL_SUCCESS;
  for (auto& a : k->args) dropArg(a);
  cl_program p = k->program;
  p->kernelsAttached--;
  bury(k);
  releaseProgramObject(p);
  return CL_SUCCESS;
}

cl_int CL_API_CALL setKernelArg(cl_kernel k, cl_uint index, size_t size, const void* value) {
  Lock lock(apiLock());
  if (!valid(k)) return CL_INVALID_KERNEL;
  if (index >= k->info->args.size()) return CL_INVALID_ARG_INDEX;
  const client::KernelArgInfo& info = k->info->args[index];
  _cl_kernel::ArgValue a;
  using Space = client::KernelArgInfo::Space;
  switch (info.space) {
    case Space::local:
      if (value) return CL_INVALID_ARG_VALUE;
      if (size == 0 || size > UINT32_MAX) return CL_INVALID_ARG_SIZE;
      a.arg = client::Arg::local(static_cast<uint32_t>(size));
      break;
    case Space::global:
    case Space::constant: {
      if (isImageTypeName(info.typeName)) {
        if (cl_int rc = imageArg(k->program->context, size, value, a); rc != CL_SUCCESS) return rc;
        break;
      }
      if (size != sizeof(cl_mem)) return CL_INVALID_ARG_SIZE;
      cl_mem m = value ? *static_cast<const cl_mem*>(value) : nullptr;
      if (m) {
        if (!valid(m) || m->image) return CL_INVALID_MEM_OBJECT;
        if (m->context != k->program->context) return CL_INVALID_MEM_OBJECT;
        a.mem = m;
        a.memSerial = m->serial;
        a.arg = client::Arg::subBuffer(m->handle, m->origin);
      } else {
        a.arg = client::Arg{client::Arg::Type::u64, 0};  // a null pointer
      }
      break;
    }
    case Space::privateValue:
      if (info.typeName == "sampler_t") {
        if (cl_int rc = samplerArg(k->program->context, size, value, a); rc != CL_SUCCESS) return rc;
        break;
      }
      if (!value) return CL_INVALID_ARG_VALUE;
      if (size == 0 || size > kMaxParameterBytes || (info.size && size != info.size)) return CL_INVALID_ARG_SIZE;
      a.bytes.assign(static_cast<const std::byte*>(value), static_cast<const std::byte*>(value) + size);
      a.arg = client::Arg{client::Arg::Type::bytes, 0};
      break;
  }
  a.set = true;
  dropArg(k->args[index]);
  k->args[index] = std::move(a);
  return CL_SUCCESS;
}

cl_int CL_API_CALL getKernelInfo(cl_kernel k, cl_kernel_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(k)) return CL_INVALID_KERNEL;
  switch (what) {
    case CL_KERNEL_FUNCTION_NAME: return setString(k->info->name, size, out, ret);
    case CL_KERNEL_NUM_ARGS: return setValue(cl_uint(k->info->args.size()), size, out, ret);
    case CL_KERNEL_REFERENCE_COUNT: return setValue(cl_uint(k->refs), size, out, ret);
    case CL_KERNEL_CONTEXT: return setValue(k->program->context, size, out, ret);
    case CL_KERNEL_PROGRAM: return setValue(k->program, size, out, ret);
    case CL_KERNEL_ATTRIBUTES: return setString(k->info->attributes, size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL getKernelArgInfo(cl_kernel k, cl_uint index, cl_kernel_arg_info what, size_t size, void* out,
                                    size_t* ret) {
  Lock lock(apiLock());
  if (!valid(k)) return CL_INVALID_KERNEL;
  if (index >= k->info->args.size()) return CL_INVALID_ARG_INDEX;
  const client::KernelArgInfo& a = k->info->args[index];
  using Space = client::KernelArgInfo::Space;
  using Access = client::KernelArgInfo::Access;
  switch (what) {
    case CL_KERNEL_ARG_ADDRESS_QUALIFIER: {
      cl_kernel_arg_address_qualifier q = a.space == Space::global     ? CL_KERNEL_ARG_ADDRESS_GLOBAL
                                          : a.space == Space::constant ? CL_KERNEL_ARG_ADDRESS_CONSTANT
                                          : a.space == Space::local    ? CL_KERNEL_ARG_ADDRESS_LOCAL
                                                                       : CL_KERNEL_ARG_ADDRESS_PRIVATE;
      return setValue(q, size, out, ret);
    }
    case CL_KERNEL_ARG_ACCESS_QUALIFIER: {
      cl_kernel_arg_access_qualifier q = a.access == Access::readOnly    ? CL_KERNEL_ARG_ACCESS_READ_ONLY
                                         : a.access == Access::writeOnly ? CL_KERNEL_ARG_ACCESS_WRITE_ONLY
                                         : a.access == Access::readWrite ? CL_KERNEL_ARG_ACCESS_READ_WRITE
                                                                         : CL_KERNEL_ARG_ACCESS_NONE;
      return setValue(q, size, out, ret);
    }
    case CL_KERNEL_ARG_TYPE_NAME: return setString(a.typeName, size, out, ret);
    case CL_KERNEL_ARG_TYPE_QUALIFIER: return setValue(cl_kernel_arg_type_qualifier(a.typeQualifiers), size, out, ret);
    case CL_KERNEL_ARG_NAME: return setString(a.name, size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL getKernelWorkGroupInfo(cl_kernel k, cl_device_id d, cl_kernel_work_group_info what, size_t size,
                                          void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(k)) return CL_INVALID_KERNEL;
  if (d && d != theDevice()) return CL_INVALID_DEVICE;
  switch (what) {
    case CL_KERNEL_WORK_GROUP_SIZE: return setValue(size_t(k->info->workGroupSize), size, out, ret);
    case CL_KERNEL_COMPILE_WORK_GROUP_SIZE: {
      size_t v[3] = {size_t(k->info->compileWorkGroupSize[0]), size_t(k->info->compileWorkGroupSize[1]),
                     size_t(k->info->compileWorkGroupSize[2])};
      return setInfo(v, sizeof v, size, out, ret);
    }
    case CL_KERNEL_LOCAL_MEM_SIZE: {
      cl_ulong local = k->info->localMemBytes;
      for (auto& a : k->args)
        if (a.set && a.arg.type == client::Arg::Type::local) local += a.arg.bits;
      return setValue(local, size, out, ret);
    }
    case CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE: return setValue(size_t(k->info->preferredMultiple), size, out, ret);
    case CL_KERNEL_PRIVATE_MEM_SIZE: return setValue(cl_ulong(k->info->privateMemBytes), size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL enqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t* offset,
                                        const size_t* global, const size_t* local, cl_uint nWait, const cl_event* wait,
                                        cl_event* event) {
  Lock lock(apiLock());
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  if (!valid(k)) return CL_INVALID_KERNEL;
  if (k->program->context != q->context) return CL_INVALID_CONTEXT;
  if (dims < 1 || dims > 3) return CL_INVALID_WORK_DIMENSION;
  if (!global) return CL_INVALID_GLOBAL_WORK_SIZE;
  uint64_t g[3], l[3], o[3];
  uint64_t groupSize = 1;
  for (cl_uint i = 0; i < dims; ++i) {
    if (global[i] == 0 || global[i] > UINT32_MAX) return CL_INVALID_GLOBAL_WORK_SIZE;
    g[i] = global[i];
    o[i] = offset ? offset[i] : 0;
    if (o[i] > UINT64_MAX - g[i]) return CL_INVALID_GLOBAL_OFFSET;
    if (local) {
      if (local[i] == 0 || global[i] % local[i]) return CL_INVALID_WORK_GROUP_SIZE;
      l[i] = local[i];
      groupSize *= local[i];
    }
  }
  // A kernel declared with reqd_work_group_size runs with exactly that size, given.
  const auto& compiled = k->info->compileWorkGroupSize;
  if (compiled[0] && !local) return CL_INVALID_WORK_GROUP_SIZE;
  if (local) {
    for (cl_uint i = dims; i < 3; ++i)
      if (compiled[0] && compiled[i] != 1) return CL_INVALID_WORK_GROUP_SIZE;
    if (compiled[0] && (l[0] != compiled[0] || (dims > 1 && l[1] != compiled[1]) || (dims > 2 && l[2] != compiled[2])))
      return CL_INVALID_WORK_GROUP_SIZE;
    if (k->info->workGroupSize && groupSize > k->info->workGroupSize) return CL_INVALID_WORK_GROUP_SIZE;
  }
  // A held launch keeps its program, its buffers and copies of its by-value bytes (the
  // kernel's arguments may change before it goes); one sent now borrows them.
  std::shared_ptr<Kept> kept = wouldHold(q, nWait, wait) ? std::make_shared<Kept>() : nullptr;
  if (kept) kept->bytes.reserve(k->args.size());  // the spans below point into it
  std::vector<client::Arg> args;
  args.reserve(k->args.size());
  for (auto& a : k->args) {
    if (!a.set) return CL_INVALID_KERNEL_ARGS;
    if (a.mem && (!valid(a.mem) || a.mem->serial != a.memSerial)) return CL_INVALID_KERNEL_ARGS;  // released since
    client::Arg arg = a.arg;
    if (arg.type == client::Arg::Type::bytes) arg.bytes = kept ? kept->bytes.emplace_back(a.bytes) : a.bytes;
    if (kept && a.mem) {
      a.mem->refs++;
      kept->mems.push_back(a.mem);
    }
    args.push_back(arg);
  }
  cl_context c = q->context;
  std::string name = k->info->name;
  cl_program p = k->program;
  if (kept) {
    p->refs++;
    kept->program = p;
  }
  return enqueue(q, nWait, wait, event, CL_COMMAND_NDRANGE_KERNEL, false, [=, args = std::move(args), kept = std::move(kept)] {
    if (!p->handle || c->lost) return CL_INVALID_PROGRAM_EXECUTABLE;
    c->session->launchRange(p->handle, name, std::span(g, dims), local ? std::span<const uint64_t>(l, dims) : std::span<const uint64_t>(),
                            offset ? std::span<const uint64_t>(o, dims) : std::span<const uint64_t>(), args);
    return CL_SUCCESS;
  });
}

cl_int CL_API_CALL enqueueTask(cl_command_queue q, cl_kernel k, cl_uint nWait, const cl_event* wait, cl_event* event) {
  size_t one = 1;
  return enqueueNDRangeKernel(q, k, 1, nullptr, &one, &one, nWait, wait, event);
}

cl_int CL_API_CALL enqueueNativeKernel(cl_command_queue q, void(CL_CALLBACK*)(void*), void*, size_t, cl_uint, const cl_mem*,
                                       const void**, cl_uint, const cl_event*, cl_event*) {
  Lock lock(apiLock());
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  logLine("clEnqueueNativeKernel: host functions cannot run on a remote card (CL_EXEC_NATIVE_KERNEL is not offered)", true);
  return CL_INVALID_OPERATION;
}

// ---------------------------------------------------------------------------------
// Events

cl_int CL_API_CALL waitForEvents(cl_uint n, const cl_event* list) {
  Lock lock(apiLock());
  if (n == 0 || !list) return CL_INVALID_VALUE;
  for (cl_uint i = 0; i < n; ++i)
    if (!valid(list[i])) return CL_INVALID_EVENT;
  for (cl_uint i = 1; i < n; ++i)
    if (list[i]->context != list[0]->context) return CL_INVALID_CONTEXT;
  std::vector<cl_event> events(list, list + n);
  for (cl_event e : events) retain(e);
  cl_int rc = CL_SUCCESS;
  for (cl_event e : events) {
    cl_int r = waitEvent(e);
    if (r != CL_SUCCESS && rc == CL_SUCCESS) rc = r;
  }
  for (cl_event e : events) release(e);
  return rc;
}

cl_int CL_API_CALL getEventInfo(cl_event e, cl_event_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(e)) return CL_INVALID_EVENT;
  switch (what) {
    case CL_EVENT_COMMAND_QUEUE: return setValue(e->queue, size, out, ret);
    case CL_EVENT_CONTEXT: return setValue(e->context, size, out, ret);
    case CL_EVENT_COMMAND_TYPE: return setValue(e->type, size, out, ret);
    case CL_EVENT_REFERENCE_COUNT: return setValue(cl_uint(e->refs), size, out, ret);
    case CL_EVENT_COMMAND_EXECUTION_STATUS:
      // A command sent and not yet known to be done: one round trip tells.
      if (e->queue && e->status == CL_SUBMITTED) {
        retain(e);
        (void)fence(e->context);
        cl_int status = e->status;
        release(e);
        return setValue(status, size, out, ret);
      }
      return setValue(e->status, size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL retainEvent(cl_event e) { return retainObject(e, CL_INVALID_EVENT); }

cl_int CL_API_CALL releaseEvent(cl_event e) {
  Lock lock(apiLock());
  if (!valid(e)) return CL_INVALID_EVENT;
  release(e);
  return CL_SUCCESS;
}

cl_event CL_API_CALL createUserEvent(cl_context c, cl_int* err) {
  Lock lock(apiLock());
  if (!valid(c)) return failWith<_cl_event>(err, CL_INVALID_CONTEXT);
  cl_event e = newEvent(c, nullptr, CL_COMMAND_USER);
  e->status = CL_SUBMITTED;
  if (err) *err = CL_SUCCESS;
  return e;
}

cl_int CL_API_CALL setUserEventStatus(cl_event e, cl_int status) {
  Lock lock(apiLock());
  if (!valid(e) || e->queue || e->type != CL_COMMAND_USER) return CL_INVALID_EVENT;
  if (status > CL_COMPLETE) return CL_INVALID_VALUE;
  if (e->status <= CL_COMPLETE) return CL_INVALID_OPERATION;
  retain(e);
  complete(e, status);
  drainHeld(e->context);
  release(e);
  return CL_SUCCESS;
}

cl_int CL_API_CALL setEventCallback(cl_event e, cl_int type, void(CL_CALLBACK* fn)(cl_event, cl_int, void*), void* data) {
  Lock lock(apiLock());
  if (!valid(e)) return CL_INVALID_EVENT;
  if (!fn || (type != CL_COMPLETE && type != CL_RUNNING && type != CL_SUBMITTED)) return CL_INVALID_VALUE;
  int which = type == CL_COMPLETE ? 0 : type == CL_RUNNING ? 1 : 2;
  bool reached = e->status <= type;
  if (reached) {
    fn(e, e->status < 0 ? e->status : type, data);
    return CL_SUCCESS;
  }
  e->callbacks[which].emplace_back(fn, data);
  if (e->queue && e->status == CL_SUBMITTED) watchCallbacks(e->context);
  return CL_SUCCESS;
}

cl_int CL_API_CALL getEventProfilingInfo(cl_event e, cl_profiling_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(e)) return CL_INVALID_EVENT;
  if (!e->queue || !(e->queue->properties & CL_QUEUE_PROFILING_ENABLE) || e->status != CL_COMPLETE)
    return CL_PROFILING_INFO_NOT_AVAILABLE;
  switch (what) {
    case CL_PROFILING_COMMAND_QUEUED: return setValue(e->queued, size, out, ret);
    case CL_PROFILING_COMMAND_SUBMIT: return setValue(e->submitted, size, out, ret);
    case CL_PROFILING_COMMAND_START: return setValue(e->started, size, out, ret);
    case CL_PROFILING_COMMAND_END: case CL_PROFILING_COMMAND_COMPLETE: return setValue(e->ended, size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int marker(cl_command_queue q, cl_uint n, const cl_event* wait, cl_event* event, cl_command_type type) {
  if (!valid(q)) return CL_INVALID_COMMAND_QUEUE;
  return enqueue(q, n, wait, event, type, false, [] { return CL_SUCCESS; });
}

cl_int CL_API_CALL enqueueMarkerWithWaitList(cl_command_queue q, cl_uint n, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  return marker(q, n, wait, event, CL_COMMAND_MARKER);
}
cl_int CL_API_CALL enqueueBarrierWithWaitList(cl_command_queue q, cl_uint n, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  return marker(q, n, wait, event, CL_COMMAND_BARRIER);
}
cl_int CL_API_CALL enqueueMarker(cl_command_queue q, cl_event* event) {
  Lock lock(apiLock());
  if (!event) return CL_INVALID_VALUE;
  return marker(q, 0, nullptr, event, CL_COMMAND_MARKER);
}
cl_int CL_API_CALL enqueueBarrier(cl_command_queue q) {
  Lock lock(apiLock());
  return marker(q, 0, nullptr, nullptr, CL_COMMAND_BARRIER);
}
cl_int CL_API_CALL enqueueWaitForEvents(cl_command_queue q, cl_uint n, const cl_event* wait) {
  Lock lock(apiLock());
  if (n == 0 || !wait) return CL_INVALID_VALUE;
  return marker(q, n, wait, nullptr, CL_COMMAND_BARRIER);
}

void* CL_API_CALL getExtensionFunctionAddress(const char* name) { return ::clGetExtensionFunctionAddress(name); }
void* CL_API_CALL getExtensionFunctionAddressForPlatform(cl_platform_id p, const char* name) {
  return ::clGetExtensionFunctionAddressForPlatform(p, name);
}

}  // namespace

// ---------------------------------------------------------------------------------
// The dispatch table: every slot filled. What is not implemented answers with the
// standard error for an unsupported feature (CL_INVALID_OPERATION), says why once on
// stderr, and sets errcode_ret for calls that return an object.

namespace {
template <size_t N>
struct Name {
  constexpr Name(const char (&s)[N]) { std::copy_n(s, N, text); }
  char text[N];
};

template <class F, Name name>
struct Unsupported;
template <class R, class... A, Name name>
struct Unsupported<R(CL_API_CALL*)(A...), name> {
  static R CL_API_CALL call(A... args) {
    static bool said = false;
    if (!said) logLine(std::string(name.text) + " is not supported by raccel's OpenCL 1.2 device (no GL, D3D, EGL, SVM "
                                                "or pipes)", true);
    said = true;
    if constexpr (std::is_pointer_v<R>) {
      if constexpr (sizeof...(A) > 0) {
        auto last = std::get<sizeof...(A) - 1>(std::tuple<A...>(args...));
        if constexpr (std::is_same_v<decltype(last), cl_int*>)
          if (last) *last = CL_INVALID_OPERATION;
      }
      return nullptr;
    } else if constexpr (std::is_same_v<R, void>) {
      return;
    } else {
      return static_cast<R>(CL_INVALID_OPERATION);
    }
  }
};

cl_int CL_API_CALL unsupportedWindowsSlot() { return CL_INVALID_OPERATION; }
}  // namespace

cl_icd_dispatch kDispatch;

#define RACCEL_SLOT(n) d.n = Unsupported<cl_api_##n, #n>::call;
#define RACCEL_WINDOWS_SLOT(n) d.n = reinterpret_cast<void*>(&unsupportedWindowsSlot);

void fillDispatch(cl_icd_dispatch& d) {
  std::memset(&d, 0, sizeof d);
  // Every slot first answers "unsupported"...
  RACCEL_SLOT(clCreateFromGLBuffer) RACCEL_SLOT(clCreateFromGLTexture2D) RACCEL_SLOT(clCreateFromGLTexture3D) RACCEL_SLOT(clCreateFromGLRenderbuffer)
  RACCEL_SLOT(clGetGLObjectInfo) RACCEL_SLOT(clGetGLTextureInfo) RACCEL_SLOT(clEnqueueAcquireGLObjects)
  RACCEL_SLOT(clEnqueueReleaseGLObjects) RACCEL_SLOT(clGetGLContextInfoKHR) RACCEL_SLOT(clCreateSubDevicesEXT)
  RACCEL_SLOT(clRetainDeviceEXT) RACCEL_SLOT(clReleaseDeviceEXT) RACCEL_SLOT(clCreateEventFromGLsyncKHR)
  RACCEL_SLOT(clCreateProgramWithBuiltInKernels)
  RACCEL_SLOT(clCreateFromGLTexture) RACCEL_SLOT(clCreateFromEGLImageKHR) RACCEL_SLOT(clEnqueueAcquireEGLObjectsKHR)
  RACCEL_SLOT(clEnqueueReleaseEGLObjectsKHR) RACCEL_SLOT(clCreateEventFromEGLSyncKHR) RACCEL_SLOT(clCreatePipe)
  RACCEL_SLOT(clGetPipeInfo) RACCEL_SLOT(clSVMAlloc) RACCEL_SLOT(clSVMFree) RACCEL_SLOT(clEnqueueSVMFree)
  RACCEL_SLOT(clEnqueueSVMMemcpy) RACCEL_SLOT(clEnqueueSVMMemFill) RACCEL_SLOT(clEnqueueSVMMap)
  RACCEL_SLOT(clEnqueueSVMUnmap) RACCEL_SLOT(clSetKernelArgSVMPointer) RACCEL_SLOT(clSetKernelExecInfo)
  RACCEL_SLOT(clGetKernelSubGroupInfoKHR) RACCEL_SLOT(clCloneKernel) RACCEL_SLOT(clCreateProgramWithIL)
  RACCEL_SLOT(clEnqueueSVMMigrateMem) RACCEL_SLOT(clGetDeviceAndHostTimer) RACCEL_SLOT(clGetHostTimer)
  RACCEL_SLOT(clGetKernelSubGroupInfo) RACCEL_SLOT(clSetDefaultDeviceCommandQueue) RACCEL_SLOT(clSetProgramReleaseCallback)
  RACCEL_SLOT(clSetProgramSpecializationConstant) RACCEL_SLOT(clCreateBufferWithProperties)
  RACCEL_SLOT(clCreateImageWithProperties) RACCEL_SLOT(clSetContextDestructorCallback)
  RACCEL_WINDOWS_SLOT(clGetDeviceIDsFromD3D10KHR) RACCEL_WINDOWS_SLOT(clCreateFromD3D10BufferKHR)
  RACCEL_WINDOWS_SLOT(clCreateFromD3D10Texture2DKHR) RACCEL_WINDOWS_SLOT(clCreateFromD3D10Texture3DKHR)
  RACCEL_WINDOWS_SLOT(clEnqueueAcquireD3D10ObjectsKHR) RACCEL_WINDOWS_SLOT(clEnqueueReleaseD3D10ObjectsKHR)
  RACCEL_WINDOWS_SLOT(clGetDeviceIDsFromD3D11KHR) RACCEL_WINDOWS_SLOT(clCreateFromD3D11BufferKHR)
  RACCEL_WINDOWS_SLOT(clCreateFromD3D11Texture2DKHR) RACCEL_WINDOWS_SLOT(clCreateFromD3D11Texture3DKHR)
  RACCEL_WINDOWS_SLOT(clCreateFromDX9MediaSurfaceKHR) RACCEL_WINDOWS_SLOT(clEnqueueAcquireD3D11ObjectsKHR)
  RACCEL_WINDOWS_SLOT(clEnqueueReleaseD3D11ObjectsKHR)
  // ...then the OpenCL 1.2 API over raccel.
  fillImageDispatch(d);
  d.clGetPlatformIDs = getPlatformIDs;
  d.clGetPlatformInfo = getPlatformInfo;
  d.clGetDeviceIDs = getDeviceIDs;
  d.clGetDeviceInfo = getDeviceInfo;
  d.clCreateSubDevices = createSubDevices;
  d.clRetainDevice = retainDevice;
  d.clReleaseDevice = releaseDevice;
  d.clCreateContext = createContext;
  d.clCreateContextFromType = createContextFromType;
  d.clRetainContext = retainContext;
  d.clReleaseContext = releaseContext;
  d.clGetContextInfo = getContextInfo;
  d.clCreateCommandQueue = createCommandQueue;
  d.clCreateCommandQueueWithProperties = createCommandQueueWithProperties;
  d.clRetainCommandQueue = retainCommandQueue;
  d.clReleaseCommandQueue = releaseCommandQueue;
  d.clGetCommandQueueInfo = getCommandQueueInfo;
  d.clSetCommandQueueProperty = setCommandQueueProperty;
  d.clCreateBuffer = createBuffer;
  d.clCreateSubBuffer = createSubBuffer;
  d.clRetainMemObject = retainMemObject;
  d.clReleaseMemObject = releaseMemObject;
  d.clGetMemObjectInfo = getMemObjectInfo;
  d.clSetMemObjectDestructorCallback = setMemObjectDestructorCallback;
  d.clCreateProgramWithSource = createProgramWithSource;
  d.clCreateProgramWithBinary = createProgramWithBinary;
  d.clRetainProgram = retainProgram;
  d.clReleaseProgram = releaseProgram;
  d.clBuildProgram = buildProgram;
  d.clCompileProgram = compileProgram;
  d.clLinkProgram = linkProgram;
  d.clUnloadCompiler = unloadCompiler;
  d.clUnloadPlatformCompiler = unloadPlatformCompiler;
  d.clGetProgramInfo = getProgramInfo;
  d.clGetProgramBuildInfo = getProgramBuildInfo;
  d.clCreateKernel = createKernel;
  d.clCreateKernelsInProgram = createKernelsInProgram;
  d.clRetainKernel = retainKernel;
  d.clReleaseKernel = releaseKernel;
  d.clSetKernelArg = setKernelArg;
  d.clGetKernelInfo = getKernelInfo;
  d.clGetKernelArgInfo = getKernelArgInfo;
  d.clGetKernelWorkGroupInfo = getKernelWorkGroupInfo;
  d.clWaitForEvents = waitForEvents;
  d.clGetEventInfo = getEventInfo;
  d.clRetainEvent = retainEvent;
  d.clReleaseEvent = releaseEvent;
  d.clCreateUserEvent = createUserEvent;
  d.clSetUserEventStatus = setUserEventStatus;
  d.clSetEventCallback = setEventCallback;
  d.clGetEventProfilingInfo = getEventProfilingInfo;
  d.clFlush = flush;
  d.clFinish = finish;
  d.clEnqueueReadBuffer = enqueueReadBuffer;
  d.clEnqueueWriteBuffer = enqueueWriteBuffer;
  d.clEnqueueCopyBuffer = enqueueCopyBuffer;
  d.clEnqueueFillBuffer = enqueueFillBuffer;
  d.clEnqueueReadBufferRect = enqueueReadBufferRect;
  d.clEnqueueWriteBufferRect = enqueueWriteBufferRect;
  d.clEnqueueCopyBufferRect = enqueueCopyBufferRect;
  d.clEnqueueMapBuffer = enqueueMapBuffer;
  d.clEnqueueUnmapMemObject = enqueueUnmapMemObject;
  d.clEnqueueMigrateMemObjects = enqueueMigrateMemObjects;
  d.clEnqueueNDRangeKernel = enqueueNDRangeKernel;
  d.clEnqueueTask = enqueueTask;
  d.clEnqueueNativeKernel = enqueueNativeKernel;
  d.clEnqueueMarker = enqueueMarker;
  d.clEnqueueMarkerWithWaitList = enqueueMarkerWithWaitList;
  d.clEnqueueBarrier = enqueueBarrier;
  d.clEnqueueBarrierWithWaitList = enqueueBarrierWithWaitList;
  d.clEnqueueWaitForEvents = enqueueWaitForEvents;
  d.clGetExtensionFunctionAddress = getExtensionFunctionAddress;
  d.clGetExtensionFunctionAddressForPlatform = getExtensionFunctionAddressForPlatform;
}

namespace {
struct FillAtLoad {
  FillAtLoad() { fillDispatch(kDispatch); }
} fillAtLoad;
}  // namespace

}  // namespace raccel::opencl

// The loader's entry points: the only symbols this library exports.
extern "C" {
__attribute__((visibility("default"))) cl_int CL_API_CALL clIcdGetPlatformIDsKHR(cl_uint n, cl_platform_id* out,
                                                                                  cl_uint* count) {
  if ((n == 0 && out) || (!out && !count)) return CL_INVALID_VALUE;
  if (out) out[0] = raccel::opencl::thePlatform();
  if (count) *count = 1;
  return CL_SUCCESS;
}

__attribute__((visibility("default"))) void* CL_API_CALL clGetExtensionFunctionAddress(const char* name) {
  if (name && std::strcmp(name, "clIcdGetPlatformIDsKHR") == 0) return reinterpret_cast<void*>(&clIcdGetPlatformIDsKHR);
  return nullptr;
}

__attribute__((visibility("default"))) void* CL_API_CALL clGetExtensionFunctionAddressForPlatform(cl_platform_id p,
                                                                                                   const char* name) {
  if (p != raccel::opencl::thePlatform()) return nullptr;
  return clGetExtensionFunctionAddress(name);
}

__attribute__((visibility("default"))) cl_int CL_API_CALL clGetPlatformInfo(cl_platform_id p, cl_platform_info what,
                                                                             size_t size, void* out, size_t* ret) {
  return raccel::opencl::kDispatch.clGetPlatformInfo(p, what, size, out, ret);
}
}

