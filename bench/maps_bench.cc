// raccel-maps-bench: an optimizer's step over a small model's parameters on the first
// OpenCL device, as the netaccel's card worker issues it (plugged: Device::plug), with
// small maps gathered into runs (hal/flat_run.h) beside the same step with one kernel a
// map, in one run. The step is SGD with Nesterov momentum and weight decay, five maps a
// tensor, over the tensors of tests/torch/cnn_train.py's model (10 tensors, 1,508
// elements): 50 maps.
//   maps_step_us_p50        a step (the maps, then finish), median microseconds
//   maps_launches_per_step  kernels the step starts
// and the largest difference between the two devices' parameters afterwards (0 where the
// run's vector arithmetic and the single kernels' agree to the bit).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/flags.h"
#include "hal/backends.h"
#include "hal/device.h"
#include "hal/tensor.h"

namespace {

using raccel::hal::Buffer;
using raccel::hal::Device;
using raccel::hal::TensorFn;
using raccel::hal::TensorOp;

constexpr uint64_t kTensors[] = {216, 8, 8, 8, 1152, 16, 16, 16, 64, 4};

struct Figures {
  double stepUsP50 = -1;
  double launchesPerStep = -1;
  std::vector<float> params;
  std::string problem;
};

// A flat map over n elements at the given element offsets of one buffer.
TensorOp map(TensorFn fn, Buffer& b, uint64_t n, std::initializer_list<uint64_t> offsets, float alpha = 1, float beta = 0) {
  TensorOp op;
  op.fn = fn;
  op.dims = 1;
  op.shape[0] = n;
  op.alpha = alpha, op.beta = beta;
  unsigned i = 0;
  for (uint64_t at : offsets) op.operands[i++] = {&b, at, {1}, raccel::hal::TensorType::f32};
  for (; i < raccel::hal::kMaxTensorOperands; ++i) op.operands[i] = op.operands[0];
  return op;
}

Figures measure(bool runs, int steps) {
  Figures f;
  raccel::hal::DeviceOverrides o;
  o.tflops = 1;  // no calibration run
  o.mapsOneByOne = !runs;
  auto device = raccel::hal::openDevice("opencl", 0, o);
  if (!device) return f.problem = device.error().message, f;
  Device& d = **device;
  uint64_t total = 0;
  for (uint64_t n : kTensors) total += n;
  // Four arrays of `total`: parameters, gradients, momentum buffers, a scratch.
  auto buffer = d.allocate(4 * total * sizeof(float));
  if (!buffer) return f.problem = buffer.error().message, f;
  Buffer& b = **buffer;
  std::vector<float> init(4 * total);
  for (size_t i = 0; i < init.size(); ++i) init[i] = std::sin(float(i)) * 0.5f;
  if (auto s = d.write(b, 0, std::as_bytes(std::span(init))); !s) return f.problem = s.error().message, f;
  const uint64_t P = 0, G = total, M = 2 * total, T = 3 * total;
  std::vector<double> us;
  std::vector<raccel::hal::KernelTime> done;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    d.plug();
    uint64_t at = 0;
    for (uint64_t n : kTensors) {
      for (const TensorOp& op : {map(TensorFn::add, b, n, {T + at, G + at, P + at}, 1e-4f),
                                 map(TensorFn::affine, b, n, {M + at, M + at}, 0.9f, 0),
                                 map(TensorFn::add, b, n, {M + at, M + at, T + at}, 1),
                                 map(TensorFn::add, b, n, {T + at, T + at, M + at}, 0.9f),
                                 map(TensorFn::add, b, n, {P + at, P + at, T + at}, -0.05f)})
        if (auto s = d.tensor(op); !s) return f.problem = s.error().message, f;
      at += n;
    }
    d.unplug();
    if (auto s = d.finish(); !s) return f.problem = s.error().message, f;
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    done.clear();
    d.takeCompleted(done);
  }
  std::sort(us.begin(), us.end());
  f.stepUsP50 = us[us.size() / 2];
  f.launchesPerStep = double(d.launches()) / steps;
  f.params.resize(total);
  if (auto s = d.read(b, 0, std::as_writable_bytes(std::span(f.params))); !s) return f.problem = s.error().message, f;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  raccel::Flags flags("raccel-maps-bench",
                      "An SGD step over a small model's parameters (50 small maps) on the first OpenCL device, with "
                      "small maps run together (hal/flat_run.h) beside one kernel a map, in one run.");
  flags.boolean("quick", "fewer steps (a smoke test)");
  flags.boolean("json", "print the figures as one JSON object");
  int code = 0;
  if (!raccel::parseFlagsOrExit(flags, argc, argv, &code)) return code;
  const int steps = flags.has("quick") ? 50 : 2000;
  std::fprintf(stderr, "raccel-maps-bench: %d steps of 50 maps, runs then one by one...\n", steps);
  Figures runs = measure(true, steps), single = measure(false, steps);
  for (auto* f : {&runs, &single})
    if (!f->problem.empty()) {
      std::fprintf(stderr, "raccel-maps-bench: %s\n", f->problem.c_str());
      return 1;
    }
  float diff = 0;
  for (size_t i = 0; i < runs.params.size(); ++i) diff = std::max(diff, std::fabs(runs.params[i] - single.params[i]));
  const double speedup = runs.stepUsP50 > 0 ? single.stepUsP50 / runs.stepUsP50 : -1;
  if (flags.has("json")) {
    std::printf("{\"maps_step_us_p50\":%.1f,\"maps_step_us_p50_one_by_one\":%.1f,\"maps_speedup\":%.2f,"
                "\"maps_launches_per_step\":%.1f,\"maps_launches_per_step_one_by_one\":%.1f,\"maps_max_difference\":%g}\n",
                runs.stepUsP50, single.stepUsP50, speedup, runs.launchesPerStep, single.launchesPerStep, diff);
  } else {
    std::printf("maps_step_us_p50        runs %8.1f   one by one %8.1f   (%.2fx)\n", runs.stepUsP50, single.stepUsP50,
                speedup);
    std::printf("maps_launches_per_step  runs %8.1f   one by one %8.1f\n", runs.launchesPerStep, single.launchesPerStep);
    std::printf("maps_max_difference     %g (the parameters after %d steps)\n", diff, steps);
  }
  return 0;
}
