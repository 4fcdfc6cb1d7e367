/* An ordinary OpenCL program, linked only with -lOpenCL (no raccel header or library):
 * finds the platform named "raccel" (or $RACCEL_TEST_PLATFORM), builds a kernel, runs it
 * and checks every result. Used on the host and inside the QEMU guest.
 *   ocl_smoke            run and check a saxpy kernel; "ocl_smoke: OK ..." on success
 *   ocl_smoke --abuse    bad input: a broken build (its log), wrong argument index and
 *                        size, objects released twice; each must give its CL error. A
 *                        launch the card refuses after its enqueue returned, sent with no
 *                        event among good ones: the next clFinish reports it, once
 *   ocl_smoke --until-error SECONDS   enqueue and finish in a loop until a call fails
 *                        (the scheduler went away) or time runs out; prints the error */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char* src =
    "__kernel void saxpy(__global const float* x, __global float* y, float a) {\n"
    "  size_t i = get_global_id(0); y[i] = a * x[i] + y[i];\n}\n";

#define CHECK(call)                                                           \
  do {                                                                        \
    cl_int rc_ = (call);                                                      \
    if (rc_ != CL_SUCCESS) {                                                  \
      printf("ocl_smoke: %s failed: %d (line %d)\n", #call, rc_, __LINE__);   \
      return 1;                                                               \
    }                                                                         \
  } while (0)
#define EXPECT(call, code)                                                                \
  do {                                                                                    \
    cl_int rc_ = (call);                                                                  \
    if (rc_ != (code)) {                                                                  \
      printf("ocl_smoke: %s gave %d, expected %s\n", #call, rc_, #code);                   \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

static cl_device_id device;
static cl_context context;
static cl_command_queue queue;

static int open_raccel(void) {
  const char* want = getenv("RACCEL_TEST_PLATFORM") ? getenv("RACCEL_TEST_PLATFORM") : "raccel";
  cl_platform_id platforms[16];
  cl_uint n = 0;
  CHECK(clGetPlatformIDs(16, platforms, &n));
  for (cl_uint i = 0; i < n; ++i) {
    char name[256] = "";
    clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
    if (strcmp(name, want) != 0) continue;
    CHECK(clGetDeviceIDs(platforms[i], CL_DEVICE_TYPE_ALL, 1, &device, NULL));
    cl_int rc;
    context = clCreateContext(NULL, 1, &device, NULL, NULL, &rc);
    CHECK(rc);
    queue = clCreateCommandQueue(context, device, 0, &rc);
    CHECK(rc);
    return 0;
  }
  printf("ocl_smoke: no platform named %s among %u\n", want, n);
  return 1;
}

/* The saxpy program, built, and its kernel. */
static int build_saxpy(cl_program* program, cl_kernel* k) {
  cl_int rc;
  *program = clCreateProgramWithSource(context, 1, &src, NULL, &rc);
  CHECK(rc);
  CHECK(clBuildProgram(*program, 1, &device, "", NULL, NULL));
  *k = clCreateKernel(*program, "saxpy", &rc);
  CHECK(rc);
  return 0;
}

static int run_saxpy(void) {
  enum { N = 1 << 16 };
  static float x[N], y[N], out[N];
  for (int i = 0; i < N; ++i) x[i] = (float)i, y[i] = 1.0f / (float)(i + 1);
  cl_int rc;
  cl_program program;
  cl_kernel k;
  if (build_saxpy(&program, &k)) return 1;
  cl_mem bx = clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof x, x, &rc);
  CHECK(rc);
  cl_mem by = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof y, y, &rc);
  CHECK(rc);
  float a = 2.5f;
  CHECK(clSetKernelArg(k, 0, sizeof bx, &bx));
  CHECK(clSetKernelArg(k, 1, sizeof by, &by));
  CHECK(clSetKernelArg(k, 2, sizeof a, &a));
  size_t global = N, local = 64;
  cl_event done;
  CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, &local, 0, NULL, &done));
  CHECK(clEnqueueReadBuffer(queue, by, CL_TRUE, 0, sizeof out, out, 1, &done, NULL));
  cl_int status = 1;
  CHECK(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
  for (int i = 0; i < N; ++i)
    if (fabsf(out[i] - (a * x[i] + y[i])) > 1e-3f * fabsf(out[i])) {
      printf("ocl_smoke: y[%d] = %g, expected %g\n", i, out[i], a * x[i] + y[i]);
      return 1;
    }
  if (status != CL_COMPLETE) {
    printf("ocl_smoke: the kernel's event says %d after its result was read\n", status);
    return 1;
  }
  char name[256] = "";
  clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name, name, NULL);
  printf("ocl_smoke: OK saxpy over %d floats on %s\n", N, name);
  clReleaseEvent(done);
  clReleaseMemObject(bx);
  clReleaseMemObject(by);
  clReleaseKernel(k);
  clReleaseProgram(program);
  return 0;
}

/* A kernel whose __local argument is larger than the card has: the enqueue is accepted
 * (nothing checks local memory before the card does), the card refuses it. Sent with no
 * event between good launches, its failure still reaches the next clFinish, once, and the
 * queue carries on. */
