// Reads a libFuzzer input as numbers for the hal fuzz targets; past its end every read is
// 0. Numbers are drawn so that both small (valid-looking) and extreme values are common.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace raccel::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // 0..max.
  uint64_t number(uint64_t max) {
    uint64_t v = byte() | uint64_t{byte()} << 8;
    return max == 0 ? 0 : v % (max + 1);
  }
  // Any 64-bit number: small, a power of two near a boundary, or raw bytes.
  uint64_t wide() {
    switch (byte() % 4) {
      case 0: return byte();
      case 1: return (uint64_t{1} << (byte() % 64)) - (byte() % 3);
      case 2: return ~uint64_t{0} - byte();
      default: {
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v = v << 8 | byte();
        return v;
      }
    }
  }
  float real() {
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits = bits << 8 | byte();
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }

 private:
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace raccel::fuzz
