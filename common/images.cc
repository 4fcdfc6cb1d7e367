#include "common/images.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "common/limits.h"

namespace raccel {
namespace {

constexpr uint32_t kRGB = 0x10B4, kRGBA = 0x10B5, kRGBx = 0x10BC;
constexpr uint32_t kSRGB = 0x10BF, kSRGBx = 0x10C0, kSRGBA = 0x10C1, kSBGRA = 0x10C2;
constexpr uint32_t kUnormInt8 = 0x10D2;
constexpr uint32_t kShort565 = 0x10D4, kShort555 = 0x10D5, kInt101010 = 0x10D6, kInt101010_2 = 0x10E0;

// Bytes of one channel of an unpacked type (0: packed or unknown).
uint32_t channelBytes(uint32_t type) {
  switch (type) {
    case 0x10D0: case 0x10D2: case 0x10D7: case 0x10DA: return 1;  // snorm8, unorm8, int8, uint8
    case 0x10D1: case 0x10D3: case 0x10D8: case 0x10DB: case 0x10DD: return 2;  // 16-bit, half
    case 0x10D9: case 0x10DC: case 0x10DE: return 4;  // int32, uint32, float
    default: return 0;
  }
}

std::string dimension(const char* what, uint64_t v) { return std::string(what) + " " + std::to_string(v); }

// The channels of an order, in memory order, as indices into (r, g, b, a).
std::vector<int> channelsOf(uint32_t order) {
  switch (order) {
    case 0x10B1: return {3};                     // A
    case 0x10B3: return {0, 3};                  // RA
    case 0x10B2: return {0, 1};                  // RG
    case kRGB: case kRGBx: case kSRGB: return {0, 1, 2};
    case 0x10B6: case kSBGRA: return {2, 1, 0, 3};  // BGRA
    case 0x10B7: return {3, 0, 1, 2};            // ARGB
    case 0x10C3: return {3, 2, 1, 0};            // ABGR
    case kRGBA: case kSRGBx: case kSRGBA: return {0, 1, 2, 3};
    default: return {0};                         // R, intensity, luminance, depth
  }
}

uint16_t toHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>(x >> 16 & 0x8000);
  if (std::isnan(f)) return sign | 0x7e00;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;                     // rounds past the largest half
  if (a < 6.103515625e-05f)                                    // subnormal (or zero)
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  int e;
  float m = std::frexp(a, &e);                                 // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = static_cast<uint32_t>(std::nearbyint((m * 2 - 1) * 1024));
  uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
  if (mant == 1024) mant = 0, ++exp;
  return sign | static_cast<uint16_t>(exp << 10 | mant);
}

float srgb(float v) {
  v = std::clamp(v, 0.0f, 1.0f);
  return v <= 0.0031308f ? v * 12.92f : 1.055f * std::pow(v, 1.0f / 2.4f) - 0.055f;
}

template <class T>
void put(std::byte*& out, T v) {
  std::memcpy(out, &v, sizeof v);
  out += sizeof v;
}

uint32_t norm(float v, float lo, float scale) { return static_cast<uint32_t>(std::nearbyint(std::clamp(v, lo, 1.0f) * scale)); }

}  // namespace

uint32_t encodePixel(uint32_t order, uint32_t type, const void* color, std::byte* out) {
  const uint32_t bytes = pixelBytes(order, type);
  if (bytes == 0) return 0;
  float f[4];
  int32_t i[4];
  uint32_t u[4];
  std::memcpy(f, color, 16);
  std::memcpy(i, color, 16);
  std::memcpy(u, color, 16);
  const bool isSrgb = order == kSRGB || order == kSRGBx || order == kSRGBA || order == kSBGRA;
  if (isSrgb)
    for (int c = 0; c < 3; ++c) f[c] = srgb(f[c]);
  if (type == kShort565 || type == kShort555) {
    const bool six = type == kShort565;
    uint16_t v = static_cast<uint16_t>(norm(f[0], 0, 31) << (six ? 11 : 10) | norm(f[1], 0, six ? 63 : 31) << 5 | norm(f[2], 0, 31));
    put(out, v);
    return bytes;
  }
  if (type == kInt101010) {
    put(out, norm(f[0], 0, 1023) << 20 | norm(f[1], 0, 1023) << 10 | norm(f[2], 0, 1023));
    return bytes;
  }
  if (type == kInt101010_2) {
    put(out, norm(f[3], 0, 3) << 30 | norm(f[0], 0, 1023) << 20 | norm(f[1], 0, 1023) << 10 | norm(f[2], 0, 1023));
    return bytes;
  }
  for (int c : channelsOf(order)) {
    switch (type) {
      case 0x10D0: put(out, static_cast<int8_t>(std::nearbyint(std::clamp(f[c], -1.0f, 1.0f) * 127))); break;
      case 0x10D1: put(out, static_cast<int16_t>(std::nearbyint(std::clamp(f[c], -1.0f, 1.0f) * 32767))); break;
      case 0x10D2: put(out, static_cast<uint8_t>(norm(f[c], 0, 255))); break;
      case 0x10D3: put(out, static_cast<uint16_t>(norm(f[c], 0, 65535))); break;
      case 0x10D7: put(out, static_cast<int8_t>(std::clamp(i[c], -128, 127))); break;
      case 0x10D8: put(out, static_cast<int16_t>(std::clamp(i[c], -32768, 32767))); break;
      case 0x10D9: put(out, i[c]); break;
      case 0x10DA: put(out, static_cast<uint8_t>(std::min<uint32_t>(u[c], 255))); break;
      case 0x10DB: put(out, static_cast<uint16_t>(std::min<uint32_t>(u[c], 65535))); break;
      case 0x10DC: put(out, u[c]); break;
      case 0x10DD: put(out, toHalf(f[c])); break;
      case 0x10DE: put(out, f[c]); break;
      default: return 0;
    }
  }
  return bytes;
}

