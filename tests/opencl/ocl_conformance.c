/* Points of the OpenCL standard that real programs rely on, checked one by one through
 * whichever platform is named (raccel by default, or $RACCEL_TEST_PLATFORM, so the same
 * checks run against the local PoCL device in the same test). Linked only with
 * -lOpenCL. Prints "ok NAME" or "FAIL NAME: why" per check and "N passed, N failed".
 *   ocl_conformance [--big-mib N] [--only NAME] [--skip NAME]... [--list]
 * --big-mib sets the size of the large transfers (default 1024: 1 GiB in one buffer,
 * and in sixteen). */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static cl_platform_id platform;
static cl_device_id device;
static cl_context context;
static cl_command_queue queue;
static size_t big_mib = 1024;
static char why[512];

#define FAILED(...) (snprintf(why, sizeof why, __VA_ARGS__), 1)
#define CHECK(call)                                                              \
  do {                                                                           \
    cl_int rc_ = (call);                                                         \
    if (rc_ != CL_SUCCESS) return FAILED("%s gave %d (line %d)", #call, rc_, __LINE__); \
  } while (0)
#define EXPECT(call, code)                                                                    \
  do {                                                                                        \
    cl_int rc_ = (call);                                                                      \
    if (rc_ != (code)) return FAILED("%s gave %d, expected %s (%d)", #call, rc_, #code, code); \
  } while (0)

static int open_platform(void) {
  const char* want = getenv("RACCEL_TEST_PLATFORM") ? getenv("RACCEL_TEST_PLATFORM") : "raccel";
  cl_platform_id platforms[16];
  cl_uint n = 0;
  if (clGetPlatformIDs(16, platforms, &n) != CL_SUCCESS) n = 0;
  for (cl_uint i = 0; i < n && i < 16; ++i) {
    char name[256] = "";
    clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
    if (strcmp(name, want) != 0) continue;
    platform = platforms[i];
    cl_int rc = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL);
    if (rc == CL_SUCCESS) context = clCreateContext(NULL, 1, &device, NULL, NULL, &rc);
    if (rc == CL_SUCCESS) queue = clCreateCommandQueue(context, device, CL_QUEUE_PROFILING_ENABLE, &rc);
    if (rc != CL_SUCCESS) printf("ocl_conformance: cannot open %s: %d\n", want, rc);
    return rc != CL_SUCCESS;
  }
  printf("ocl_conformance: no platform named %s among %u\n", want, n);
  return 1;
}

/* Builds `source` and takes its kernel `name`; the build log goes into `why` on failure. */
static int build(const char* source, const char* options, const char* name, cl_program* p, cl_kernel* k) {
  cl_int rc;
  *p = clCreateProgramWithSource(context, 1, &source, NULL, &rc);
  CHECK(rc);
  rc = clBuildProgram(*p, 1, &device, options, NULL, NULL);
  if (rc != CL_SUCCESS) {
    char log[400] = "";
    clGetProgramBuildInfo(*p, device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    return FAILED("build gave %d: %s", rc, log);
  }
  *k = clCreateKernel(*p, name, &rc);
  CHECK(rc);
  return 0;
}

static int has_extension(const char* name) {
  char ext[8192] = "";
  clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
  size_t n = strlen(name);
  for (const char* at = strstr(ext, name); at; at = strstr(at + 1, name))
    if ((at == ext || at[-1] == ' ') && (at[n] == ' ' || at[n] == 0)) return 1;
  return 0;
}

/* ---- Large transfers: every reply comes, whatever the size. ---- */

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)((i * 2654435761u) >> 13) ^ (unsigned char)seed; }

static int round_trip(size_t buffers) {
  size_t total = big_mib << 20, each = total / buffers;
  unsigned char* host = malloc(each);
  unsigned char* back = malloc(each);
  cl_mem* mems = calloc(buffers, sizeof *mems);
  int failed = !host || !back || !mems;
  if (failed) (void)FAILED("no host memory for %zu MiB", big_mib);
  for (size_t b = 0; b < buffers && !failed; ++b) {
    cl_int rc;
    mems[b] = clCreateBuffer(context, CL_MEM_READ_WRITE, each, NULL, &rc);
    for (size_t i = 0; i < each; ++i) host[i] = pattern(i, (unsigned)b);
    if (rc == CL_SUCCESS) rc = clEnqueueWriteBuffer(queue, mems[b], CL_TRUE, 0, each, host, 0, NULL, NULL);
    if (rc != CL_SUCCESS) failed = FAILED("buffer %zu of %zu MiB: create or write gave %d", b, each >> 20, rc);
  }
  for (size_t b = 0; b < buffers && !failed; ++b) {
    cl_int rc = clEnqueueReadBuffer(queue, mems[b], CL_TRUE, 0, each, back, 0, NULL, NULL);
    if (rc != CL_SUCCESS) failed = FAILED("read of buffer %zu gave %d", b, rc);
    for (size_t i = 0; i < each && !failed; ++i)
      if (back[i] != pattern(i, (unsigned)b)) failed = FAILED("buffer %zu byte %zu is %u, wrote %u", b, i, back[i], pattern(i, (unsigned)b));
  }
  for (size_t b = 0; mems && b < buffers; ++b)
    if (mems[b]) clReleaseMemObject(mems[b]);
  free(mems);
  free(host);
  free(back);
  return failed;
}
static int big_one_buffer(void) { return round_trip(1); }
static int big_many_buffers(void) { return round_trip(16); }

