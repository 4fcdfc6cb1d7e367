// Sandbox processes: guest code runs outside the netaccel.
//
// A card whose backend runs guest code (OpenCL, CUDA, XRT) serves each tenant (VM)
// from a process of its own, `raccel-sandbox`, which opens the device and keeps that
// tenant's buffers and programs. One per tenant per card, not one per context: a CUDA
// context costs ~520 MiB of device memory and 0.3-1.2 s to create, and a fault poisons
// every context of its process but none of another process's; so a process per tenant
// confines a fault to the tenant that caused it while a VM with many programs pays for
// one context per card. Sandboxes are started ahead (a warm pool per card), so a new
// tenant does not wait for the device to open.
//
// The netaccel talks to a sandbox through SandboxDevice, a hal::Device whose calls are
// requests on a SOCK_SEQPACKET socket pair (a fixed-size Request, a tensor op's
// TensorWindow with it, and a Reply each, a failed one's message after it), with bulk
// data (writes, reads, program code, launch arguments) in one shared-memory window (a
// memfd mapped by both). On a card that times its kernels, the calls that only queue
// work (writes, tensor ops, the built-in ops, copies and fills) are posted: sent without
// waiting, their replies read later in order (a few at a time, and all before the reply
// of any call that waits), so a stream of small ops
// costs no round trip each. While the card worker has a run of instructions for one
// sandbox in hand it plugs the device (hal::Device::plug): posted requests then wait in
// an outbox and go as one message (each request with the bytes that follow it, at most
// kMaxBatchRequests or kMaxBatchBytes), at the run's end or before anything waits for a
// reply; a reply to a request still in the outbox is a protocol violation. A call (a
// fence, a read) goes behind the run in the same message, and the run's replies are read
// before its own: a run and the call that ends it cost one round trip. The sandbox
// plugs its own device while requests wait, so PoCL starts the run at once rather than
// waking its threads for each kernel. The sandbox holds back the replies of requests it finds more
// waiting behind, and sends them in one message (at most kMaxReplies) when its socket
// holds no more: such a stream costs one receive per run of ops, not one per op. A reply
// that carries an error or a payload in the window goes at once, and so does a write's
// (it frees the half of the window the netaccel fills next). A large read is read ahead
// (hal::Device::readAhead): its pieces are posted into the window's halves, the next one
// filled while the netaccel copies the last one out; a reply that does not fill its
// piece stops the sandbox, and anything else done with the device ends the read-ahead
// (its pieces waited for and dropped). A posted call that fails is reported by the device's next
// takeDeferredErrors() with its kernel tag. Completed kernels' times come back through a
// ring after the window that the sandbox fills after every request and the netaccel
// reads without asking. The sandbox may be running hostile code, so everything it says
// is checked like any peer's: sizes bounded by the window, each reply's serial the one
// due (an extra or unasked reply is caught), the ring's count bounded by its size, names
// and messages clipped, and a call unanswered within the call timeout kills it. When the
// sandbox dies or its device context faults, the device is lost(): every later call
// fails naming the fault, and the card worker replaces it. A loss that is not its work's
// doing (the process killed by a signal the netaccel did not send, or the sandbox's
// reply saying the card went away under it) is lostFromOutside(): the tenant is rebuilt
// from its lineage rather than failed. A hostile sandbox can claim that; the scheduler
// bounds how often one vaccel is rebuilt so.
//
// A sandbox gets no more than it needs: PR_SET_NO_NEW_PRIVS, a data-segment rlimit
// (host memory), no core dumps, death with its parent, its own session, its own working
// folder (and compiler caches in it), an allocation cap of its tenant's memory quota;
// once the device is open, a seccomp filter (signals only to itself, no ptrace, no other
// process's memory, no new sockets) and Landlock as an allow-list (read only the
// driver's and compiler's libraries, headers and tools, the card's /dev nodes, its own
// folder and what the operator adds; write only its folder and the card's nodes).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hal/device.h"
#include "netaccel/kernel_template.h"

