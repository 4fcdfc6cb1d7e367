// Expected failures as values: Error carries the wire error code and a message that
// tells the user what to do. Used by every folder; hal converts vendor codes into it
// in exactly one place per backend, daemons convert it to the wire enum in one place.
#pragma once

#include <expected>
#include <string>
#include <utility>

namespace raccel {

// The same codes, in the same order, as schema/frame.capnp's ErrorCode.
enum class Code {
  ok = 0,
  invalidArgument,
  notFound,
  resourceExhausted,
  unavailable,
  unimplemented,
  permissionDenied,
  internal,
};

const char* codeName(Code code);

struct Error {
  Code code = Code::internal;
  std::string message;
  // The OpenCL error (CL_INVALID_WORK_GROUP_SIZE, ...) an OpenCL card's driver gave, for
  // the guest's OpenCL to report as is; 0 when none (or another kind of card).
  int32_t openclError = 0;

  std::string toString() const { return std::string(codeName(code)) + ": " + message; }
};

// OpenCL's error codes run from -1 to -72, and its extensions' from -1000 to -1200 or
// so: anything else a peer claims is dropped (0).
inline int32_t validOpenclError(int64_t code) { return code < 0 && code > -10000 ? static_cast<int32_t>(code) : 0; }

template <class T>
using Result = std::expected<T, Error>;
using Status = std::expected<void, Error>;

inline std::unexpected<Error> fail(Code code, std::string message) {
  return std::unexpected<Error>(Error{code, std::move(message)});
}
inline std::unexpected<Error> fail(Error error) { return std::unexpected<Error>(std::move(error)); }

// Parses "4096", "64KiB", "4MiB", "2GiB", "1.5GiB" (or "1.5 GiB") into bytes.
Result<unsigned long long> parseBytes(const std::string& text);
// The one way sizes are printed (every table and message; console/web/app.js mirrors it):
// in the largest binary unit the size reaches, exactly when it is a whole number of it
// ("768 KiB", "2 GiB"), else to one decimal ("1.5 GiB"); under 1 KiB in bytes ("512 B").
// parseBytes reads it back (to that decimal).
std::string formatBytes(unsigned long long bytes);

}  // namespace raccel