/* ---- Launch geometry exactly as the program gave it. ---- */

static int run_index_kernel(const char* source, const char* name, size_t global, const size_t* local, cl_int* out) {
  cl_program p;
  cl_kernel k;
  if (build(source, "", name, &p, &k)) return 1;
  cl_int rc;
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, global * sizeof(cl_int), NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, local, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(queue, m, CL_TRUE, 0, global * sizeof(cl_int), out, 0, NULL, NULL));
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

static int required_size_one(void) {
  const char* src =
      "__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void f(__global int* out) {\n"
      "  size_t i = get_global_id(0); out[i] = (int)(i * 3 + get_local_size(0) * 1000);\n}\n";
  cl_int out[64];
  size_t one = 1;
  if (run_index_kernel(src, "f", 64, &one, out)) return 1;
  for (int i = 0; i < 64; ++i)
    if (out[i] != i * 3 + 1000) return FAILED("out[%d] = %d, expected %d", i, out[i], i * 3 + 1000);
  /* Another size, or none, is refused at enqueue with the standard error. */
  cl_program p;
  cl_kernel k;
  if (build(src, "", "f", &p, &k)) return 1;
  cl_int rc;
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, 64 * sizeof(cl_int), NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  size_t global = 64, two = 2;
  EXPECT(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, &two, 0, NULL, NULL), CL_INVALID_WORK_GROUP_SIZE);
  EXPECT(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, NULL), CL_INVALID_WORK_GROUP_SIZE);
  CHECK(clFinish(queue));
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

static int work_dimensions(void) {
  const char* src = "__kernel void f(__global int* out) { out[get_global_id(0)] = (int)get_work_dim(); }\n";
  cl_int out[16];
  size_t four = 4;
  if (run_index_kernel(src, "f", 16, &four, out)) return 1;
  for (int i = 0; i < 16; ++i)
    if (out[i] != 1) return FAILED("get_work_dim() = %d in a 1-D launch", out[i]);
  if (run_index_kernel(src, "f", 16, NULL, out)) return 1;
  for (int i = 0; i < 16; ++i)
    if (out[i] != 1) return FAILED("get_work_dim() = %d in a 1-D launch with no local size", out[i]);
  return 0;
}