namespace raccel::netaccel {

namespace sandbox {

inline constexpr uint64_t kWindowBytes = 4ull << 20;  // the shared-memory window
// A failed request's message, clipped to this, follows its reply in the reply's message
// (not the window: replies to posted requests come in runs, and one failure's message in
// a shared place would be written over by the next before the netaccel read it).
inline constexpr uint32_t kMaxMessage = 4096;
inline constexpr uint32_t kMaxProgramBytes = 256u << 20;
inline constexpr uint64_t kRingEntries = 4096;
// Replies the sandbox sends in one message: those of a run of requests that were waiting
// when each was done (posted ones: nothing waits for them), sent when the socket holds no
// more, or at once for one that carries an error or a payload in the window.
inline constexpr size_t kMaxReplies = 64;
// A launch's arguments up to this size follow its Request in the message (posted).
inline constexpr uint64_t kMaxInlineBytes = 16 << 10;
// One message of requests: a run of posted ones goes as one (SandboxDevice::plug), each
// a Request and the `inlineBytes` that follow it.
inline constexpr size_t kMaxBatchBytes = 64 << 10;
inline constexpr unsigned kMaxBatchRequests = 32;

// Completed kernels' times, after the window in the same memfd. The sandbox writes slots
// and then `head` (entries written so far) and `pending`; the netaccel reads
// up to `head` and then writes `tail` (entries read so far), which the sandbox never
// passes by more than kRingEntries. The netaccel trusts none of it: a head behind its
// tail or past it by more than the ring holds loses the device; the times are checked
// where they are charged.
struct CompletionRing {
  std::atomic<uint64_t> head{0};
  std::atomic<uint64_t> tail{0};
  std::atomic<uint64_t> pending{0};  // kernels in flight, and completions not yet written
  hal::KernelTime slots[kRingEntries];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the ring is shared between processes");
inline constexpr uint64_t kMappedBytes = kWindowBytes + ((sizeof(CompletionRing) + 4095) & ~uint64_t{4095});
inline CompletionRing* ringOf(void* mapped) {
  return reinterpret_cast<CompletionRing*>(static_cast<std::byte*>(mapped) + kWindowBytes);
}

enum class Op : uint32_t {
  ready = 1,  // the sandbox's first reply: the device is open (or why not)
  allocate,
  release,
  write,
  read,
  copy,
  fill,
  append,  // program code longer than the window, a window at a time
  loadProgram,
  releaseProgram,
  launch,
  gemm,
  axpy,
  vadd,
  reduceSum,
  finish,
  wait,       // waits up to `length` ms for a kernel to complete (the times go to the ring)
  memoryCap,
  tensor,     // a TensorWindow follows the Request in its message
};
// launch: its arguments (`payload` bytes) follow the Request in its message when that is
// longer than a Request, else they are in the window.

struct Request {
  Op op{};
  uint32_t kind = 0;             // loadProgram: the ProgramKind
  uint64_t id = 0, id2 = 0, id3 = 0;  // buffers or a program, chosen by the netaccel
  uint64_t offset = 0, offset2 = 0, length = 0;  // also n, a byte value, a timeout
  uint64_t payload = 0;          // bytes of the request in the window
  uint64_t tag = 0;              // kernels: what their KernelTime carries
  uint32_t m = 0, n = 0, k = 0;
  uint32_t inlineBytes = 0;      // bytes that follow this Request in its message
  float alpha = 0, beta = 0;
  uint64_t serial = 0;           // counts the requests from 1; the reply says it back
};

// A tensor op as it crosses the window; the sandbox checks it again against its buffers.
struct TensorWindow {
  uint32_t fn = 0, dims = 0;
  uint32_t reduceMask = 0, mean = 0;
  float alpha = 0, beta = 0;
  int64_t ignoreIndex = 0;
  uint64_t drawOrigin = 0;
  uint64_t shape[hal::kMaxTensorDims] = {};
  uint64_t ids[hal::kMaxTensorOperands] = {};
  uint64_t offsets[hal::kMaxTensorOperands] = {};
  uint64_t strides[hal::kMaxTensorOperands][hal::kMaxTensorDims] = {};
  uint32_t types[hal::kMaxTensorOperands] = {};
  float pre[2] = {1, 0}, post[2] = {1, 0};
};

// Reply::lost: by what the device context was lost. Any other nonzero value counts as
// kLostByItsWork.
enum : uint32_t { kLostByItsWork = 1, kLostByTheCard = 2 };

// A reply that is not ok is the last of its message, and `payload` bytes of its error
// message (at most kMaxMessage) follow it there.
struct Reply {
  uint64_t serial = 0;   // the request's (0: the first message, `ready`)
  uint32_t code = 0;     // raccel::Code
  uint32_t lost = 0;     // the device context is lost (kLostBy*): the sandbox exits after this reply
  uint64_t payload = 0;  // ok: bytes of the reply in the window; not ok: of the message after it
  uint32_t timesKernels = 0;  // ready: the device is asynchronous
  int32_t openclError = 0;    // not ok: the card driver's OpenCL error, if any
};

// Sends one message of replies, the last one's error message after them (`said`, its
// `payload` bytes, when it is not ok).
inline bool sendReplies(int fd, std::span<const Reply> replies, std::string_view said = {}) {
  iovec parts[2] = {{const_cast<Reply*>(replies.data()), replies.size() * sizeof(Reply)},
                    {const_cast<char*>(said.data()), said.size()}};
  msghdr m{};
  m.msg_iov = parts;
  m.msg_iovlen = said.empty() ? 1 : 2;
  const ssize_t want = static_cast<ssize_t>(parts[0].iov_len + parts[1].iov_len);
  return replies.empty() || ::sendmsg(fd, &m, MSG_NOSIGNAL) == want;
}

// A tensor request as one record of a message.
struct TensorRequest {
  Request request;
  TensorWindow op;
};
static_assert(kMaxBatchBytes >= sizeof(Request) + std::max<size_t>(sizeof(TensorWindow), kMaxInlineBytes));

// [at, at + bytes) lies within the shared window.
inline bool inWindow(uint64_t at, uint64_t bytes) { return at <= kWindowBytes && bytes <= kWindowBytes - at; }

// Takes the next request of a message off `rest`, with the bytes that follow it
// (`extra`); false when what is left is not a whole request.
inline bool nextRequest(std::span<const std::byte>& rest, Request& q, std::span<const std::byte>& extra) {
  if (rest.size() < sizeof q) return false;
  std::memcpy(&q, rest.data(), sizeof q);
  if (q.inlineBytes > rest.size() - sizeof q) return false;
  extra = rest.subspan(sizeof q, q.inlineBytes);
  rest = rest.subspan(sizeof q + q.inlineBytes);
  return true;
}

}  // namespace sandbox

struct SandboxSettings {
  std::string executable;   // raccel-sandbox (default: beside this program)
  std::string dir = "/tmp/raccel-sandbox";
  unsigned long long hostMemoryBytes = 16ull << 30;
  unsigned callTimeoutMs = 30000;
  unsigned warm = 1;
  // Paths its sandboxes may read besides their driver's and compiler's files, their
  // card's device nodes and their own folder (raccel-sandbox's allow-list).
  std::vector<std::string> readable;
};

class SandboxProcess;

// A card's sandboxes: the warm ones, and new ones on demand. Worker thread only.
class SandboxPool {
 public:
  SandboxPool(hal::Capabilities caps, SandboxSettings settings, std::string label);
  ~SandboxPool();
  // A sandbox for one tenant: a warm one that is still alive, else a new one; the pool
  // then starts another to stay warm.
  std::unique_ptr<hal::Device> take();
  const hal::Capabilities& capabilities() const { return caps_; }
  // The process id of the sandbox a device from take() talks to (0 for another device).
  static pid_t pidOf(const hal::Device& device);

 private:
  Result<std::unique_ptr<SandboxProcess>> spawn();
  void refill();
  std::vector<std::string> templateBuilder() const;

  hal::Capabilities caps_;
  SandboxSettings settings_;
  std::string label_;
  std::vector<std::unique_ptr<SandboxProcess>> warm_;
  std::optional<KernelTemplate> template_;  // an OpenCL card's (kernel_template.h)
};

// The sandbox's own side: serves requests on `fd` until it closes (raccel-sandbox).
int serveSandbox(int fd, void* window, hal::Device& device);
// The card went away under this sandbox: its next reply loses the device as the card's
// doing (kLostByTheCard). Async-signal-safe: raccel-sandbox calls it on SIGPWR, which
// rehearses a driver reset without one (what a real one does, the device reports).
void noteCardReset();

// The path of raccel-sandbox beside the running executable.
std::string defaultSandboxExecutable();

}  // namespace raccel::netaccel
