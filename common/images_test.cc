#include "common/images.h"

#include <gtest/gtest.h>

#include <cstring>

namespace raccel {
namespace {

constexpr uint32_t kRGBA = 0x10B5, kR = 0x10B0, kRGB = 0x10B4;
constexpr uint32_t kUnorm8 = 0x10D2, kFloat = 0x10DE, kShort565 = 0x10D4, kUint16 = 0x10DB;

ImageLimits pocl() {
  ImageLimits l;
  l.max2dWidth = l.max2dHeight = 8192;
  l.max3dWidth = l.max3dHeight = l.max3dDepth = 2048;
  l.maxArraySize = 2048;
  l.maxBufferPixels = 1 << 20;
  l.maxReadArgs = l.maxWriteArgs = 128;
  l.maxSamplers = 16;
  l.formats = {formatKey(kRGBA, kUnorm8), formatKey(kRGBA, kFloat), formatKey(kR, kFloat)};
  return l;
}

TEST(Images, PixelBytesFollowTheFormat) {
  EXPECT_EQ(pixelBytes(kRGBA, kUnorm8), 4u);
  EXPECT_EQ(pixelBytes(kRGBA, kFloat), 16u);
  EXPECT_EQ(pixelBytes(kR, kUint16), 2u);
  EXPECT_EQ(pixelBytes(kRGB, kShort565), 2u);
  EXPECT_EQ(pixelBytes(kRGB, kFloat), 0u) << "RGB only packs";
  EXPECT_EQ(pixelBytes(kR, kShort565), 0u);
  EXPECT_EQ(pixelBytes(0x1234, kFloat), 0u);
  EXPECT_EQ(pixelBytes(kRGBA, 0x4321), 0u);
}

TEST(Images, ShapesUseOnlyTheirTypesSizes) {
  ImageDesc d{image::kImage2d, kRGBA, kFloat, 0, 64, 32, 0, 0};
  ASSERT_TRUE(checkShape(d));
  EXPECT_EQ(imageBytes(d), 64u * 32 * 16);
  EXPECT_EQ(imageRegion(d), (std::array<uint64_t, 3>{64, 32, 1}));
  d.depth = 3;
  EXPECT_FALSE(checkShape(d)) << "a 2D image has no depth";
  ImageDesc a{image::kImage1dArray, kR, kFloat, 0, 10, 0, 0, 5};
  ASSERT_TRUE(checkShape(a));
  EXPECT_EQ(imageRegion(a), (std::array<uint64_t, 3>{10, 5, 1}));
  ImageDesc a2{image::kImage2dArray, kR, kFloat, 0, 10, 4, 0, 3};
  ASSERT_TRUE(checkShape(a2));
  EXPECT_EQ(imageBytes(a2), 10u * 4 * 3 * 4);
  EXPECT_FALSE(checkShape({image::kImage3d, kR, kFloat, 0, 4, 4, 0, 0})) << "a 3D image needs a depth";
  EXPECT_FALSE(checkShape({0x10F0, kR, kFloat, 0, 4, 0, 0, 0})) << "a buffer is not an image";
  EXPECT_FALSE(checkShape({image::kImage1d, kR, kFloat, 1, 4, 0, 0, 0})) << "reserved must be zero";
}

TEST(Images, AbsurdSizesAreRefusedAndNeverWrap) {
  ImageDesc huge{image::kImage3d, kRGBA, kFloat, 0, image::kMaxDimension, image::kMaxDimension, image::kMaxDimension, 0};
  ASSERT_TRUE(checkShape(huge));
  EXPECT_EQ(imageBytes(huge), UINT64_MAX) << "saturates";
  EXPECT_FALSE(checkImage(huge, pocl()));
  ImageDesc past{image::kImage2d, kRGBA, kFloat, 0, image::kMaxDimension + 1, 1, 0, 0};
  EXPECT_FALSE(checkShape(past));
  ImageDesc wide{image::kImage2d, kRGBA, kFloat, 0, 8193, 1, 0, 0};
  EXPECT_EQ(checkImage(wide, pocl()).error().code, Code::invalidArgument);
}

TEST(Images, TheCardsFormatsAndSupportDecide) {
  ImageDesc d{image::kImage2d, kRGBA, kUnorm8, 0, 4, 4, 0, 0};
  EXPECT_TRUE(checkImage(d, pocl()));
  d.channelType = kUint16;
  EXPECT_EQ(checkImage(d, pocl()).error().code, Code::unimplemented) << "a format the card lacks";
  EXPECT_EQ(checkImage({image::kImage2d, kRGBA, kUnorm8, 0, 4, 4, 0, 0}, ImageLimits{}).error().code, Code::unimplemented);
}

TEST(Images, LimitsFromAPeerAreBounded) {
  EXPECT_TRUE(checkLimits(pocl()));
  auto l = pocl();
  l.max2dWidth = image::kMaxDimension + 1;
  EXPECT_FALSE(checkLimits(l));
  l = pocl();
  l.formats.push_back(formatKey(kRGB, kFloat));
  EXPECT_FALSE(checkLimits(l));
  l = pocl();
  l.formats.assign(image::kMaxFormats + 1, formatKey(kR, kFloat));
  EXPECT_FALSE(checkLimits(l));
}

TEST(Images, CommonLimitsAreWhatEveryCardHas) {
  auto a = pocl(), b = pocl();
  b.max2dWidth = 4096;
  b.formats = {formatKey(kR, kFloat), formatKey(kRGBA, kUint16)};
  auto c = commonLimits({&a, &b});
  EXPECT_EQ(c.max2dWidth, 4096u);
  EXPECT_EQ(c.formats, (std::vector<uint32_t>{formatKey(kR, kFloat)}));
  ImageLimits none;
  EXPECT_FALSE(commonLimits({&a, &none}).supported());
  EXPECT_FALSE(commonLimits({}).supported());
}

TEST(Images, FillColorsBecomeThePixelsBytes) {
  std::byte out[16];
  const float rgba[4] = {1.0f, 0.5f, 0.0f, 0.25f};
  ASSERT_EQ(encodePixel(kRGBA, kUnorm8, rgba, out), 4u);
  EXPECT_EQ(std::to_integer<int>(out[0]), 255);
  EXPECT_EQ(std::to_integer<int>(out[1]), 128);
  EXPECT_EQ(std::to_integer<int>(out[2]), 0);
  EXPECT_EQ(std::to_integer<int>(out[3]), 64);
  ASSERT_EQ(encodePixel(0x10B6 /* BGRA */, kUnorm8, rgba, out), 4u);
  EXPECT_EQ(std::to_integer<int>(out[0]), 0);
  EXPECT_EQ(std::to_integer<int>(out[2]), 255);
  ASSERT_EQ(encodePixel(kR, kFloat, rgba, out), 4u);
  float f;
  std::memcpy(&f, out, 4);
  EXPECT_EQ(f, 1.0f);
  ASSERT_EQ(encodePixel(kR, 0x10DD /* half */, rgba, out), 2u);
  uint16_t h;
  std::memcpy(&h, out, 2);
  EXPECT_EQ(h, 0x3c00) << "1.0 as a half";
  const float half[4] = {0.5f, -2.0f, 65504.0f, 1e9f};
  ASSERT_EQ(encodePixel(kRGBA, 0x10DD, half, out), 8u);
  uint16_t hs[4];
  std::memcpy(hs, out, 8);
  EXPECT_EQ(hs[0], 0x3800);
  EXPECT_EQ(hs[1], 0xc000);
  EXPECT_EQ(hs[2], 0x7bff);
  EXPECT_EQ(hs[3], 0x7c00) << "past the largest: infinity";
  const uint32_t big[4] = {70000, 1, 2, 3};
  ASSERT_EQ(encodePixel(kR, kUint16, big, out), 2u);
  std::memcpy(&h, out, 2);
  EXPECT_EQ(h, 65535) << "clamped";
  EXPECT_EQ(encodePixel(kRGB, kFloat, rgba, out), 0u);
}

TEST(Images, SamplerWordsRoundTripAndRefuseStrayBits) {
  for (bool n : {false, true})
    for (uint32_t a = image::kAddressNone; a <= image::kAddressMirroredRepeat; ++a)
      for (uint32_t f : {image::kFilterNearest, image::kFilterLinear}) {
        auto s = decodeSampler(encodeSampler(n, a, f));
        ASSERT_TRUE(s);
        EXPECT_EQ(s->normalized, n);
        EXPECT_EQ(s->addressing, a);
        EXPECT_EQ(s->filter, f);
      }
  EXPECT_FALSE(decodeSampler(0x2));
  EXPECT_FALSE(decodeSampler(5u << 4));
  EXPECT_FALSE(decodeSampler(2u << 8));
  EXPECT_FALSE(decodeSampler(1u << 31));
}

}  // namespace
}  // namespace raccel
