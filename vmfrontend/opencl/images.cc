// Images and samplers of libraccel-opencl. An image is a raccel buffer of packed pixels
// (common/images.h): rows of width x pixel bytes, then the rows of the next slice or
// array layer. Reads, writes, copies, fills and maps of an image region are the buffer
// rectangles they cover (api.cc); a kernel argument that is an image carries its
// descriptor, and the card makes the image with its own driver for the launch. A 1D
// image of a buffer is that buffer's memory. Samplers are three values, sent as a word.
//
// The device offers images where every card that runs OpenCL C for the vaccel does
// (openclFeatures().images); otherwise image calls answer CL_INVALID_OPERATION.
#include <cstring>

#include "common/images_cl.h"
#include "common/limits.h"
#include "vmfrontend/opencl/objects.h"

namespace raccel::opencl {

bool imagesSupported() { return probeDevice() && openclFeatures().images.supported(); }

cl_int imageArg(cl_context c, size_t size, const void* value, _cl_kernel::ArgValue& a) {
  if (size != sizeof(cl_mem)) return CL_INVALID_ARG_SIZE;
  if (!value || !*static_cast<const cl_mem*>(value)) return CL_INVALID_ARG_VALUE;
  cl_mem m = *static_cast<const cl_mem*>(value);
  if (!valid(m) || !m->image || m->context != c) return CL_INVALID_MEM_OBJECT;
  a.mem = m;
  a.memSerial = m->serial;
  a.arg = client::Arg::imageOf(m->handle, m->origin, *m->image);
  return CL_SUCCESS;
}

cl_int samplerArg(cl_context c, size_t size, const void* value, _cl_kernel::ArgValue& a) {
  if (size != sizeof(cl_sampler)) return CL_INVALID_ARG_SIZE;
  cl_sampler s = value ? *static_cast<const cl_sampler*>(value) : nullptr;
  if (!valid(s) || s->context != c) return CL_INVALID_SAMPLER;
  a.arg = client::Arg::sampler(encodeSampler(s->normalized, s->addressing, s->filter));
  return CL_SUCCESS;
}

namespace {

// The descriptor raccel carries: the sizes the type uses, the others 0.
ImageDesc descOf(const cl_image_desc& d, const cl_image_format& f) {
  ImageDesc out{static_cast<uint32_t>(d.image_type), f.image_channel_order, f.image_channel_data_type, 0, d.image_width, 0, 0, 0};
  if (imageHasHeight(out.type)) out.height = d.image_height;
  if (out.type == CL_MEM_OBJECT_IMAGE3D) out.depth = d.image_depth;
  if (imageIsArray(out.type)) out.arraySize = d.image_array_size;
  return out;
}

size_t rowBytes(cl_mem m) { return m->image->width * m->pixelBytes; }
// Bytes from one slice (or layer of an array) to the next: a 1D array's layers are rows.
size_t sliceBytes(cl_mem m) { return rowBytes(m) * imageRegion(*m->image)[1]; }

// CL_IMAGE_SLICE_PITCH: a 3D image's slices, a 2D array's layers, a 1D array's layers
// (its rows); 0 for the others.
size_t layerPitch(cl_mem m) {
  const uint32_t type = m->image->type;
  if (type == CL_MEM_OBJECT_IMAGE1D_ARRAY) return rowBytes(m);
  return type == CL_MEM_OBJECT_IMAGE3D || type == CL_MEM_OBJECT_IMAGE2D_ARRAY ? sliceBytes(m) : 0;
}

// The host's pitches for an image of `desc` (0: packed): checked as clCreateImage and
// the read and write calls check them.
cl_int hostPitches(const ImageDesc& d, size_t pixel, size_t& rowPitch, size_t& slicePitch) {
  const size_t packedRow = d.width * pixel;
  if (rowPitch == 0) rowPitch = packedRow;
  if (rowPitch < packedRow || rowPitch % pixel) return CL_INVALID_IMAGE_DESCRIPTOR;
  // (A 1D array's slice pitch spaces its layers, each one row.)
  const size_t slice = limits::satMul(rowPitch, imageHasHeight(d.type) ? d.height : 1);
  if (slicePitch == 0) slicePitch = slice;
  if (slicePitch < slice || slicePitch % rowPitch) return CL_INVALID_IMAGE_DESCRIPTOR;
  // Pitches whose span does not fit the address space describe no host memory.
  const uint64_t layers = d.type == image::kImage3d ? d.depth : (imageIsArray(d.type) ? d.arraySize : 1);
  if (limits::satMul(slicePitch, layers) == UINT64_MAX) return CL_INVALID_IMAGE_DESCRIPTOR;
  return CL_SUCCESS;
}

// The host's copy of the image, sent row by row where its pitches are not packed.
void writeHostImage(cl_context c, cl_mem m, const void* host, size_t rowPitch, size_t slicePitch) {
  const ImageDesc& d = *m->image;
  const size_t row = rowBytes(m);
  auto r = imageRegion(d);
  // A 1D array's layers are its rows here; the host spaces them by the slice pitch.
  const size_t hostRow = d.type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? slicePitch : rowPitch;
  if (hostRow == row && (r[2] == 1 || slicePitch == row * r[1])) {
    c->session->write(m->handle, m->origin, std::span(static_cast<const std::byte*>(host), m->size));
    return;
  }
  for (size_t z = 0; z < r[2]; ++z)
    for (size_t y = 0; y < r[1]; ++y)
      c->session->write(m->handle, m->origin + (z * r[1] + y) * row,
                        std::span(static_cast<const std::byte*>(host) + z * slicePitch + y * hostRow, row));
}

// The buffer an image of a buffer is made from (CL_MEM_OBJECT_IMAGE1D_BUFFER).
cl_int bufferOfImage(cl_context c, const cl_image_desc& desc, uint64_t bytes, const void* host, cl_mem* out) {
  cl_mem b = desc.buffer;
  if (!valid(b) || b->image || b->context != c) return CL_INVALID_IMAGE_DESCRIPTOR;
  if (host) return CL_INVALID_HOST_PTR;
  if (bytes > b->size) return CL_INVALID_IMAGE_SIZE;
  *out = b;
  return CL_SUCCESS;
}

// Every check clCreateImage makes, in the standard's order of errors, before anything
// is made: the descriptor raccel carries and its pixel size on success.
cl_int checkCreate(cl_context c, cl_mem_flags& flags, const cl_image_format* format, const cl_image_desc* desc,
                   const void* host, ImageDesc& d, size_t& pixel) {
  if (!valid(c)) return CL_INVALID_CONTEXT;
  if (cl_int rc = checkMemFlags(flags, host); rc != CL_SUCCESS) return rc;
  if (!format) return CL_INVALID_IMAGE_FORMAT_DESCRIPTOR;
  if (!desc || desc->image_type < CL_MEM_OBJECT_IMAGE2D || desc->image_type > CL_MEM_OBJECT_IMAGE1D_BUFFER ||
      desc->num_mip_levels || desc->num_samples)
    return CL_INVALID_IMAGE_DESCRIPTOR;
  pixel = pixelBytes(format->image_channel_order, format->image_channel_data_type);
  if (pixel == 0) return CL_INVALID_IMAGE_FORMAT_DESCRIPTOR;
  d = descOf(*desc, *format);
  if (d.width == 0 || (imageHasHeight(d.type) && d.height == 0) || (d.type == CL_MEM_OBJECT_IMAGE3D && d.depth == 0) ||
      (imageIsArray(d.type) && d.arraySize == 0))
    return CL_INVALID_IMAGE_DESCRIPTOR;
  if (!host && (desc->image_row_pitch || desc->image_slice_pitch)) return CL_INVALID_IMAGE_DESCRIPTOR;
  if (!imagesSupported()) return CL_INVALID_OPERATION;
  if (auto s = checkImage(d, openclFeatures().images); !s)
    return s.error().code == Code::unimplemented ? CL_IMAGE_FORMAT_NOT_SUPPORTED : CL_INVALID_IMAGE_SIZE;
  if (imageBytes(d) > maxAllocBytes()) return CL_INVALID_IMAGE_SIZE;
  if (host) {
    size_t row = desc->image_row_pitch, slice = desc->image_slice_pitch;
    if (cl_int rc = hostPitches(d, pixel, row, slice); rc != CL_SUCCESS) return rc;
  }
  return CL_SUCCESS;
}

cl_mem createImageLocked(cl_context c, cl_mem_flags flags, const cl_image_format* format, const cl_image_desc* desc,
                         void* host, cl_int* err) {
  ImageDesc d;
  size_t pixel = 0;
  if (cl_int rc = checkCreate(c, flags, format, desc, host, d, pixel); rc != CL_SUCCESS) return failWith<_cl_mem>(err, rc);
  const uint64_t bytes = imageBytes(d);
  cl_mem of = nullptr;
  if (d.type == CL_MEM_OBJECT_IMAGE1D_BUFFER)
    if (cl_int rc = bufferOfImage(c, *desc, bytes, host, &of); rc != CL_SUCCESS) return failWith<_cl_mem>(err, rc);
  if (c->lost) return failWith<_cl_mem>(err, CL_OUT_OF_RESOURCES);
  cl_mem m = newMem(c, flags, bytes);
  m->image = d;
  m->format = *format;
  m->pixelBytes = pixel;
  if (of) {
    m->parent = of;
    of->refs++;
    m->handle = of->handle;
    m->origin = of->origin;
    m->hostPtr = of->hostPtr;
  } else {
    m->handle = c->session->alloc(bytes);
  }
  if (host) {
    size_t row = desc->image_row_pitch, slice = desc->image_slice_pitch, packedRow = 0, packedSlice = 0;
    hostPitches(d, pixel, row, slice);
    hostPitches(d, pixel, packedRow, packedSlice);
    // Maps of a USE_HOST_PTR image use the host's memory where it is laid out as ours.
    if ((flags & CL_MEM_USE_HOST_PTR) && row == packedRow && slice == packedSlice) m->hostPtr = host;
    writeHostImage(c, m, host, row, slice);
  }
  if (err) *err = CL_SUCCESS;
  return m;
}

cl_mem CL_API_CALL createImage(cl_context c, cl_mem_flags flags, const cl_image_format* format, const cl_image_desc* desc,
                               void* host, cl_int* err) {
  Lock lock(apiLock());
  return createImageLocked(c, flags, format, desc, host, err);
}

cl_mem CL_API_CALL createImage2D(cl_context c, cl_mem_flags flags, const cl_image_format* format, size_t width,
                                 size_t height, size_t rowPitch, void* host, cl_int* err) {
  Lock lock(apiLock());
  cl_image_desc d{};
  d.image_type = CL_MEM_OBJECT_IMAGE2D;
  d.image_width = width;
  d.image_height = height;
  d.image_row_pitch = rowPitch;
  return createImageLocked(c, flags, format, &d, host, err);
}

cl_mem CL_API_CALL createImage3D(cl_context c, cl_mem_flags flags, const cl_image_format* format, size_t width,
                                 size_t height, size_t depth, size_t rowPitch, size_t slicePitch, void* host, cl_int* err) {
  Lock lock(apiLock());
  cl_image_desc d{};
  d.image_type = CL_MEM_OBJECT_IMAGE3D;
  d.image_width = width;
  d.image_height = height;
  d.image_depth = depth;
  d.image_row_pitch = rowPitch;
  d.image_slice_pitch = slicePitch;
  return createImageLocked(c, flags, format, &d, host, err);
}

cl_int CL_API_CALL getImageInfo(cl_mem m, cl_image_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(m) || !m->image) return CL_INVALID_MEM_OBJECT;
  const ImageDesc& d = *m->image;
  auto sz = [&](size_t v) { return setValue(v, size, out, ret); };
  switch (what) {
    case CL_IMAGE_FORMAT: return setValue(m->format, size, out, ret);
    case CL_IMAGE_ELEMENT_SIZE: return sz(m->pixelBytes);
    case CL_IMAGE_ROW_PITCH: return sz(rowBytes(m));
    case CL_IMAGE_SLICE_PITCH: return sz(layerPitch(m));
    case CL_IMAGE_WIDTH: return sz(d.width);
    case CL_IMAGE_HEIGHT: return sz(d.height);
    case CL_IMAGE_DEPTH: return sz(d.depth);
    case CL_IMAGE_ARRAY_SIZE: return sz(d.arraySize);
    case CL_IMAGE_BUFFER: return setValue(d.type == CL_MEM_OBJECT_IMAGE1D_BUFFER ? m->parent : cl_mem{nullptr}, size, out, ret);
    case CL_IMAGE_NUM_MIP_LEVELS: case CL_IMAGE_NUM_SAMPLES: return setValue(cl_uint{0}, size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL getSupportedImageFormats(cl_context c, cl_mem_flags flags, cl_mem_object_type type, cl_uint n,
                                            cl_image_format* out, cl_uint* count) {
  Lock lock(apiLock());
  if (!valid(c)) return CL_INVALID_CONTEXT;
  if (checkMemFlags(flags, nullptr) == CL_INVALID_VALUE || type < CL_MEM_OBJECT_IMAGE2D ||
      type > CL_MEM_OBJECT_IMAGE1D_BUFFER || (n == 0 && out))
    return CL_INVALID_VALUE;
  const auto& formats = imagesSupported() ? openclFeatures().images.formats : std::vector<uint32_t>{};
  for (size_t i = 0; out && i < formats.size() && i < n; ++i)
    out[i] = cl_image_format{orderOf(formats[i]), channelTypeOf(formats[i])};
  if (count) *count = static_cast<cl_uint>(formats.size());
  return CL_SUCCESS;
}

// An image region (origin and region in pixels, as the standard gives them) as the
// buffer rectangle it covers: CL_INVALID_VALUE where it leaves the image or uses a
// dimension the image does not have.
cl_int imageRect(cl_mem m, const size_t* origin, const size_t* region, Rect& r) {
  if (!origin || !region) return CL_INVALID_VALUE;
  const auto extent = imageRegion(*m->image);
  for (int i = 0; i < 3; ++i)
    if (region[i] == 0 || origin[i] > extent[i] || region[i] > extent[i] - origin[i]) return CL_INVALID_VALUE;
  const size_t pixel = m->pixelBytes;
  const size_t o[3] = {origin[0] * pixel, origin[1], origin[2]}, g[3] = {region[0] * pixel, region[1], region[2]};
  return makeRect(o, g, rowBytes(m), sliceBytes(m), r);
}

// The host's side of a read or write: its pitches (0: packed), a 1D array's layers
// spaced by the slice pitch.
cl_int hostRect(cl_mem m, const size_t* region, size_t rowPitch, size_t slicePitch, Rect& h) {
  const size_t zero[3] = {0, 0, 0}, bytes[3] = {region[0] * m->pixelBytes, region[1], region[2]};
  if (m->image->type == CL_MEM_OBJECT_IMAGE1D_ARRAY) rowPitch = slicePitch, slicePitch = 0;
  return makeRect(zero, bytes, rowPitch, slicePitch, h);
}

cl_int checkQueueImage(cl_command_queue q, cl_mem m) {
  if (cl_int rc = checkQueueMem(q, m, true); rc != CL_SUCCESS) return rc;
  return m->image ? CL_SUCCESS : CL_INVALID_MEM_OBJECT;
}

// A read's or write's image (b) and host (h) rectangles, checked.
cl_int transferRects(cl_command_queue q, cl_mem m, const void* host, const size_t* origin, const size_t* region,
                     size_t rowPitch, size_t slicePitch, Rect& b, Rect& h) {
  if (cl_int rc = checkQueueImage(q, m); rc != CL_SUCCESS) return rc;
  if (!host || imageRect(m, origin, region, b) || hostRect(m, region, rowPitch, slicePitch, h)) return CL_INVALID_VALUE;
  return CL_SUCCESS;
}

cl_int CL_API_CALL enqueueReadImage(cl_command_queue q, cl_mem m, cl_bool blocking, const size_t* origin,
                                    const size_t* region, size_t rowPitch, size_t slicePitch, void* out, cl_uint nWait,
                                    const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  Rect b, h;
  if (cl_int rc = transferRects(q, m, out, origin, region, rowPitch, slicePitch, b, h); rc != CL_SUCCESS) return rc;
  return enqueueReadRect(q, m, blocking, b, h, out, nWait, wait, event, CL_COMMAND_READ_IMAGE);
}

cl_int CL_API_CALL enqueueWriteImage(cl_command_queue q, cl_mem m, cl_bool blocking, const size_t* origin,
                                     const size_t* region, size_t rowPitch, size_t slicePitch, const void* in,
                                     cl_uint nWait, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  Rect b, h;
  if (cl_int rc = transferRects(q, m, in, origin, region, rowPitch, slicePitch, b, h); rc != CL_SUCCESS) return rc;
  return enqueueWriteRect(q, m, blocking, b, h, in, nWait, wait, event, CL_COMMAND_WRITE_IMAGE);
}

cl_int CL_API_CALL enqueueCopyImage(cl_command_queue q, cl_mem src, cl_mem dst, const size_t* srcOrigin,
                                    const size_t* dstOrigin, const size_t* region, cl_uint nWait, const cl_event* wait,
                                    cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueImage(q, src); rc != CL_SUCCESS) return rc;
  if (cl_int rc = checkQueueImage(q, dst); rc != CL_SUCCESS) return rc;
  if (src->format.image_channel_order != dst->format.image_channel_order ||
      src->format.image_channel_data_type != dst->format.image_channel_data_type)
    return CL_IMAGE_FORMAT_MISMATCH;
  Rect s, d;
  if (imageRect(src, srcOrigin, region, s) || imageRect(dst, dstOrigin, region, d)) return CL_INVALID_VALUE;
  return enqueueCopyRect(q, src, dst, s, d, nWait, wait, event, CL_COMMAND_COPY_IMAGE);
}

// A buffer's side of a copy with an image: the region's rows packed from `offset` on.
cl_int packedRect(cl_mem image, size_t offset, const size_t* region, Rect& r) {
  const size_t o[3] = {offset, 0, 0}, g[3] = {region[0] * image->pixelBytes, region[1], region[2]};
  return makeRect(o, g, 0, 0, r);
}

cl_int CL_API_CALL enqueueCopyImageToBuffer(cl_command_queue q, cl_mem src, cl_mem dst, const size_t* srcOrigin,
                                            const size_t* region, size_t dstOffset, cl_uint nWait, const cl_event* wait,
                                            cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueImage(q, src); rc != CL_SUCCESS) return rc;
  if (cl_int rc = checkQueueMem(q, dst); rc != CL_SUCCESS) return rc;
  Rect s, d;
  if (imageRect(src, srcOrigin, region, s) || packedRect(src, dstOffset, region, d)) return CL_INVALID_VALUE;
  return enqueueCopyRect(q, src, dst, s, d, nWait, wait, event, CL_COMMAND_COPY_IMAGE_TO_BUFFER);
}

cl_int CL_API_CALL enqueueCopyBufferToImage(cl_command_queue q, cl_mem src, cl_mem dst, size_t srcOffset,
                                            const size_t* dstOrigin, const size_t* region, cl_uint nWait,
                                            const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueMem(q, src); rc != CL_SUCCESS) return rc;
  if (cl_int rc = checkQueueImage(q, dst); rc != CL_SUCCESS) return rc;
  Rect s, d;
  if (packedRect(dst, srcOffset, region, s) || imageRect(dst, dstOrigin, region, d)) return CL_INVALID_VALUE;
  return enqueueCopyRect(q, src, dst, s, d, nWait, wait, event, CL_COMMAND_COPY_BUFFER_TO_IMAGE);
}

cl_int CL_API_CALL enqueueFillImage(cl_command_queue q, cl_mem m, const void* color, const size_t* origin,
                                    const size_t* region, cl_uint nWait, const cl_event* wait, cl_event* event) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueImage(q, m); rc != CL_SUCCESS) return rc;
  Rect b;
  if (!color || imageRect(m, origin, region, b)) return CL_INVALID_VALUE;
  std::vector<std::byte> pixel(m->pixelBytes);
  if (encodePixel(m->format.image_channel_order, m->format.image_channel_data_type, color, pixel.data()) != pixel.size())
    return CL_INVALID_VALUE;
  cl_context c = q->context;
  return enqueue(q, nWait, wait, event, CL_COMMAND_FILL_IMAGE, false, [=] {
    // Whole rows of a slice are one run of bytes; whole slices, one run for all.
    const bool rows = b.region[0] == b.rowPitch, slices = rows && b.region[1] * b.rowPitch == b.slicePitch;
    if (slices) {
      fillRange(c, m, b.offsetOf(0, 0), b.slicePitch * b.region[2], pixel);
      return CL_SUCCESS;
    }
    for (size_t z = 0; z < b.region[2]; ++z) {
      if (rows) {
        fillRange(c, m, b.offsetOf(0, z), b.rowPitch * b.region[1], pixel);
        continue;
      }
      for (size_t y = 0; y < b.region[1]; ++y) fillRange(c, m, b.offsetOf(y, z), b.region[0], pixel);
    }
    return CL_SUCCESS;
  });
}

