// OpenCL images as raccel carries them. An image is a buffer of tightly packed pixels
// (rows of width x pixel bytes, slices of rows, array layers of slices) and a descriptor
// that says how to read it: its type, its channel order and type, its sizes. The guest's
// OpenCL keeps the descriptor and sends it with each launch that passes the image; the
// card creates the image with its own driver from the buffer for that launch (and
// copies back what the kernel wrote). Buffers stay the only thing a card holds, so
// images are kept, suspended and moved like any buffer.
//
// The numbers are OpenCL's own (CL/cl.h), as the wire carries them; users of the CL
// headers check that they match (static_assert). Pure functions; any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"

namespace raccel {

namespace image {
// cl_mem_object_type
inline constexpr uint32_t kImage2d = 0x10F1, kImage3d = 0x10F2, kImage2dArray = 0x10F3, kImage1d = 0x10F4,
                          kImage1dArray = 0x10F5, kImage1dBuffer = 0x10F6;
// cl_channel_order and cl_channel_type: the first and last values raccel knows.
inline constexpr uint32_t kFirstOrder = 0x10B0, kLastOrder = 0x10C3;
inline constexpr uint32_t kFirstChannelType = 0x10D0, kLastChannelType = 0x10E0;
// cl_addressing_mode and cl_filter_mode
inline constexpr uint32_t kAddressNone = 0x1130, kAddressMirroredRepeat = 0x1134;
inline constexpr uint32_t kFilterNearest = 0x1140, kFilterLinear = 0x1141;
// What a card's list of formats may hold.
inline constexpr size_t kMaxFormats = 512;
// Any one image dimension a card may report (and a guest may ask for).
inline constexpr uint64_t kMaxDimension = 1ull << 32;
}  // namespace image

struct ImageDesc {
  uint32_t type = 0;  // image::kImage*
  uint32_t channelOrder = 0;
  uint32_t channelType = 0;
  uint32_t reserved = 0;  // zero (keeps the layout the same everywhere it is copied)
  uint64_t width = 0;
  uint64_t height = 0;     // 2D, 3D and 2D arrays; otherwise 0
  uint64_t depth = 0;      // 3D; otherwise 0
  uint64_t arraySize = 0;  // 1D and 2D arrays; otherwise 0
  bool operator==(const ImageDesc&) const = default;
};

// What a card offers for images (OpenCL's CL_DEVICE_IMAGE* limits and the formats of
// clGetSupportedImageFormats for read-write images). No image support: all zero.
struct ImageLimits {
  uint64_t max2dWidth = 0, max2dHeight = 0;
  uint64_t max3dWidth = 0, max3dHeight = 0, max3dDepth = 0;
  uint64_t maxArraySize = 0;
  uint64_t maxBufferPixels = 0;  // a 1D image made from a buffer
  uint32_t maxReadArgs = 0, maxWriteArgs = 0, maxSamplers = 0;
  std::vector<uint32_t> formats;  // formatKey(order, type), each one pixelBytes knows
  bool supported() const { return max2dWidth > 0 && !formats.empty(); }
  bool operator==(const ImageLimits&) const = default;
};

inline uint32_t formatKey(uint32_t order, uint32_t type) { return (order & 0xffff) << 16 | (type & 0xffff); }
inline uint32_t orderOf(uint32_t key) { return key >> 16; }
inline uint32_t channelTypeOf(uint32_t key) { return key & 0xffff; }

// The sizes an image type uses beside its width: a height (2D, 2D arrays, 3D), layers
// (1D and 2D arrays).
bool imageHasHeight(uint32_t type);
bool imageIsArray(uint32_t type);

// Bytes of one pixel of this channel order and type; 0 for a format raccel does not know
// (or a packed type with an order it does not fit).
uint32_t pixelBytes(uint32_t order, uint32_t type);
// How many channels the order has (0 if unknown).
uint32_t channelCount(uint32_t order);
// The image's pixel extent {width, rows, slices}: an array's layers count as rows (1D)
// or slices (2D). Valid for a descriptor checkImage accepted.
std::array<uint64_t, 3> imageRegion(const ImageDesc& d);
// The descriptor's shape alone: a known type and format, sizes nonzero where its type
// uses them and zero where not, each at most image::kMaxDimension. invalidArgument
// naming what is wrong otherwise.
Status checkShape(const ImageDesc& d);
// The image's packed bytes (pixel x width x rows x slices) after checkShape; saturates.
uint64_t imageBytes(const ImageDesc& d);
// The shape, then the card's limits and formats: invalidArgument, or unimplemented when
// the card has no images or not this format.
Status checkImage(const ImageDesc& d, const ImageLimits& limits);
// A card's limits as a peer reports them: dimensions at most image::kMaxDimension, at
// most image::kMaxFormats formats, each one pixelBytes knows.
Status checkLimits(const ImageLimits& limits);
// What every card of a set offers: the smallest of each limit, the formats all list.
ImageLimits commonLimits(const std::vector<const ImageLimits*>& cards);

// One pixel of the format from a fill color as OpenCL's clEnqueueFillImage takes it:
// four floats (r, g, b, a) for normalized, half and float channels, four int32 for
// signed integer channels, four uint32 for unsigned. Values are clamped to the channel's
// range; sRGB orders are encoded with the sRGB curve. Writes pixelBytes() bytes to `out`
// and returns how many (0 for a format pixelBytes does not know).
uint32_t encodePixel(uint32_t order, uint32_t type, const void* color, std::byte* out);

// Whether an OpenCL C kernel argument of this type name is an image (image2d_t, ...).
bool isImageTypeName(const std::string& typeName);

// A sampler as a word: normalized coordinates in bit 0, the addressing mode's offset
// from image::kAddressNone in bits 4-7, the filter's from image::kFilterNearest in bits
// 8-11. decodeSampler refuses any other bit or value.
uint32_t encodeSampler(bool normalized, uint32_t addressing, uint32_t filter);
struct SamplerBits {
  bool normalized = false;
  uint32_t addressing = image::kAddressNone;
  uint32_t filter = image::kFilterNearest;
};
Result<SamplerBits> decodeSampler(uint32_t word);

}  // namespace raccel
