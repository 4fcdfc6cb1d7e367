#include "hal/opencl/opencl_images.h"

#include <algorithm>

namespace raccel::hal {
namespace {

template <class T>
T value(cl_device_id d, cl_device_info what) {
  T v{};
  clGetDeviceInfo(d, what, sizeof v, &v, nullptr);
  return v;
}

uint64_t dimension(cl_device_id d, cl_device_info what) {
  return std::min<uint64_t>(value<size_t>(d, what), image::kMaxDimension);
}

std::vector<uint32_t> formatsOf(cl_context context, cl_mem_object_type type) {
  cl_uint n = 0;
  if (clGetSupportedImageFormats(context, CL_MEM_READ_WRITE, type, 0, nullptr, &n) != CL_SUCCESS) return {};
  std::vector<cl_image_format> formats(n);
  if (n && clGetSupportedImageFormats(context, CL_MEM_READ_WRITE, type, n, formats.data(), nullptr) != CL_SUCCESS) return {};
  std::vector<uint32_t> keys;
  for (auto& f : formats)
    if (pixelBytes(f.image_channel_order, f.image_channel_data_type) && keys.size() < image::kMaxFormats)
      keys.push_back(formatKey(f.image_channel_order, f.image_channel_data_type));
  return keys;
}

// Where pixel (0, 0, 0) and the image's far corner are, as OpenCL's copies take them.
void regionOf(const ImageDesc& desc, size_t origin[3], size_t region[3]) {
  auto r = imageRegion(desc);
  for (int i = 0; i < 3; ++i) origin[i] = 0, region[i] = static_cast<size_t>(r[i]);
}

}  // namespace

ImageLimits imageLimitsOf(cl_device_id d, cl_context context) {
  ImageLimits l;
  if (!value<cl_bool>(d, CL_DEVICE_IMAGE_SUPPORT)) return l;
  l.max2dWidth = dimension(d, CL_DEVICE_IMAGE2D_MAX_WIDTH);
  l.max2dHeight = dimension(d, CL_DEVICE_IMAGE2D_MAX_HEIGHT);
  l.max3dWidth = dimension(d, CL_DEVICE_IMAGE3D_MAX_WIDTH);
  l.max3dHeight = dimension(d, CL_DEVICE_IMAGE3D_MAX_HEIGHT);
  l.max3dDepth = dimension(d, CL_DEVICE_IMAGE3D_MAX_DEPTH);
  l.maxArraySize = dimension(d, CL_DEVICE_IMAGE_MAX_ARRAY_SIZE);
  l.maxBufferPixels = dimension(d, CL_DEVICE_IMAGE_MAX_BUFFER_SIZE);
  l.maxReadArgs = value<cl_uint>(d, CL_DEVICE_MAX_READ_IMAGE_ARGS);
  l.maxWriteArgs = value<cl_uint>(d, CL_DEVICE_MAX_WRITE_IMAGE_ARGS);
  l.maxSamplers = value<cl_uint>(d, CL_DEVICE_MAX_SAMPLERS);
  // The formats a read-write image of two and of three dimensions both take.
  l.formats = formatsOf(context, CL_MEM_OBJECT_IMAGE2D);
  auto in3d = formatsOf(context, CL_MEM_OBJECT_IMAGE3D);
  std::erase_if(l.formats, [&](uint32_t key) { return std::find(in3d.begin(), in3d.end(), key) == in3d.end(); });
  if (!l.supported()) l = {};
  return l;
}

LaunchObjects::~LaunchObjects() {
  for (auto& m : images_) clReleaseMemObject(m.image);
  for (cl_mem m : subs_) clReleaseMemObject(m);
  for (cl_sampler s : samplers_) clReleaseSampler(s);
}

cl_int LaunchObjects::subBuffer(cl_mem buffer, uint64_t offset, uint64_t size, cl_mem* out) {
  cl_buffer_region region{offset, size};
  cl_int rc = CL_SUCCESS;
  *out = clCreateSubBuffer(buffer, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &rc);
  if (rc == CL_SUCCESS) subs_.push_back(*out);
  return rc;
}

cl_int LaunchObjects::image(cl_mem buffer, uint64_t offset, const ImageDesc& desc, bool written, cl_mem* out) {
  const cl_image_format format{desc.channelOrder, desc.channelType};
  cl_image_desc d{};
  d.image_type = desc.type;
  d.image_width = desc.width;
  d.image_height = desc.height;
  d.image_depth = desc.depth;
  d.image_array_size = desc.arraySize;
  cl_int rc = CL_SUCCESS;
  if (desc.type == image::kImage1dBuffer) {  // a view of the buffer itself
    cl_mem view = buffer;
    if (offset && (rc = subBuffer(buffer, offset, imageBytes(desc), &view)) != CL_SUCCESS) return rc;
    d.buffer = view;
    *out = clCreateImage(context_, CL_MEM_READ_WRITE, &format, &d, nullptr, &rc);
    if (rc == CL_SUCCESS) images_.push_back({*out, buffer, offset, desc, false});
    return rc;
  }
  *out = clCreateImage(context_, CL_MEM_READ_WRITE, &format, &d, nullptr, &rc);
  if (rc != CL_SUCCESS) return rc;
  images_.push_back({*out, buffer, offset, desc, written});
  size_t origin[3], region[3];
  regionOf(desc, origin, region);
  return clEnqueueCopyBufferToImage(queue_, buffer, *out, offset, origin, region, 0, nullptr, nullptr);
}

cl_int LaunchObjects::sampler(uint32_t word, cl_sampler* out) {
  auto bits = decodeSampler(word);
  if (!bits) return CL_INVALID_SAMPLER;
  cl_int rc = CL_SUCCESS;
  const cl_sampler_properties props[] = {CL_SAMPLER_NORMALIZED_COORDS, bits->normalized, CL_SAMPLER_ADDRESSING_MODE,
                                         bits->addressing, CL_SAMPLER_FILTER_MODE, bits->filter, 0};
  *out = clCreateSamplerWithProperties(context_, props, &rc);
  if (rc == CL_SUCCESS) samplers_.push_back(*out);
  return rc;
}

cl_int LaunchObjects::finish() {
  for (auto& m : images_) {
    if (!m.copyBack) continue;
    size_t origin[3], region[3];
    regionOf(m.desc, origin, region);
    if (cl_int rc = clEnqueueCopyImageToBuffer(queue_, m.image, m.buffer, origin, region, m.offset, 0, nullptr, nullptr);
        rc != CL_SUCCESS)
      return rc;
  }
  return CL_SUCCESS;
}

}  // namespace raccel::hal
