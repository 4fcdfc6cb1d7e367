#include "vmfrontend/raccel_c.h"

#include <cstring>

#include "vmfrontend/raccel.h"

struct raccel_session {
  std::unique_ptr<raccel::client::Session> session;
  std::string lastError;
};

namespace {
int record(raccel_session* s, const raccel::Status& status) {
  if (status) return RACCEL_OK;
  s->lastError = status.error().message;
  return static_cast<int>(status.error().code);
}
}  // namespace

extern "C" {

int raccel_open(const char* socket, const char* program, double tflops, raccel_session** out, char* error,
                size_t error_len) {
  *out = nullptr;
  raccel::client::Options options;
  if (socket) options.socket = socket;
  if (program) options.program = program;
  options.tflops = tflops;
  auto s = raccel::client::Session::open(options);
  if (!s) {
    if (error && error_len) {
      std::strncpy(error, s.error().message.c_str(), error_len - 1);
      error[error_len - 1] = '\0';
    }
    return static_cast<int>(s.error().code);
  }
  *out = new raccel_session{std::move(*s), {}};
  return RACCEL_OK;
}

void raccel_close(raccel_session* session) { delete session; }

raccel_handle raccel_alloc(raccel_session* s, uint64_t bytes) { return s->session->alloc(bytes); }
void raccel_free(raccel_session* s, raccel_handle buffer) { s->session->free(buffer); }

void raccel_write(raccel_session* s, raccel_handle buffer, uint64_t offset, const void* data, size_t size) {
  s->session->write(buffer, offset, std::span(static_cast<const std::byte*>(data), size));
}

int raccel_read(raccel_session* s, raccel_handle buffer, uint64_t offset, void* out, size_t size) {
  return record(s, s->session->read(buffer, offset, std::span(static_cast<std::byte*>(out), size)));
}

void raccel_gemm(raccel_session* s, uint32_t m, uint32_t n, uint32_t k, float alpha, raccel_handle a, raccel_handle b,
                 float beta, raccel_handle c) {
  s->session->gemm(m, n, k, alpha, a, b, beta, c);
}
void raccel_axpy(raccel_session* s, uint64_t n, float alpha, raccel_handle x, raccel_handle y) {
  s->session->axpy(n, alpha, x, y);
}
void raccel_vadd(raccel_session* s, uint64_t n, raccel_handle a, raccel_handle b, raccel_handle out) {
  s->session->vadd(n, a, b, out);
}
void raccel_reduce_sum(raccel_session* s, uint64_t n, raccel_handle input, raccel_handle out) {
  s->session->reduceSum(n, input, out);
}

int raccel_fence(raccel_session* s) { return record(s, s->session->fence()); }

const char* raccel_last_error(const raccel_session* s) { return s->lastError.c_str(); }

}  // extern "C"