static int late_failure(void) {
  const char* src =
      "__kernel void f(__global int* x, __local int* l) {\n"
      "  l[get_local_id(0)] = 7; barrier(CLK_LOCAL_MEM_FENCE); x[get_global_id(0)] = l[0];\n}\n";
  cl_int rc;
  cl_program p = clCreateProgramWithSource(context, 1, &src, NULL, &rc);
  CHECK(rc);
  CHECK(clBuildProgram(p, 1, &device, "", NULL, NULL));
  cl_kernel k = clCreateKernel(p, "f", &rc);
  CHECK(rc);
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, 64 * sizeof(cl_int), NULL, &rc);
  CHECK(rc);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  size_t global = 64, local = 8;
  for (int round = 0; round < 3; ++round) {
    CHECK(clSetKernelArg(k, 1, local * sizeof(cl_int), NULL));
    for (int i = 0; i < 50; ++i) CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, &local, 0, NULL, NULL));
    CHECK(clSetKernelArg(k, 1, (size_t)1 << 30, NULL));
    CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, &local, 0, NULL, NULL));
    CHECK(clSetKernelArg(k, 1, local * sizeof(cl_int), NULL));
    for (int i = 0; i < 50; ++i) CHECK(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, &local, 0, NULL, NULL));
    rc = clFinish(queue);
    if (rc == CL_SUCCESS) {
      printf("ocl_smoke: a launch the card refused (round %d) was not reported by clFinish\n", round);
      return 1;
    }
    CHECK(clFinish(queue)); /* reported once */
  }
  cl_int out[64] = {0};
  CHECK(clEnqueueReadBuffer(queue, m, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
  for (int i = 0; i < 64; ++i)
    if (out[i] != 7) {
      printf("ocl_smoke: after the refused launches, out[%d] = %d, expected 7\n", i, out[i]);
      return 1;
    }
  CHECK(clReleaseMemObject(m));
  CHECK(clReleaseKernel(k));
  CHECK(clReleaseProgram(p));
  return 0;
}

static int abuse(void) {
  cl_int rc;
  const char* bad = "__kernel void f(__global int* x) { x[0] = no_such_name; }";
  cl_program broken = clCreateProgramWithSource(context, 1, &bad, NULL, &rc);
  CHECK(rc);
  EXPECT(clBuildProgram(broken, 1, &device, "", NULL, NULL), CL_BUILD_PROGRAM_FAILURE);
  char log[8192] = "";
  CHECK(clGetProgramBuildInfo(broken, device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL));
  if (!strstr(log, "no_such_name")) {
    printf("ocl_smoke: the build log does not name the error: %s\n", log);
    return 1;
  }
  cl_program program;
  cl_kernel k;
  if (build_saxpy(&program, &k)) return 1;
  float a = 1;
  double wide = 1;
  EXPECT(clSetKernelArg(k, 7, sizeof a, &a), CL_INVALID_ARG_INDEX);
  EXPECT(clSetKernelArg(k, 2, sizeof wide, &wide), CL_INVALID_ARG_SIZE);
  size_t global = 64;
  EXPECT(clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, NULL), CL_INVALID_KERNEL_ARGS);
  cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, 1024, NULL, &rc);
  CHECK(rc);
  CHECK(clReleaseMemObject(m));
  EXPECT(clReleaseMemObject(m), CL_INVALID_MEM_OBJECT);
  CHECK(clReleaseKernel(k));
  EXPECT(clReleaseKernel(k), CL_INVALID_KERNEL);
  CHECK(clReleaseProgram(program));
  EXPECT(clReleaseProgram(program), CL_INVALID_PROGRAM);
  CHECK(clReleaseProgram(broken));
  cl_event user = clCreateUserEvent(context, &rc);
  CHECK(rc);
  CHECK(clReleaseEvent(user));
  EXPECT(clReleaseEvent(user), CL_INVALID_EVENT);
  if (late_failure()) return 1;
  printf("ocl_smoke: OK bad input refused with the standard errors\n");
  return 0;
}

static int until_error(double seconds) {
  cl_int rc;
  cl_program program;
  cl_kernel k;
  if (build_saxpy(&program, &k)) return 1;
  cl_mem b = clCreateBuffer(context, CL_MEM_READ_WRITE, 4096 * 4, NULL, &rc);
  CHECK(rc);
  float a = 1;
  CHECK(clSetKernelArg(k, 0, sizeof b, &b));
  CHECK(clSetKernelArg(k, 1, sizeof b, &b));
  CHECK(clSetKernelArg(k, 2, sizeof a, &a));
  printf("ocl_smoke: running\n");
  fflush(stdout);
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  size_t global = 4096;
  for (long round = 0;; ++round) {
    for (int i = 0; i < 100; ++i) {
      rc = clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, NULL, 0, NULL, NULL);
      if (rc != CL_SUCCESS) break;
    }
    if (rc == CL_SUCCESS) rc = clFinish(queue);
    if (rc != CL_SUCCESS) {
      printf("ocl_smoke: after %ld rounds a call failed with %d\n", round, rc);
      /* Everything after the loss fails cleanly too. */
      float out[4];
      cl_int again = clEnqueueReadBuffer(queue, b, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL);
      printf("ocl_smoke: a read afterwards gives %d\n", again);
      clReleaseMemObject(b);
      clReleaseKernel(k);
      clReleaseProgram(program);
      return again == CL_SUCCESS ? 1 : 0;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9 > seconds) {
      printf("ocl_smoke: no error in %g s\n", seconds);
      return 1;
    }
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--help") == 0) {
    printf("usage: ocl_smoke [--abuse | --until-error SECONDS]\n");
    return 0;
  }
  if (open_raccel()) return 1;
  int rc;
  if (argc > 2 && strcmp(argv[1], "--until-error") == 0) rc = until_error(atof(argv[2]));
  else if (argc > 1 && strcmp(argv[1], "--abuse") == 0) rc = abuse();
  else rc = run_saxpy();
  clReleaseCommandQueue(queue);
  clReleaseContext(context);
  return rc;
}