bool imageHasHeight(uint32_t type) {
  return type == image::kImage2d || type == image::kImage2dArray || type == image::kImage3d;
}
bool imageIsArray(uint32_t type) { return type == image::kImage1dArray || type == image::kImage2dArray; }

uint32_t channelCount(uint32_t order) {
  switch (order) {
    case 0x10B0: case 0x10B1: case 0x10B8: case 0x10B9: case 0x10BD: return 1;  // R, A, intensity, luminance, depth
    case 0x10B2: case 0x10B3: return 2;                                          // RG, RA
    case kRGB: case kRGBx: case kSRGB: return 3;
    case kRGBA: case 0x10B6: case 0x10B7: case kSRGBx: case kSRGBA: case kSBGRA: case 0x10C3: return 4;
    default: return 0;
  }
}

uint32_t pixelBytes(uint32_t order, uint32_t type) {
  uint32_t channels = channelCount(order);
  if (channels == 0) return 0;
  if (type == kShort565 || type == kShort555 || type == kInt101010)
    return order == kRGB || order == kRGBx ? (type == kInt101010 ? 4 : 2) : 0;
  if (type == kInt101010_2) return order == kRGBA ? 4 : 0;
  if (order == kSRGB || order == kSRGBx || order == kSRGBA || order == kSBGRA)
    return type == kUnormInt8 ? (order == kSRGB ? 3 : 4) : 0;
  if (order == kRGB || order == kRGBx) return 0;  // only with the packed types
  return channels * channelBytes(type);
}

std::array<uint64_t, 3> imageRegion(const ImageDesc& d) {
  switch (d.type) {
    case image::kImage1dArray: return {d.width, d.arraySize, 1};
    case image::kImage2d: return {d.width, d.height, 1};
    case image::kImage2dArray: return {d.width, d.height, d.arraySize};
    case image::kImage3d: return {d.width, d.height, d.depth};
    default: return {d.width, 1, 1};
  }
}

Status checkShape(const ImageDesc& d) {
  if (d.type < image::kImage2d || d.type > image::kImage1dBuffer)
    return fail(Code::invalidArgument, "unknown image type " + std::to_string(d.type));
  if (pixelBytes(d.channelOrder, d.channelType) == 0)
    return fail(Code::invalidArgument, "unknown image format (channel order " + std::to_string(d.channelOrder) +
                                           ", channel type " + std::to_string(d.channelType) + ")");
  if (d.reserved != 0) return fail(Code::invalidArgument, "an image descriptor's reserved word must be 0");
  const bool usesHeight = imageHasHeight(d.type);
  const bool usesDepth = d.type == image::kImage3d;
  const bool usesArray = imageIsArray(d.type);
  auto bad = [](uint64_t v, bool used) {
    return used ? (v == 0 || v > image::kMaxDimension) : v != 0;
  };
  if (bad(d.width, true) || bad(d.height, usesHeight) || bad(d.depth, usesDepth) || bad(d.arraySize, usesArray))
    return fail(Code::invalidArgument, "image sizes " + dimension("width", d.width) + ", " + dimension("height", d.height) +
                                           ", " + dimension("depth", d.depth) + ", " + dimension("array size", d.arraySize) +
                                           ": each the image's type uses must be 1 to " +
                                           std::to_string(image::kMaxDimension) + ", the others 0");
  return {};
}

uint64_t imageBytes(const ImageDesc& d) {
  auto r = imageRegion(d);
  return limits::satMul(limits::satMul(pixelBytes(d.channelOrder, d.channelType), r[0]), r[1], r[2]);
}