static int task(void) {
  const char* src = "__kernel void f(__global int* out) { out[0] = (int)(get_global_size(0) * 100 + get_local_size(0)); }\n";
  cl_program p;
  cl_kernel k;
  if (build(src, "", "f", &p, &k)) return 1;
  cl_int rc, out = 0;
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, sizeof out, NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  CHECK(clEnqueueTask(queue, k, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(queue, m, CL_TRUE, 0, sizeof out, &out, 0, NULL, NULL));
  if (out != 101) return FAILED("a task saw global size * 100 + local size = %d, expected 101", out);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

/* ---- Arguments up to the reported limit. ---- */

static int large_arguments(void) {
  size_t limit = 0;
  CHECK(clGetDeviceInfo(device, CL_DEVICE_MAX_PARAMETER_SIZE, sizeof limit, &limit, NULL));
  if (limit < 1024) return FAILED("CL_DEVICE_MAX_PARAMETER_SIZE is %zu (at least 1024)", limit);
  /* A struct of ints by value, plus one pointer, within the limit. */
  size_t ints = (limit - 64) / sizeof(cl_int);
  if (ints > 1000) ints = 1000;
  char src[512];
  snprintf(src, sizeof src,
           "typedef struct { int v[%zu]; } Big;\n"
           "__kernel void f(__global int* out, Big big) { out[get_global_id(0)] = big.v[get_global_id(0)]; }\n",
           ints);
  cl_program p;
  cl_kernel k;
  if (build(src, "", "f", &p, &k)) return 1;
  cl_int* big = malloc(ints * sizeof(cl_int));
  cl_int* out = malloc(ints * sizeof(cl_int));
  for (size_t i = 0; i < ints; ++i) big[i] = (cl_int)(i * 7 + 1);
  cl_int rc;
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, ints * sizeof(cl_int), NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  CHECK(clSetKernelArg(k, 1, ints * sizeof(cl_int), big));
  size_t global = ints;
  CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(queue, m, CL_TRUE, 0, ints * sizeof(cl_int), out, 0, NULL, NULL));
  for (size_t i = 0; i < ints; ++i)
    if (out[i] != big[i]) return FAILED("a %zu-byte argument: element %zu came back %d", ints * sizeof(cl_int), i, out[i]);
  free(big);
  free(out);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

/* ---- Buffers: flags as given, destructor callbacks. ---- */

static int mem_flags(void) {
  int host[16] = {0};
  cl_int rc;
  cl_mem_flags given = CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, flags = 0;
  cl_mem m = clCreateBuffer(context, given, sizeof host, host, &rc);
  CHECK(rc);
  CHECK(clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof flags, &flags, NULL));
  if (flags != given) return FAILED("CL_MEM_FLAGS is 0x%llx, created with 0x%llx", (unsigned long long)flags, (unsigned long long)given);
  clReleaseMemObject(m);
  return 0;
}

static void CL_CALLBACK count_destruction(cl_mem m, void* data) {
  (void)m;
  ++*(int*)data;
}

static int destructor_callback(void) {
  const char* src = "__kernel void f(__global int* out) { out[get_global_id(0)] = 5; }\n";
  cl_program p;
  cl_kernel k;
  if (build(src, "", "f", &p, &k)) return 1;
  cl_int rc;
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, 64, NULL, &rc);
  CHECK(rc);
  int destroyed = 0;
  CHECK(clSetMemObjectDestructorCallback(m, count_destruction, &destroyed));
  CHECK(clSetKernelArg(k, 0, sizeof m, &m)); /* a kernel argument does not keep it alive */
  size_t global = 16;
  CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
  CHECK(clReleaseMemObject(m));
  CHECK(clFinish(queue));
  if (destroyed != 1) return FAILED("the destructor callback ran %d times after the release and a finish", destroyed);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

/* ---- Standard error codes. ---- */

static int error_codes(void) {
  cl_int rc;
  cl_command_queue q = clCreateCommandQueue(context, device, (cl_command_queue_properties)1 << 40, &rc);
  if (q) clReleaseCommandQueue(q);
  if (rc != CL_INVALID_VALUE) return FAILED("an unknown queue property gave %d, expected CL_INVALID_VALUE", rc);
  cl_device_id d;
  EXPECT(clGetDeviceIDs(platform, (cl_device_type)0, 1, &d, NULL), CL_INVALID_DEVICE_TYPE);
  return 0;
}

/* ---- What the device says it has, it has. ---- */

static int image_macro_matches(void) {
  cl_bool images = CL_FALSE;
  CHECK(clGetDeviceInfo(device, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL));
  const char* src =
      "__kernel void f(__global int* out) {\n"
      "#ifdef __IMAGE_SUPPORT__\n out[0] = 1;\n#else\n out[0] = 0;\n#endif\n}\n";
  cl_program p;
  cl_kernel k;
  if (build(src, "", "f", &p, &k)) return 1;
  cl_int rc, out = -1;
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, sizeof out, NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  CHECK(clEnqueueTask(queue, k, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(queue, m, CL_TRUE, 0, sizeof out, &out, 0, NULL, NULL));
  if (out != (images ? 1 : 0)) return FAILED("__IMAGE_SUPPORT__ is %sdefined; CL_DEVICE_IMAGE_SUPPORT says %d", out ? "" : "not ", images);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

static int double_precision(void) {
  cl_device_fp_config config = 0;
  CHECK(clGetDeviceInfo(device, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof config, &config, NULL));
  if (!has_extension("cl_khr_fp64") || !config) return FAILED("no cl_khr_fp64 (double config 0x%llx)", (unsigned long long)config);
  const char* src =
      "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
      "__kernel void f(__global const double* x, __global double* y, double a) {\n"
      "  size_t i = get_global_id(0); y[i] = a * x[i] + sqrt(x[i]);\n}\n";
  cl_program p;
  cl_kernel k;
  if (build(src, "", "f", &p, &k)) return 1;
  enum { N = 4096 };
  static double x[N], y[N];
  for (int i = 0; i < N; ++i) x[i] = 1.0 + i / 3.0;
  cl_int rc;
  cl_mem bx = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof x, x, &rc);
  CHECK(rc);
  cl_mem by = clCreateBuffer(context, CL_MEM_WRITE_ONLY, sizeof y, NULL, &rc);
  CHECK(rc);
  double a = 1.0 / 3.0;
  CHECK(clSetKernelArg(k, 0, sizeof bx, &bx));
  CHECK(clSetKernelArg(k, 1, sizeof by, &by));
  CHECK(clSetKernelArg(k, 2, sizeof a, &a));
  size_t global = N;
  CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(queue, by, CL_TRUE, 0, sizeof y, y, 0, NULL, NULL));
  for (int i = 0; i < N; ++i) {
    double want = a * x[i] + sqrt(x[i]);
    if (fabs(y[i] - want) > 1e-14 * fabs(want)) return FAILED("y[%d] = %.17g, expected %.17g (not double precision)", i, y[i], want);
  }
  clReleaseMemObject(bx);
  clReleaseMemObject(by);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

/* ---- Profiling from the card's clock: a kernel's START..END is its run, not the
 * transport's. A kernel that spins for a while shows a span that grows with its work,
 * and START is not before the command was submitted. ---- */

static int card_timestamps(void) {
  const char* src =
      "__kernel void spin(__global float* out, int n) {\n"
      "  float v = (float)get_global_id(0);\n"
      "  for (int i = 0; i < n; ++i) v = v * 0.999f + 1.0f;\n"
      "  out[get_global_id(0)] = v;\n}\n";
  cl_program p;
  cl_kernel k;
  if (build(src, "", "spin", &p, &k)) return 1;
  cl_int rc;
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, 1024 * sizeof(float), NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  cl_ulong span[2] = {0, 0};
  int loops[2] = {10, 200000};
  for (int r = 0; r < 2; ++r) {
    CHECK(clSetKernelArg(k, 1, sizeof loops[r], &loops[r]));
    size_t global = 1024;
    cl_event e;
    CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, &e));
    CHECK(clWaitForEvents(1, &e));
    cl_ulong queued = 0, submit = 0, start = 0, end = 0;
    CHECK(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_QUEUED, sizeof queued, &queued, NULL));
    CHECK(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_SUBMIT, sizeof submit, &submit, NULL));
    CHECK(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL));
    CHECK(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL));
    if (!(queued <= submit && submit <= start && start <= end))
      return FAILED("profiling times out of order: queued %llu submit %llu start %llu end %llu", (unsigned long long)queued,
                    (unsigned long long)submit, (unsigned long long)start, (unsigned long long)end);
    span[r] = end - start;
    clReleaseEvent(e);
  }
  /* 20000x the work: the long kernel's span is many times the short one's. A span timed
   * by the transport would be dominated by round trips, and nearly equal. */
  if (span[1] < 20 * span[0] + 1)
    return FAILED("kernel spans %llu ns for 10 loops and %llu ns for 200000: not the card's times",
                  (unsigned long long)span[0], (unsigned long long)span[1]);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

