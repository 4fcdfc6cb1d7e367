// Images, samplers and sub-buffers on an OpenCL card (internal to the OpenCL backend). raccel keeps
// an image as a buffer of packed pixels (common/images.h); a launch that passes one
// gets an image made by the card's own driver for that launch, filled from the buffer
// before the kernel and, where the kernel may write it, copied back after. A 1D image of
// a buffer is a view of it instead (no copies). The images and samplers live until the
// commands that use them complete (OpenCL keeps what its queued commands use).
#pragma once

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <vector>

#include "common/error.h"
#include "common/images_cl.h"

namespace raccel::hal {

// The device's image limits and its read-write formats that raccel knows (none when it
// has no image support).
ImageLimits imageLimitsOf(cl_device_id device, cl_context context);

// The objects one launch makes for its arguments: sub-buffers (a buffer from an
// offset on), images and samplers. Made before the kernel is enqueued; finish() after
// it enqueues the copies back; the destructor lets go of every object.
class LaunchObjects {
 public:
  LaunchObjects(cl_context context, cl_command_queue queue) : context_(context), queue_(queue) {}
  ~LaunchObjects();
  LaunchObjects(const LaunchObjects&) = delete;
  LaunchObjects& operator=(const LaunchObjects&) = delete;

  cl_int subBuffer(cl_mem buffer, uint64_t offset, uint64_t size, cl_mem* out);
  // An image of `buffer`'s pixels from `offset` on, filled from them; `written`: the
  // kernel may write it, so finish() copies it back. The OpenCL error on failure.
  cl_int image(cl_mem buffer, uint64_t offset, const ImageDesc& desc, bool written, cl_mem* out);
  cl_int sampler(uint32_t word, cl_sampler* out);
  // Enqueues the copies of written images back into their buffers.
  cl_int finish();
  bool empty() const { return images_.empty() && subs_.empty() && samplers_.empty(); }

 private:
  struct Made {
    cl_mem image;
    cl_mem buffer;
    uint64_t offset;
    ImageDesc desc;
    bool copyBack;
  };
  cl_context context_;
  cl_command_queue queue_;
  std::vector<Made> images_;
  std::vector<cl_mem> subs_;
  std::vector<cl_sampler> samplers_;
};

}  // namespace raccel::hal