void* CL_API_CALL enqueueMapImage(cl_command_queue q, cl_mem m, cl_bool blocking, cl_map_flags flags, const size_t* origin,
                                  const size_t* region, size_t* rowPitch, size_t* slicePitch, cl_uint nWait,
                                  const cl_event* wait, cl_event* event, cl_int* err) {
  Lock lock(apiLock());
  if (cl_int rc = checkQueueImage(q, m); rc != CL_SUCCESS) return failWith<void>(err, rc);
  Rect b;
  const uint32_t type = m->image->type;
  if (!rowPitch || ((type == CL_MEM_OBJECT_IMAGE3D || imageIsArray(type)) && !slicePitch) || imageRect(m, origin, region, b))
    return failWith<void>(err, CL_INVALID_VALUE);
  // The map is the run of bytes from the region's first pixel to its last, as laid out
  // in the image; the bytes between its rows come back unchanged, so they are read too.
  const size_t first = b.offsetOf(0, 0), span = b.end() - first;
  if ((flags & CL_MAP_WRITE_INVALIDATE_REGION) && span != b.region[0] * b.region[1] * b.region[2])
    flags = CL_MAP_READ | CL_MAP_WRITE;
  void* ptr = enqueueMapRange(q, m, blocking, flags, first, span, nWait, wait, event, CL_COMMAND_MAP_IMAGE, err);
  if (ptr) {
    *rowPitch = b.rowPitch;
    if (slicePitch) *slicePitch = layerPitch(m);
  }
  return ptr;
}

