/* libraccel's C ABI: opaque handles over the C++ API in raccel.h, same semantics.
 *
 * Ownership: raccel_open() returns a session the caller owns and ends with
 * raccel_close(). Strings returned by raccel_last_error() belong to the session and
 * stay valid until its next call. A session is used from one thread at a time.
 *
 * Functions that return int give 0 on success or a RACCEL_E_* code (the wire error
 * codes); asynchronous instructions report their failures at the next raccel_fence(). */
#ifndef RACCEL_C_H
#define RACCEL_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct raccel_session raccel_session;
typedef uint64_t raccel_handle;

enum {
  RACCEL_OK = 0,
  RACCEL_E_INVALID_ARGUMENT = 1,
  RACCEL_E_NOT_FOUND = 2,
  RACCEL_E_RESOURCE_EXHAUSTED = 3,
  RACCEL_E_UNAVAILABLE = 4,
  RACCEL_E_UNIMPLEMENTED = 5,
  RACCEL_E_PERMISSION_DENIED = 6,
  RACCEL_E_INTERNAL = 7
};

/* Connects to `socket` (NULL: /run/raccel/guestd.sock) and asks for `tflops`.
 * On failure returns the code, sets *out to NULL and writes the reason to `error`
 * (up to error_len bytes, NUL-terminated) when given. */
int raccel_open(const char* socket, const char* program, double tflops, raccel_session** out, char* error,
                size_t error_len);
void raccel_close(raccel_session* session);

raccel_handle raccel_alloc(raccel_session* session, uint64_t bytes);
void raccel_free(raccel_session* session, raccel_handle buffer);
void raccel_write(raccel_session* session, raccel_handle buffer, uint64_t offset, const void* data, size_t size);
int raccel_read(raccel_session* session, raccel_handle buffer, uint64_t offset, void* out, size_t size);
void raccel_gemm(raccel_session* session, uint32_t m, uint32_t n, uint32_t k, float alpha, raccel_handle a,
                 raccel_handle b, float beta, raccel_handle c);
void raccel_axpy(raccel_session* session, uint64_t n, float alpha, raccel_handle x, raccel_handle y);
void raccel_vadd(raccel_session* session, uint64_t n, raccel_handle a, raccel_handle b, raccel_handle out);
void raccel_reduce_sum(raccel_session* session, uint64_t n, raccel_handle input, raccel_handle out);
/* Waits for everything sent so far; returns the first unreported error's code. */
int raccel_fence(raccel_session* session);
/* The message of the last error a call of this session returned ("" if none). */
const char* raccel_last_error(const raccel_session* session);

#ifdef __cplusplus
}
#endif

#endif /* RACCEL_C_H */