/* ---- Separate compilation: compile two sources (one includes a header passed by
 * name), link them, run the result. ---- */

static int compile_and_link(void) {
  cl_bool linker = CL_FALSE;
  CHECK(clGetDeviceInfo(device, CL_DEVICE_LINKER_AVAILABLE, sizeof linker, &linker, NULL));
  if (!linker) return FAILED("CL_DEVICE_LINKER_AVAILABLE is false");
  const char* header = "#define SCALE 3\nint scaled(int x);\n";
  const char* lib = "#include \"scale.h\"\nint scaled(int x) { return x * SCALE + 1; }\n";
  const char* main_src =
      "#include \"scale.h\"\n__kernel void f(__global int* out) { out[get_global_id(0)] = scaled((int)get_global_id(0)); }\n";
  cl_int rc;
  cl_program h = clCreateProgramWithSource(context, 1, &header, NULL, &rc);
  CHECK(rc);
  cl_program a = clCreateProgramWithSource(context, 1, &lib, NULL, &rc);
  CHECK(rc);
  cl_program b = clCreateProgramWithSource(context, 1, &main_src, NULL, &rc);
  CHECK(rc);
  const char* names[] = {"scale.h"};
  CHECK(clCompileProgram(a, 1, &device, "", 1, &h, names, NULL, NULL));
  CHECK(clCompileProgram(b, 1, &device, "", 1, &h, names, NULL, NULL));
  cl_program_binary_type type = 0;
  CHECK(clGetProgramBuildInfo(a, device, CL_PROGRAM_BINARY_TYPE, sizeof type, &type, NULL));
  if (type != CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT) return FAILED("a compiled program's binary type is %u", (unsigned)type);
  cl_program objects[] = {a, b};
  cl_program linked = clLinkProgram(context, 1, &device, "", 2, objects, NULL, NULL, &rc);
  CHECK(rc);
  cl_kernel k = clCreateKernel(linked, "f", &rc);
  CHECK(rc);
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, 32 * sizeof(cl_int), NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  size_t global = 32;
  CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
  cl_int out[32];
  CHECK(clEnqueueReadBuffer(queue, m, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
  for (int i = 0; i < 32; ++i)
    if (out[i] != i * 3 + 1) return FAILED("out[%d] = %d, expected %d", i, out[i], i * 3 + 1);
  /* A link of objects that do not fit together (a missing function) fails cleanly. */
  cl_program lonely[] = {b};
  cl_program broken = clLinkProgram(context, 1, &device, "", 1, lonely, NULL, NULL, &rc);
  if (rc != CL_LINK_PROGRAM_FAILURE) return FAILED("a link with an undefined function gave %d", rc);
  if (broken) clReleaseProgram(broken);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(linked);
  clReleaseProgram(a);
  clReleaseProgram(b);
  clReleaseProgram(h);
  return 0;
}

/* Bad input to separate compilation: hostile options, a link of something that is not
 * a compiled object. Each gives its standard error, and compiling carries on. */
static int compile_bad_input(void) {
  const char* src = "int twice(int x) { return 2 * x; }\n";
  cl_int rc;
  cl_program a = clCreateProgramWithSource(context, 1, &src, NULL, &rc);
  CHECK(rc);
  rc = clCompileProgram(a, 1, &device, "-cl-no-such-option --hostile=$(rm -rf /)", 0, NULL, NULL, NULL, NULL);
  if (rc != CL_INVALID_COMPILER_OPTIONS && rc != CL_COMPILE_PROGRAM_FAILURE) return FAILED("hostile options gave %d", rc);
  rc = clCompileProgram(a, 1, &device, "-include /etc/passwd", 0, NULL, NULL, NULL, NULL);
  if (rc != CL_INVALID_COMPILER_OPTIONS && rc != CL_COMPILE_PROGRAM_FAILURE)
    return FAILED("a compile that includes /etc/passwd gave %d", rc);
  cl_program source_only = clCreateProgramWithSource(context, 1, &src, NULL, &rc);
  CHECK(rc);
  cl_program linked = clLinkProgram(context, 1, &device, "", 1, &source_only, NULL, NULL, &rc);
  if (rc != CL_INVALID_OPERATION) return FAILED("linking a program that was never compiled gave %d", rc);
  if (linked) clReleaseProgram(linked);
  CHECK(clCompileProgram(a, 1, &device, "", 0, NULL, NULL, NULL, NULL));
  clReleaseProgram(source_only);
  clReleaseProgram(a);
  return 0;
}

/* ---- Images and samplers, made on the card by its own driver. ---- */

static int image_support(void) {
  cl_bool images = CL_FALSE;
  clGetDeviceInfo(device, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL);
  if (!images) return FAILED("CL_DEVICE_IMAGE_SUPPORT is false");
  return 0;
}

/* A 2D float image read through a sampler argument and written to another image; read
 * back whole and in part, with the host's own row pitch. */
static int images_2d(void) {
  if (image_support()) return 1;
  enum { W = 8, H = 4 };
  float in[H][W][4], out[H][W][4];
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 4; ++c) in[y][x][c] = (float)(y * 100 + x * 10 + c);
  cl_image_format f = {CL_RGBA, CL_FLOAT};
  cl_image_desc d = {0};
  d.image_type = CL_MEM_OBJECT_IMAGE2D;
  d.image_width = W;
  d.image_height = H;
  cl_int rc;
  cl_mem src = clCreateImage(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, &f, &d, in, &rc);
  CHECK(rc);
  cl_mem dst = clCreateImage(context, CL_MEM_WRITE_ONLY, &f, &d, NULL, &rc);
  CHECK(rc);
  cl_sampler s = clCreateSampler(context, CL_FALSE, CL_ADDRESS_CLAMP_TO_EDGE, CL_FILTER_NEAREST, &rc);
  CHECK(rc);
  const char* src_text =
      "__kernel void twice(__read_only image2d_t in, sampler_t s, __write_only image2d_t out) {\n"
      "  int2 p = (int2)(get_global_id(0), get_global_id(1));\n"
      "  write_imagef(out, p, 2.0f * read_imagef(in, s, p) + (float4)(0, 0, 0, get_image_width(in)));\n"
      "}\n";
  cl_program p;
  cl_kernel k;
  if (build(src_text, "", "twice", &p, &k)) return 1;
  CHECK(clSetKernelArg(k, 0, sizeof src, &src));
  CHECK(clSetKernelArg(k, 1, sizeof s, &s));
  CHECK(clSetKernelArg(k, 2, sizeof dst, &dst));
  size_t global[2] = {W, H};
  CHECK(clEnqueueNDRangeKernel(queue, k, 2, NULL, global, NULL, 0, NULL, NULL));
  size_t origin[3] = {0, 0, 0}, region[3] = {W, H, 1};
  CHECK(clEnqueueReadImage(queue, dst, CL_TRUE, origin, region, 0, 0, out, 0, NULL, NULL));
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 4; ++c)
        if (out[y][x][c] != 2 * in[y][x][c] + (c == 3 ? W : 0))
          return FAILED("pixel (%d, %d) channel %d is %g, expected %g", x, y, c, out[y][x][c], 2 * in[y][x][c] + (c == 3 ? W : 0));
  /* A 3 x 2 region from (4, 1), into rows of 5 pixels. */
  float part[2][5][4];
  memset(part, 0, sizeof part);
  size_t at[3] = {4, 1, 0}, three[3] = {3, 2, 1};
  CHECK(clEnqueueReadImage(queue, src, CL_TRUE, at, three, sizeof part[0], 0, part, 0, NULL, NULL));
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x)
      if (part[y][x][1] != in[1 + y][4 + x][1]) return FAILED("the region read back wrong at (%d, %d)", x, y);
  size_t pitch = 0, element = 0;
  CHECK(clGetImageInfo(src, CL_IMAGE_ROW_PITCH, sizeof pitch, &pitch, NULL));
  CHECK(clGetImageInfo(src, CL_IMAGE_ELEMENT_SIZE, sizeof element, &element, NULL));
  if (element != 16 || pitch < W * 16) return FAILED("element size %zu, row pitch %zu", element, pitch);
  cl_mem_object_type type = 0;
  CHECK(clGetMemObjectInfo(src, CL_MEM_TYPE, sizeof type, &type, NULL));
  if (type != CL_MEM_OBJECT_IMAGE2D) return FAILED("CL_MEM_TYPE is %#x", type);
  clReleaseSampler(s);
  clReleaseKernel(k);
  clReleaseProgram(p);
  clReleaseMemObject(src);
  clReleaseMemObject(dst);
  return 0;
}