// ---------------------------------------------------------------------------------
// Samplers

cl_sampler makeSampler(cl_context c, cl_bool normalized, cl_addressing_mode addressing, cl_filter_mode filter, cl_int* err) {
  if (!valid(c)) return failWith<_cl_sampler>(err, CL_INVALID_CONTEXT);
  if ((normalized != CL_TRUE && normalized != CL_FALSE) || addressing < CL_ADDRESS_NONE ||
      addressing > CL_ADDRESS_MIRRORED_REPEAT || (filter != CL_FILTER_NEAREST && filter != CL_FILTER_LINEAR))
    return failWith<_cl_sampler>(err, CL_INVALID_VALUE);
  if (!imagesSupported()) return failWith<_cl_sampler>(err, CL_INVALID_OPERATION);
  auto* s = make<_cl_sampler>();
  s->context = c;
  s->normalized = normalized;
  s->addressing = addressing;
  s->filter = filter;
  c->refs++;
  if (err) *err = CL_SUCCESS;
  return s;
}

cl_sampler CL_API_CALL createSampler(cl_context c, cl_bool normalized, cl_addressing_mode addressing, cl_filter_mode filter,
                                     cl_int* err) {
  Lock lock(apiLock());
  return makeSampler(c, normalized, addressing, filter, err);
}