Status checkImage(const ImageDesc& d, const ImageLimits& limits) {
  if (auto s = checkShape(d); !s) return s;
  if (!limits.supported()) return fail(Code::unimplemented, "this card has no image support");
  uint64_t maxW = limits.max2dWidth, maxH = 1, maxD = 1;
  switch (d.type) {
    case image::kImage2d: case image::kImage2dArray: maxH = limits.max2dHeight; break;
    case image::kImage3d: maxW = limits.max3dWidth, maxH = limits.max3dHeight, maxD = limits.max3dDepth; break;
    case image::kImage1dBuffer: maxW = limits.maxBufferPixels; break;
    default: break;
  }
  if (d.width > maxW || (d.height && d.height > maxH) || (d.depth && d.depth > maxD) ||
      (d.arraySize && d.arraySize > limits.maxArraySize))
    return fail(Code::invalidArgument, "image of " + dimension("width", d.width) + ", " + dimension("height", d.height) +
                                           ", " + dimension("depth", d.depth) + ", " + dimension("array size", d.arraySize) +
                                           " is past this card's limits (" + std::to_string(maxW) + " x " +
                                           std::to_string(maxH) + " x " + std::to_string(maxD) + ", arrays of " +
                                           std::to_string(limits.maxArraySize) + ")");
  uint32_t key = formatKey(d.channelOrder, d.channelType);
  if (std::find(limits.formats.begin(), limits.formats.end(), key) == limits.formats.end())
    return fail(Code::unimplemented, "this card has no images of channel order " + std::to_string(d.channelOrder) +
                                         " and channel type " + std::to_string(d.channelType));
  return {};
}

Status checkLimits(const ImageLimits& l) {
  for (uint64_t v : {l.max2dWidth, l.max2dHeight, l.max3dWidth, l.max3dHeight, l.max3dDepth, l.maxArraySize, l.maxBufferPixels})
    if (v > image::kMaxDimension)
      return fail(Code::invalidArgument, "an image limit of " + std::to_string(v) + " (at most " +
                                             std::to_string(image::kMaxDimension) + ")");
  if (l.formats.size() > image::kMaxFormats)
    return fail(Code::invalidArgument, std::to_string(l.formats.size()) + " image formats (at most " +
                                           std::to_string(image::kMaxFormats) + ")");
  for (uint32_t key : l.formats)
    if (pixelBytes(orderOf(key), channelTypeOf(key)) == 0)
      return fail(Code::invalidArgument, "unknown image format " + std::to_string(key));
  return {};
}

ImageLimits commonLimits(const std::vector<const ImageLimits*>& cards) {
  if (cards.empty()) return {};
  ImageLimits out = *cards.front();
  for (const ImageLimits* c : cards) {
    for (auto [mine, theirs] : {std::pair{&out.max2dWidth, c->max2dWidth}, {&out.max2dHeight, c->max2dHeight},
                                {&out.max3dWidth, c->max3dWidth}, {&out.max3dHeight, c->max3dHeight},
                                {&out.max3dDepth, c->max3dDepth}, {&out.maxArraySize, c->maxArraySize},
                                {&out.maxBufferPixels, c->maxBufferPixels}})
      *mine = std::min(*mine, theirs);
    out.maxReadArgs = std::min(out.maxReadArgs, c->maxReadArgs);
    out.maxWriteArgs = std::min(out.maxWriteArgs, c->maxWriteArgs);
    out.maxSamplers = std::min(out.maxSamplers, c->maxSamplers);
    std::erase_if(out.formats, [&](uint32_t key) {
      return std::find(c->formats.begin(), c->formats.end(), key) == c->formats.end();
    });
  }
  if (!out.supported()) out = {};
  return out;
}

bool isImageTypeName(const std::string& t) {
  return t.find("image") != std::string::npos && t.ends_with("_t") && t.find('*') == std::string::npos;
}

uint32_t encodeSampler(bool normalized, uint32_t addressing, uint32_t filter) {
  return uint32_t{normalized} | (addressing - image::kAddressNone) << 4 | (filter - image::kFilterNearest) << 8;
}

Result<SamplerBits> decodeSampler(uint32_t word) {
  uint32_t addressing = word >> 4 & 0xf, filter = word >> 8 & 0xf;
  if ((word & ~0xff1u) || addressing > image::kAddressMirroredRepeat - image::kAddressNone ||
      filter > image::kFilterLinear - image::kFilterNearest)
    return fail(Code::invalidArgument, "sampler word " + std::to_string(word) + " is not one (normalized, addressing, filter)");
  return SamplerBits{(word & 1) != 0, image::kAddressNone + addressing, image::kFilterNearest + filter};
}

}  // namespace raccel