/* A 3D unsigned image written with a host pitch, filled in part, copied to a 2D array
 * and to a buffer, mapped; read by a kernel through a sampler the kernel declares. */
static int images_3d_and_arrays(void) {
  if (image_support()) return 1;
  enum { W = 5, H = 3, D = 2 };
  cl_image_format f = {CL_RGBA, CL_UNSIGNED_INT8};
  cl_image_desc d = {0};
  d.image_type = CL_MEM_OBJECT_IMAGE3D;
  d.image_width = W, d.image_height = H, d.image_depth = D;
  cl_int rc;
  cl_mem vol = clCreateImage(context, CL_MEM_READ_WRITE, &f, &d, NULL, &rc);
  CHECK(rc);
  unsigned char host[D][H][8][4]; /* rows of 8 pixels: a pitch past the width */
  for (int z = 0; z < D; ++z)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < 8; ++x)
        for (int c = 0; c < 4; ++c) host[z][y][x][c] = (unsigned char)(z * 60 + y * 15 + x * 3 + c);
  size_t origin[3] = {0, 0, 0}, region[3] = {W, H, D};
  CHECK(clEnqueueWriteImage(queue, vol, CL_FALSE, origin, region, sizeof host[0][0], sizeof host[0], host, 0, NULL, NULL));
  cl_uint seven[4] = {7, 7, 7, 7};
  size_t fillAt[3] = {1, 1, 1}, fillRegion[3] = {2, 1, 1};
  CHECK(clEnqueueFillImage(queue, vol, seven, fillAt, fillRegion, 0, NULL, NULL));
  cl_image_desc ad = {0};
  ad.image_type = CL_MEM_OBJECT_IMAGE2D_ARRAY;
  ad.image_width = W, ad.image_height = H, ad.image_array_size = D;
  cl_mem layers = clCreateImage(context, CL_MEM_READ_WRITE, &f, &ad, NULL, &rc);
  CHECK(rc);
  CHECK(clEnqueueCopyImage(queue, vol, layers, origin, origin, region, 0, NULL, NULL));
  const char* text =
      "__constant sampler_t s = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_NONE | CLK_FILTER_NEAREST;\n"
      "__kernel void sum(__read_only image2d_array_t in, __global uint* out) {\n"
      "  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);\n"
      "  uint4 v = read_imageui(in, s, (int4)(x, y, z, 0));\n"
      "  out[(z * get_image_height(in) + y) * get_image_width(in) + x] = v.x + v.y + v.z + v.w;\n"
      "}\n";
  cl_program p;
  cl_kernel k;
  if (build(text, "", "sum", &p, &k)) return 1;
  cl_mem sums = clCreateBuffer(context, CL_MEM_READ_WRITE, sizeof(cl_uint) * W * H * D, NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof layers, &layers));
  CHECK(clSetKernelArg(k, 1, sizeof sums, &sums));
  CHECK(clEnqueueNDRangeKernel(queue, k, 3, NULL, region, NULL, 0, NULL, NULL));
  cl_uint got[D][H][W];
  CHECK(clEnqueueReadBuffer(queue, sums, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  for (int z = 0; z < D; ++z)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) {
        int filled = z == 1 && y == 1 && (x == 1 || x == 2);
        cl_uint want = filled ? 28 : 0;
        for (int c = 0; !filled && c < 4; ++c) want += host[z][y][x][c];
        if (got[z][y][x] != want) return FAILED("pixel (%d, %d, %d) sums to %u, expected %u", x, y, z, got[z][y][x], want);
      }
  /* The second slice's rows, packed into a buffer; then the image mapped. */
  cl_mem packed = clCreateBuffer(context, CL_MEM_READ_WRITE, W * H * 4, NULL, &rc);
  CHECK(rc);
  size_t slice1[3] = {0, 0, 1}, oneSlice[3] = {W, H, 1};
  CHECK(clEnqueueCopyImageToBuffer(queue, vol, packed, slice1, oneSlice, 0, 0, NULL, NULL));
  unsigned char flat[H][W][4];
  CHECK(clEnqueueReadBuffer(queue, packed, CL_TRUE, 0, sizeof flat, flat, 0, NULL, NULL));
  if (flat[0][0][2] != host[1][0][0][2] || flat[1][1][0] != 7) return FAILED("copy to a buffer: wrong bytes");
  size_t rowPitch = 0, slicePitch = 0;
  unsigned char* mapped = clEnqueueMapImage(queue, vol, CL_TRUE, CL_MAP_READ, slice1, oneSlice, &rowPitch, &slicePitch, 0,
                                            NULL, NULL, &rc);
  CHECK(rc);
  if (mapped[2 * rowPitch + 4 * 4 + 3] != host[1][2][4][3]) return FAILED("the mapped image holds the wrong bytes");
  CHECK(clEnqueueUnmapMemObject(queue, vol, mapped, 0, NULL, NULL));
  CHECK(clFinish(queue));
  clReleaseKernel(k);
  clReleaseProgram(p);
  cl_mem all[] = {vol, layers, sums, packed};
  for (int i = 0; i < 4; ++i) clReleaseMemObject(all[i]);
  return 0;
}