cl_sampler CL_API_CALL createSamplerWithProperties(cl_context c, const cl_sampler_properties* props, cl_int* err) {
  Lock lock(apiLock());
  cl_bool normalized = CL_TRUE;
  cl_addressing_mode addressing = CL_ADDRESS_CLAMP;
  cl_filter_mode filter = CL_FILTER_NEAREST;
  for (const cl_sampler_properties* p = props; p && *p; p += 2) {
    if (p[0] == CL_SAMPLER_NORMALIZED_COORDS) normalized = static_cast<cl_bool>(p[1]);
    else if (p[0] == CL_SAMPLER_ADDRESSING_MODE) addressing = static_cast<cl_addressing_mode>(p[1]);
    else if (p[0] == CL_SAMPLER_FILTER_MODE) filter = static_cast<cl_filter_mode>(p[1]);
    else return failWith<_cl_sampler>(err, CL_INVALID_VALUE);
  }
  return makeSampler(c, normalized, addressing, filter, err);
}

cl_int CL_API_CALL retainSampler(cl_sampler s) { return retainObject(s, CL_INVALID_SAMPLER); }

cl_int CL_API_CALL releaseSampler(cl_sampler s) {
  Lock lock(apiLock());
  if (!valid(s)) return CL_INVALID_SAMPLER;
  if (--s->refs > 0) return CL_SUCCESS;
  cl_context c = s->context;
  bury(s);
  releaseContext(c);
  return CL_SUCCESS;
}