/* A 1D image of a buffer: what a kernel writes through it is in the buffer. */
static int image_of_a_buffer(void) {
  if (image_support()) return 1;
  enum { N = 64 };
  cl_int rc;
  cl_mem buf = clCreateBuffer(context, CL_MEM_READ_WRITE, N * 16, NULL, &rc);
  CHECK(rc);
  cl_image_format f = {CL_RGBA, CL_FLOAT};
  cl_image_desc d = {0};
  d.image_type = CL_MEM_OBJECT_IMAGE1D_BUFFER;
  d.image_width = N;
  d.buffer = buf;
  cl_mem img = clCreateImage(context, CL_MEM_READ_WRITE, &f, &d, NULL, &rc);
  CHECK(rc);
  cl_mem of = NULL;
  CHECK(clGetImageInfo(img, CL_IMAGE_BUFFER, sizeof of, &of, NULL));
  if (of != buf) return FAILED("CL_IMAGE_BUFFER is not the buffer");
  const char* text =
      "__kernel void put(__write_only image1d_buffer_t out, __global float* marks) {\n"
      "  int i = get_global_id(0);\n"
      "  write_imagef(out, i, (float4)(i, -i, 0.5f, 1));\n"
      "  marks[i] = i;\n"
      "}\n";
  cl_program p;
  cl_kernel k;
  if (build(text, "", "put", &p, &k)) return 1;
  /* (A buffer argument too: PoCL 3.1 faults on a kernel with no buffer argument beside such an image.) */
  cl_mem marks = clCreateBuffer(context, CL_MEM_READ_WRITE, N * sizeof(float), NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof img, &img));
  CHECK(clSetKernelArg(k, 1, sizeof marks, &marks));
  size_t global = N;
  CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
  float got[N][4];
  CHECK(clEnqueueReadBuffer(queue, buf, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  for (int i = 0; i < N; ++i)
    if (got[i][0] != i || got[i][1] != -i || got[i][2] != 0.5f) return FAILED("texel %d is (%g, %g, %g)", i, got[i][0], got[i][1], got[i][2]);
  clReleaseKernel(k);
  clReleaseProgram(p);
  clReleaseMemObject(img);
  clReleaseMemObject(buf);
  clReleaseMemObject(marks);
  return 0;
}

/* Bad image input: absurd sizes, unknown formats, a format the device does not list, a
 * missing size. Each gives its standard error, and images still work after. */
static int image_bad_input(void) {
  if (image_support()) return 1;
  cl_int rc;
  cl_image_format f = {CL_RGBA, CL_FLOAT};
  cl_image_desc d = {0};
  d.image_type = CL_MEM_OBJECT_IMAGE2D;
  d.image_width = (size_t)1 << 40;
  d.image_height = (size_t)1 << 40;
  cl_mem m = clCreateImage(context, CL_MEM_READ_WRITE, &f, &d, NULL, &rc);
  if (m || rc != CL_INVALID_IMAGE_SIZE) return FAILED("a 2^40 x 2^40 image gave %d", rc);
  d.image_type = CL_MEM_OBJECT_IMAGE3D;
  d.image_width = d.image_height = d.image_depth = (size_t)-1;
  m = clCreateImage(context, CL_MEM_READ_WRITE, &f, &d, NULL, &rc);
  if (m || rc != CL_INVALID_IMAGE_SIZE) return FAILED("a SIZE_MAX-sided 3D image gave %d", rc);
  d.image_type = CL_MEM_OBJECT_IMAGE2D;
  d.image_width = 0;
  d.image_height = 4;
  m = clCreateImage(context, CL_MEM_READ_WRITE, &f, &d, NULL, &rc);
  if (m || rc != CL_INVALID_IMAGE_DESCRIPTOR) return FAILED("a 0-wide image gave %d", rc);
  d.image_width = 4;
  cl_image_format unknown = {0x1234, CL_FLOAT};
  m = clCreateImage(context, CL_MEM_READ_WRITE, &unknown, &d, NULL, &rc);
  if (m || rc != CL_INVALID_IMAGE_FORMAT_DESCRIPTOR) return FAILED("an unknown channel order gave %d", rc);
  cl_image_desc odd = d;
  odd.image_type = 0x10FF;
  m = clCreateImage(context, CL_MEM_READ_WRITE, &f, &odd, NULL, &rc);
  if (m || rc != CL_INVALID_IMAGE_DESCRIPTOR) return FAILED("an unknown image type gave %d", rc);
  /* A format the device does not list, if it lacks one of these. */
  cl_image_format listed[512];
  cl_uint n = 0;
  CHECK(clGetSupportedImageFormats(context, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D, 512, listed, &n));
  if (n == 0) return FAILED("no image formats listed");
  const cl_image_format candidates[] = {{CL_RGB, CL_UNORM_SHORT_565}, {CL_RGB, CL_UNORM_INT_101010},
                                        {CL_ARGB, CL_SIGNED_INT32}, {CL_RA, CL_HALF_FLOAT}};
  for (size_t c = 0; c < sizeof candidates / sizeof *candidates; ++c) {
    int found = 0;
    for (cl_uint i = 0; i < n && i < 512; ++i)
      found |= listed[i].image_channel_order == candidates[c].image_channel_order &&
               listed[i].image_channel_data_type == candidates[c].image_channel_data_type;
    if (found) continue;
    m = clCreateImage(context, CL_MEM_READ_WRITE, &candidates[c], &d, NULL, &rc);
    if (m || rc != CL_IMAGE_FORMAT_NOT_SUPPORTED) return FAILED("an unlisted format (%#x, %#x) gave %d",
                                                                 candidates[c].image_channel_order,
                                                                 candidates[c].image_channel_data_type, rc);
    break;
  }
  float px[4] = {1, 2, 3, 4};
  m = clCreateImage(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &f, &d, NULL, &rc);
  if (m || rc != CL_INVALID_HOST_PTR) return FAILED("COPY_HOST_PTR without a pointer gave %d", rc);
  m = clCreateImage(context, CL_MEM_READ_WRITE, &f, &d, NULL, &rc);
  CHECK(rc);
  size_t origin[3] = {3, 0, 0}, two[3] = {2, 1, 1};
  EXPECT(clEnqueueWriteImage(queue, m, CL_TRUE, origin, two, 0, 0, px, 0, NULL, NULL), CL_INVALID_VALUE);
  size_t one[3] = {1, 1, 1};
  CHECK(clEnqueueWriteImage(queue, m, CL_TRUE, origin, one, 0, 0, px, 0, NULL, NULL));
  float back[4] = {0};
  CHECK(clEnqueueReadImage(queue, m, CL_TRUE, origin, one, 0, 0, back, 0, NULL, NULL));
  if (back[2] != 3) return FAILED("the image after bad input read back %g", back[2]);
  cl_sampler s = clCreateSampler(context, CL_TRUE, (cl_addressing_mode)0x1199, CL_FILTER_LINEAR, &rc);
  if (s || rc != CL_INVALID_VALUE) return FAILED("an unknown addressing mode gave %d", rc);
  clReleaseMemObject(m);
  return 0;
}

/* A device without images (CL_DEVICE_IMAGE_SUPPORT false) refuses them with the
 * standard's CL_INVALID_OPERATION and lists no formats. Fails on a device with images. */
static int images_refused(void) {
  cl_bool images = CL_TRUE;
  CHECK(clGetDeviceInfo(device, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL));
  if (images) return FAILED("the device has images");
  cl_int rc;
  cl_image_format f = {CL_RGBA, CL_FLOAT};
  cl_image_desc d = {0};
  d.image_type = CL_MEM_OBJECT_IMAGE2D;
  d.image_width = d.image_height = 4;
  cl_mem m = clCreateImage(context, CL_MEM_READ_WRITE, &f, &d, NULL, &rc);
  if (m || rc != CL_INVALID_OPERATION) return FAILED("clCreateImage gave %d", rc);
  cl_sampler s = clCreateSampler(context, CL_FALSE, CL_ADDRESS_CLAMP, CL_FILTER_NEAREST, &rc);
  if (s || rc != CL_INVALID_OPERATION) return FAILED("clCreateSampler gave %d", rc);
  cl_uint n = 99;
  CHECK(clGetSupportedImageFormats(context, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D, 0, NULL, &n));
  if (n != 0) return FAILED("%u formats listed", n);
  return 0;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct check {
  const char* name;
  int (*run)(void);
};
static const struct check checks[] = {
    {"big_one_buffer", big_one_buffer},
    {"big_many_buffers", big_many_buffers},
    {"required_size_one", required_size_one},
    {"work_dimensions", work_dimensions},
    {"task", task},
    {"large_arguments", large_arguments},
    {"mem_flags", mem_flags},
    {"destructor_callback", destructor_callback},
    {"error_codes", error_codes},
    {"image_macro_matches", image_macro_matches},
    {"double_precision", double_precision},
    {"card_timestamps", card_timestamps},
    {"compile_and_link", compile_and_link},
    {"compile_bad_input", compile_bad_input},
    {"images_2d", images_2d},
    {"images_3d_and_arrays", images_3d_and_arrays},
    {"image_of_a_buffer", image_of_a_buffer},
    {"image_bad_input", image_bad_input},
    {"images_refused", images_refused}, /* for a device without images: skipped otherwise */
};

int main(int argc, char** argv) {
  const char* only = NULL;
  const char* skip[16];
  int skips = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--help") == 0) {
      printf("usage: ocl_conformance [--big-mib N] [--only NAME] [--skip NAME]... [--list]\n"
             "Checks points of the OpenCL standard through the platform named $RACCEL_TEST_PLATFORM\n"
             "(default raccel); prints ok/FAIL per check and 'N passed, N failed'.\n");
      return 0;
    }
    if (strcmp(argv[i], "--list") == 0) {
      for (size_t c = 0; c < sizeof checks / sizeof *checks; ++c) printf("%s\n", checks[c].name);
      return 0;
    }
    if (strcmp(argv[i], "--big-mib") == 0 && i + 1 < argc) {
      big_mib = strtoul(argv[++i], NULL, 10);
      if (big_mib < 16) big_mib = 16;
    } else if (strcmp(argv[i], "--skip") == 0 && i + 1 < argc && skips < 16) {
      skip[skips++] = argv[++i];
    } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      printf("ocl_conformance: unknown argument %s (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (open_platform()) return 2;
  int passed = 0, failed = 0;
  for (size_t c = 0; c < sizeof checks / sizeof *checks; ++c) {
    if (only && strcmp(only, checks[c].name) != 0) continue;
    int skipped = 0;
    for (int k = 0; k < skips; ++k) skipped |= strcmp(skip[k], checks[c].name) == 0;
    if (skipped) {
      printf("skip %s\n", checks[c].name);
      continue;
    }
    why[0] = 0;
    double started = now_ms();
    if (checks[c].run()) {
      printf("FAIL %s: %s (%.0f ms)\n", checks[c].name, why, now_ms() - started);
      ++failed;
      clFinish(queue); /* what a failed check left queued does not spill into the next */
    } else {
      printf("ok   %s (%.0f ms)\n", checks[c].name, now_ms() - started);
      ++passed;
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed\n", passed, failed);
  clReleaseCommandQueue(queue);
  clReleaseContext(context);
  return failed ? 1 : 0;
}