cl_int CL_API_CALL getSamplerInfo(cl_sampler s, cl_sampler_info what, size_t size, void* out, size_t* ret) {
  Lock lock(apiLock());
  if (!valid(s)) return CL_INVALID_SAMPLER;
  switch (what) {
    case CL_SAMPLER_REFERENCE_COUNT: return setValue(cl_uint(s->refs), size, out, ret);
    case CL_SAMPLER_CONTEXT: return setValue(s->context, size, out, ret);
    case CL_SAMPLER_NORMALIZED_COORDS: return setValue(s->normalized, size, out, ret);
    case CL_SAMPLER_ADDRESSING_MODE: return setValue(s->addressing, size, out, ret);
    case CL_SAMPLER_FILTER_MODE: return setValue(s->filter, size, out, ret);
    default: return CL_INVALID_VALUE;
  }
}

}  // namespace

void fillImageDispatch(cl_icd_dispatch& d) {
  d.clCreateImage = createImage;
  d.clCreateImage2D = createImage2D;
  d.clCreateImage3D = createImage3D;
  d.clGetImageInfo = getImageInfo;
  d.clGetSupportedImageFormats = getSupportedImageFormats;
  d.clEnqueueReadImage = enqueueReadImage;
  d.clEnqueueWriteImage = enqueueWriteImage;
  d.clEnqueueCopyImage = enqueueCopyImage;
  d.clEnqueueCopyImageToBuffer = enqueueCopyImageToBuffer;
  d.clEnqueueCopyBufferToImage = enqueueCopyBufferToImage;
  d.clEnqueueFillImage = enqueueFillImage;
  d.clEnqueueMapImage = enqueueMapImage;
  d.clCreateSampler = createSampler;
  d.clCreateSamplerWithProperties = createSamplerWithProperties;
  d.clRetainSampler = retainSampler;
  d.clReleaseSampler = releaseSampler;
  d.clGetSamplerInfo = getSamplerInfo;
}

}  // namespace raccel::opencl
