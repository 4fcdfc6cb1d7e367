#include "netaccel/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <new>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/limits.h"
#include "common/log.h"
#include "netaccel/spawn.h"

namespace raccel::netaccel {

using sandbox::inWindow;
using sandbox::kWindowBytes;
using sandbox::Op;
using sandbox::Reply;
using sandbox::Request;

namespace {

std::string describeExit(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    std::string out = "killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
    if (sig == SIGSEGV || sig == SIGBUS) out += ": a kernel that accessed memory out of bounds?";
    return out;
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended";
}

// What a read that came back short of its length is called (a protocol violation).
std::string shortRead(uint64_t got, uint64_t asked) {
  return "the sandbox returned " + std::to_string(got) + " bytes for a read of " + std::to_string(asked);
}

std::string clipped(const char* p, uint64_t n) {
  n = std::min<uint64_t>(n, sandbox::kMaxMessage);
  std::string s(p, n);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n') c = ' ';
  return s;
}

}  // namespace

// How long the netaccel's side spins for a reply before it blocks: most come within
// microseconds, and the spin saves a wake-up. The sandbox blocks at once: on a machine
// with few cores its spinning delayed the replies' way back through the other processes
// (raccel-bench on 2 cores: sync_rtt_us_p50_sandbox 194-302 us with 10-50 us of spin on
// its side, 148-178 us without).
constexpr auto kSpin = std::chrono::microseconds(20);

// One running raccel-sandbox: its pid, the socket, the mapped window, its folder.
class SandboxProcess {
 public:
  SandboxProcess(pid_t pid, int fd, std::byte* window, std::string dir, bool templated)
      : pid_(pid), fd_(fd), window_(window), dir_(std::move(dir)), templated_(templated) {}
  ~SandboxProcess() {
    ::close(fd_);
    reap();
    ::munmap(window_, sandbox::kMappedBytes);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  SandboxProcess(const SandboxProcess&) = delete;
  SandboxProcess& operator=(const SandboxProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Started with its card's kernel template (kernel_template.h).
  bool templated() const { return templated_; }
  std::byte* window() { return window_; }
  // The error message of the reply taken last (from awaitReply or poll).
  const std::string& said() const { return said_; }
  sandbox::CompletionRing& ring() { return *sandbox::ringOf(window_); }

  // Still running? (A warm sandbox may have died before anyone asked it anything.)
  bool alive() {
    if (reaped_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      noteExit(status);
      return false;
    }
    return true;
  }

  // Sends a request (and what follows it in its message) without waiting for its reply.
  Status sendMessage(const void* message, size_t bytes) {
    if (::send(fd_, message, bytes, MSG_NOSIGNAL) != static_cast<ssize_t>(bytes)) return fail(Code::internal, gone());
    return {};
  }
  // Sends without blocking: false when the socket is full (the sandbox reads nothing
  // until its replies are read).
  Result<bool> offer(const void* message, size_t bytes) {
    ssize_t n = ::send(fd_, message, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(bytes)) return true;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    return fail(Code::internal, gone());
  }
  // Waits up to `timeoutMs` for room to send (false: none came, and it was stopped).
  bool awaitRoom(unsigned timeoutMs) {
    if (pollFor(POLLOUT, timeoutMs) != 0) return true;
    stop();
    return false;
  }
  // A reply that has come already, without waiting (nothing: none has).
  Result<std::optional<Reply>> poll() {
    if (inbox_.empty()) {
      auto got = receive(MSG_DONTWAIT);
      if (!got) return fail(got.error());
      if (!*got) return std::optional<Reply>{};
    }
    return std::optional<Reply>{next()};
  }

  // Waits up to `timeoutMs` for the next reply. An error here means the sandbox is gone
  // (it was killed if it was not).
  // `spin`: someone waits on this reply, and most come within microseconds: wait for it
  // spinning a moment, which saves the two wake-ups a blocking wait costs; then block.
  // Without (a full queue waiting for room), block at once: spinning would only take the
  // CPU the sandbox needs to answer.
  Result<Reply> awaitReply(unsigned timeoutMs, bool spin = true) {
    for (auto spinUntil = std::chrono::steady_clock::now() + kSpin; spin && inbox_.empty();) {
      auto got = receive(MSG_DONTWAIT);
      if (!got) return fail(got.error());
      if (*got || std::chrono::steady_clock::now() > spinUntil) break;
    }
    if (inbox_.empty()) {
      if (pollFor(POLLIN, timeoutMs) == 0) {
        stop();
        return fail(Code::internal, "the sandbox answered nothing for " + std::to_string(timeoutMs) +
                                        " ms (a kernel that runs too long?) and was stopped");
      }
      auto got = receive(0);
      if (!got) return fail(got.error());
      if (!*got) return fail(Code::internal, gone());
    }
    return next();
  }
  // The sandbox said what the protocol does not allow: it is stopped.
  Error violated(const std::string& what) {
    stop();
    return Error{Code::internal, "the sandbox broke its protocol (" + what + ") and was stopped"};
  }

  // Why it is gone: its exit status once reaped. (Its socket closed: it is ending, and is
  // given a moment to, so that how it ended is its own and not our stopping it.)
  std::string gone() {
    for (int i = 0; i < 40 && alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    reap();
    return "the sandbox process " + std::to_string(pid_) + " " + exit_;
  }
  // Ended by a signal that the netaccel did not send (an operator's kill, the kernel's
  // OOM killer): nothing its tenant's work did.
  bool killedFromOutside() const { return reaped_ && !stoppedByUs_ && outsideSignal_; }

 private:
  // One message of replies (the sandbox sends those of a run of posted requests
  // together), each checked, into the inbox: false when none has come (MSG_DONTWAIT).
  // Whole replies, at most kMaxReplies; only the last may fail, its message after it.
  Result<bool> receive(int flags) {
    ssize_t n;
    do n = ::recv(fd_, batch_.data(), batch_.size(), flags | MSG_TRUNC);
    while (n < 0 && errno == EINTR && !(flags & MSG_DONTWAIT));
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (n <= 0) return fail(Code::internal, gone());
    const auto bytes = static_cast<size_t>(n);
    auto malformed = [&] { return std::unexpected(violated("a reply message of " + std::to_string(bytes) + " bytes")); };
    if (bytes > batch_.size()) return malformed();
    std::vector<Incoming> got;
    for (size_t at = 0; at < bytes;) {
      if (bytes - at < sizeof(Reply) || got.size() == sandbox::kMaxReplies) return malformed();
      Incoming in;
      std::memcpy(&in.reply, batch_.data() + at, sizeof(Reply));
      at += sizeof(Reply);
      if (in.reply.code == 0) {
        if (in.reply.payload > kWindowBytes) return std::unexpected(violated("a reply larger than its window"));
      } else {  // the last, its message after it
        if (in.reply.payload != bytes - at || in.reply.payload > sandbox::kMaxMessage) return malformed();
        in.said = clipped(reinterpret_cast<const char*>(batch_.data() + at), in.reply.payload);
        at = bytes;
      }
      got.push_back(std::move(in));
    }
    for (auto& in : got) inbox_.push_back(std::move(in));
    return true;
  }
  Reply next() {
    Reply r = inbox_.front().reply;
    said_ = std::move(inbox_.front().said);
    inbox_.pop_front();
    return r;
  }
  // ::poll for `events` on the socket, up to `timeoutMs` (0: it timed out).
  int pollFor(short events, unsigned timeoutMs) {
    pollfd p{fd_, events, 0};
    int rc;
    do rc = ::poll(&p, 1, static_cast<int>(timeoutMs));
    while (rc < 0 && errno == EINTR);
    return rc;
  }
  void stop() {
    stoppedByUs_ = true;
    ::kill(pid_, SIGKILL);
  }
  void noteExit(int status) {
    reaped_ = true;
    exit_ = describeExit(status);
    outsideSignal_ = WIFSIGNALED(status) && (WTERMSIG(status) == SIGKILL || WTERMSIG(status) == SIGTERM);
  }
  // Stopped (if it was not) and waited for, once.
  void reap() {
    if (reaped_) return;
    if (alive()) stop();
    if (reaped_) return;
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    noteExit(status);
  }

  pid_t pid_;
  int fd_;
  // A message of replies as received: at most kMaxReplies and one error message.
  std::array<std::byte, sizeof(Reply) * sandbox::kMaxReplies + sandbox::kMaxMessage> batch_{};
  struct Incoming {
    Reply reply;
    std::string said;  // its error message, if it failed
  };
  std::deque<Incoming> inbox_;  // received, not yet taken
  std::string said_;            // the error message of the reply taken last
  std::byte* window_;
  std::string dir_;
  bool reaped_ = false;
  bool templated_;
  bool stoppedByUs_ = false, outsideSignal_ = false;
  std::string exit_;
};

namespace {

class SandboxBuffer final : public hal::Buffer {
 public:
  SandboxBuffer(uint64_t size, uint64_t id, class SandboxDevice* device) : Buffer(size), id(id), device(device) {}
  ~SandboxBuffer() override;
  uint64_t id;
  SandboxDevice* device;
};

class SandboxProgram final : public hal::Program {
 public:
  SandboxProgram(std::string name, ProgramKind kind, uint64_t id, hal::ProgramDescription description, SandboxDevice* device)
      : Program(std::move(name), kind), id(id), description(std::move(description)), device(device) {}
  ~SandboxProgram() override;
  std::vector<std::string> kernels() const override {
    std::vector<std::string> names;
    for (auto& k : description.kernels) names.push_back(k.name);
    return names;
  }
  hal::ProgramDescription describe() const override { return description; }
  uint64_t id;
  hal::ProgramDescription description;
  SandboxDevice* device;
};

uint64_t idOf(const hal::Buffer& b) { return static_cast<const SandboxBuffer&>(b).id; }

Status statusOf(const Result<Reply>& r) {
  if (!r) return fail(r.error());
  return {};
}

class SandboxDevice final : public hal::Device {
 public:
  SandboxDevice(hal::Capabilities caps, std::unique_ptr<SandboxProcess> process, unsigned timeoutMs)
      : Device(std::move(caps)), process_(std::move(process)), timeoutMs_(timeoutMs) {}

  Status finish() override { return statusOf(call(request(Op::finish))); }
  bool timesKernels() const override {
    (void)ready();  // known from the sandbox's first message
    return timesKernels_;
  }
  // From the ring, without asking; the replies that have come meanwhile are read too.
  // In flight: what the sandbox says it has, and the posted work it has not answered.
  size_t takeCompleted(std::vector<hal::KernelTime>& out) override {
    if (!lost_.empty() || !ready_) return 0;
    if (!settlePosted(false) || !readRing(out)) return 0;
    return static_cast<size_t>(std::min<uint64_t>(process_->ring().pending.load(std::memory_order_acquire), 1u << 30)) +
           posted_.size();
  }
  // The sandbox puts what completed meanwhile in the ring (takeCompleted reads it).
  void waitCompleted(unsigned timeoutMs) override {
    if (!lost_.empty()) return;
    Request q = request(Op::wait);
    q.length = timeoutMs;
    (void)call(q);
  }
  std::vector<hal::DeferredError> takeDeferredErrors() override {
    if (lost_.empty()) (void)settlePosted(false);
    return std::exchange(deferred_, {});
  }
  std::string lost() const override { return lost_; }
  bool lostFromOutside() const override { return !lost_.empty() && (cardLost_ || process_->killedFromOutside()); }
  pid_t pid() const { return process_->pid(); }

  // A run of posted requests goes to the sandbox as one message (a receive and a wake-up
  // for the run, not for each), and the sandbox in turn plugs its device.
  void plug() override { plugged_ = true; }
  void unplug() override {
    plugged_ = false;
    if (lost_.empty()) (void)flushOutbox();
  }

  void releaseBuffer(uint64_t id) {
    Request q = request(Op::release);
    q.id = id;
    (void)submit(q);
  }
  void releaseProgram(uint64_t id) {
    Request q = request(Op::releaseProgram);
    q.id = id;
    (void)submit(q);
  }

 protected:
  Result<std::unique_ptr<hal::Buffer>> doAllocate(uint64_t bytes) override {
    Request q = request(Op::allocate);
    q.id = ++nextId_;
    q.length = bytes;
    if (auto r = call(q); !r) return fail(r.error());
    return std::unique_ptr<hal::Buffer>(new SandboxBuffer(bytes, q.id, this));
  }
  // Writes are posted (on every card): each goes into one half of the window and the call
  // returns without waiting for the sandbox, which copies it out while the next chunk
  // comes in and is copied into the other half. A half is reused once the reply of the
  // write that used it has come; a call that uses the window waits for every posted
  // reply first. A posted write that then fails (the arguments were checked here) loses
  // the device.
  Status doWrite(hal::Buffer& b, uint64_t offset, std::span<const std::byte> data) override {
    if (auto s = ready(); !s) return s;
    if (auto s = endReadAhead(); !s) return s;
    uint64_t done = 0;
    do {
      while (postedWrites_ >= 2)
        if (auto s = awaitPosted(); !s) return s;
      uint64_t n = std::min<uint64_t>(kHalf, data.size() - done);
      uint64_t at = nextHalf_ * kHalf;
      nextHalf_ ^= 1;
      if (n) std::memcpy(process_->window() + at, data.data() + done, n);
      Request q = request(Op::write);
      q.id = idOf(b);
      q.offset = offset + done;
      q.offset2 = at;
      q.payload = n;
      if (auto s = post(q); !s) return s;
      done += n;
    } while (done < data.size());
    return {};
  }
  // A piece the read-ahead fetched: waited for, copied out of its half, and that half
  // given the next piece. Anything else first ends the read-ahead.
  Status doRead(const hal::Buffer& b, uint64_t offset, std::span<std::byte> out) override {
    if (auto s = ready(); !s) return s;
    if (!ahead_.empty() && ahead_.front().id == idOf(b) && ahead_.front().offset == offset &&
        ahead_.front().length == out.size())
      return takeAhead(out);
    if (auto s = endReadAhead(); !s) return s;
    uint64_t done = 0;
    do {
      uint64_t n = std::min<uint64_t>(kWindowBytes, out.size() - done);
      Request q = request(Op::read);
      q.id = idOf(b);
      q.offset = offset + done;
      q.length = n;
      auto r = call(q);
      if (!r) return fail(r.error());
      if (r->payload != n) return fail(lose(shortRead(r->payload, n)));
      if (n) std::memcpy(out.data() + done, process_->window(), n);
      done += n;
    } while (done < out.size());
    return {};
  }
  void readAhead(const hal::Buffer& b, uint64_t offset, uint64_t length, uint64_t piece) override {
    if (!endReadAhead() || piece == 0 || piece > kHalf || length <= piece || offset > b.size() || length > b.size() - offset)
      return;
    while (postedWrites_ > 0)  // (the halves are the writes' until their replies come)
      if (!awaitPosted()) return;
    aheadBuffer_ = idOf(b);
    aheadNext_ = offset;
    aheadEnd_ = offset + length;
    aheadPiece_ = piece;
    for (uint64_t half : {uint64_t{0}, kHalf})
      if (!postAhead(half)) return;
  }

  Status doCopy(hal::Buffer& dst, uint64_t dstOffset, const hal::Buffer& src, uint64_t srcOffset, uint64_t length) override {
    Request q = request(Op::copy);
    q.id = idOf(dst);
    q.offset = dstOffset;
    q.id2 = idOf(src);
    q.offset2 = srcOffset;
    q.length = length;
    return submit(q);
  }
  Status doFill(hal::Buffer& b, uint64_t offset, uint64_t length, uint8_t value) override {
    Request q = request(Op::fill);
    q.id = idOf(b);
    q.offset = offset;
    q.length = length;
    q.offset2 = value;
    return submit(q);
  }

  Result<std::unique_ptr<hal::Program>> doLoadProgram(ProgramKind kind, const std::string& name,
                                                      std::span<const std::byte> code, const std::string& options) override {
    if (auto s = drainPosted(); !s) return fail(s.error());  // the window is about to be filled
    if (code.size() > sandbox::kMaxProgramBytes)
      return fail(Code::invalidArgument, "program '" + name + "' is " + std::to_string(code.size()) + " bytes; at most " +
                                             std::to_string(sandbox::kMaxProgramBytes) + " are accepted");
    // [u32 name bytes][name][u32 option bytes][options][code], a window at a time (all
    // but the last by `append`).
    std::string head = name.substr(0, std::min<size_t>(name.size(), 1024));
    std::vector<std::byte> all(8 + head.size() + options.size() + code.size());
    uint32_t nameBytes = static_cast<uint32_t>(head.size()), optionBytes = static_cast<uint32_t>(options.size());
    std::memcpy(all.data(), &nameBytes, 4);
    std::memcpy(all.data() + 4, head.data(), head.size());
    std::memcpy(all.data() + 4 + head.size(), &optionBytes, 4);
    std::memcpy(all.data() + 8 + head.size(), options.data(), options.size());
    if (!code.empty()) std::memcpy(all.data() + 8 + head.size() + options.size(), code.data(), code.size());
    uint64_t done = 0;
    while (all.size() - done > kWindowBytes) {
      std::memcpy(process_->window(), all.data() + done, kWindowBytes);
      Request q = request(Op::append);
      q.payload = kWindowBytes;
      if (auto r = call(q); !r) return fail(r.error());
      done += kWindowBytes;
    }
    std::memcpy(process_->window(), all.data() + done, all.size() - done);
    Request q = request(Op::loadProgram);
    q.id = ++nextId_;
    q.kind = static_cast<uint32_t>(kind);
    q.payload = all.size() - done;
    auto r = call(q);
    if (!r) return fail(r.error());
    // What its compiler said of it (hal::encodeDescription), checked as it is decoded.
    auto description = hal::decodeDescription(
        std::string_view(reinterpret_cast<const char*>(process_->window()), std::min<uint64_t>(r->payload, kWindowBytes)));
    if (!description) return fail(lose("the sandbox described program '" + name + "' unreadably"));
    return std::unique_ptr<hal::Program>(new SandboxProgram(name, kind, q.id, std::move(*description), this));
  }

  // A launch's arguments go after its Request in the message where they are small and
  // the card times its kernels (posted, as a tensor op), else through the window.
  Status doLaunch(hal::Program& program, const std::string& kernel, const hal::LaunchDims& dims,
                  std::span<const hal::KernelArg> args) override {
    if (auto s = ready(); !s) return s;
    // Where the card's compiler described every kernel and its arguments (OpenCL, CUDA C),
    // the name and the count are checked here, so those errors come with the call.
    if (const auto& described = static_cast<SandboxProgram&>(program).description; described.argumentsKnown) {
      const auto& kernels = described.kernels;
      auto found = std::find_if(kernels.begin(), kernels.end(), [&](auto& k) { return k.name == kernel; });
      if (found == kernels.end())
        return fail(Code::notFound, "no kernel '" + limits::clip(kernel, 128) + "' in program '" + program.name() + "'");
      if (found->args.size() != args.size())
        return fail(Code::invalidArgument, "kernel " + found->name + " takes " + std::to_string(found->args.size()) +
                                               " arguments, " + std::to_string(args.size()) + " given");
    }
    // [u32 name bytes][name][u32 grid[3]][u32 block[3]][u32 shared][u64 offset[3]]
    // [u32 flags: autoBlock in bit 0, workDim in bits 8-15][u32 count]
    // then per argument {u32 type, u32 bytes, u64 value, u64 buffer offset} and, for a
    // by-value argument, its bytes (for an image, its ImageDesc).
    const uint32_t nameBytes = static_cast<uint32_t>(std::min<size_t>(kernel.size(), 1024));
    size_t size = sizeof(Request) + 4 + nameBytes + 60;  // (room for the Request, if it goes with them)
    for (auto& a : args)
      size += 24 + (a.type == hal::KernelArg::Type::image ? sizeof a.image
                    : a.type == hal::KernelArg::Type::bytes ? a.bytes.size() : 0);
    std::vector<std::byte>& p = launchScratch_;  // (kept: no allocation per launch)
    p.resize(size);
    std::byte* at = p.data() + sizeof(Request);
    auto put = [&](const void* v, size_t n) {
      std::memcpy(at, v, n);
      at += n;
    };
    put(&nameBytes, 4);
    put(kernel.data(), nameBytes);
    put(dims.grid.data(), 12);
    put(dims.block.data(), 12);
    put(&dims.sharedBytes, 4);
    put(dims.offset.data(), 24);
    uint32_t flags = uint32_t{dims.autoBlock} | uint32_t{dims.workDim} << 8;
    put(&flags, 4);
    uint32_t count = static_cast<uint32_t>(args.size());
    put(&count, 4);
    for (auto& a : args) {
      const bool image = a.type == hal::KernelArg::Type::image;
      uint32_t type[2] = {static_cast<uint32_t>(a.type), static_cast<uint32_t>(image ? sizeof a.image : a.bytes.size())};
      put(type, 8);
      uint64_t value = 0;
      if (a.type == hal::KernelArg::Type::buffer || image) value = idOf(*a.buffer);
      else std::memcpy(&value, &a.scalar, sizeof value);
      put(&value, 8);
      put(&a.offset, 8);
      if (a.type == hal::KernelArg::Type::bytes) put(a.bytes.data(), a.bytes.size());
      if (image) put(&a.image, sizeof a.image);
    }
    assert(at == p.data() + p.size());
    const uint64_t bytes = p.size() - sizeof(Request);
    if (bytes > kWindowBytes) return fail(Code::invalidArgument, "launch of " + kernel + ": too many arguments");
    Request q = request(Op::launch);
    q.id = static_cast<SandboxProgram&>(program).id;
    q.payload = bytes;
    q.tag = kernelTag();
    if (timesKernels_ && bytes <= sandbox::kMaxInlineBytes) {
      Request* inline_ = new (p.data()) Request(q);
      return post(*inline_, p.data(), p.size());
    }
    if (auto s = drainPosted(); !s) return s;  // the window is about to be filled
    std::memcpy(process_->window(), p.data() + sizeof(Request), bytes);
    return statusOf(call(q));
  }

  Status doGemm(const hal::GemmArgs& g) override {
    Request q = request(Op::gemm);
    q.id = idOf(*g.a);
    q.id2 = idOf(*g.b);
    q.id3 = idOf(*g.c);
    q.m = g.m, q.n = g.n, q.k = g.k, q.alpha = g.alpha, q.beta = g.beta;
    q.tag = kernelTag();
    return submit(q);
  }
  Status doAxpy(uint64_t n, float alpha, const hal::Buffer& x, hal::Buffer& y) override {
    Request q = request(Op::axpy);
    q.id = idOf(x), q.id2 = idOf(y), q.length = n, q.alpha = alpha, q.tag = kernelTag();
    return submit(q);
  }
  Status doVadd(uint64_t n, const hal::Buffer& a, const hal::Buffer& b, hal::Buffer& out) override {
    Request q = request(Op::vadd);
    q.id = idOf(a), q.id2 = idOf(b), q.id3 = idOf(out), q.length = n, q.tag = kernelTag();
    return submit(q);
  }
  Status doReduceSum(uint64_t n, const hal::Buffer& in, hal::Buffer& out) override {
    Request q = request(Op::reduceSum);
    q.id = idOf(in), q.id2 = idOf(out), q.length = n, q.tag = kernelTag();
    return submit(q);
  }
  Status doTensor(const hal::LoweredTensorOp& lowered) override {
    const hal::TensorOp& op = lowered.op;
    sandbox::TensorRequest t;
    t.request = request(Op::tensor);
    t.request.tag = kernelTag();
    sandbox::TensorWindow& w = t.op;
    w.fn = static_cast<uint32_t>(op.fn), w.dims = op.dims, w.reduceMask = op.reduceMask, w.mean = op.mean;
    w.alpha = op.alpha, w.beta = op.beta, w.ignoreIndex = op.ignoreIndex, w.drawOrigin = op.drawOrigin;
    w.pre[0] = op.preScale, w.pre[1] = op.preShift, w.post[0] = op.postScale, w.post[1] = op.postShift;
    for (unsigned d = 0; d < hal::kMaxTensorDims; ++d) w.shape[d] = op.shape[d];
    for (unsigned i = 0; i < hal::tensorFnOperands(op.fn); ++i) {
      w.ids[i] = idOf(*op.operands[i].buffer);
      w.offsets[i] = op.operands[i].offset;
      w.types[i] = static_cast<uint32_t>(op.operands[i].type);
      for (unsigned d = 0; d < hal::kMaxTensorDims; ++d) w.strides[i][d] = op.operands[i].strides[d];
    }
    return submit(t.request, &t, sizeof t);
  }
  void doSetMemoryCap(uint64_t bytes) override {
    Request q = request(Op::memoryCap);
    q.length = bytes;
    (void)call(q);
  }

 private:
  static Request request(Op op) {
    Request q;
    q.op = op;
    return q;
  }

  Error lose(std::string why) const {
    if (lost_.empty()) lost_ = std::move(why);
    return Error{Code::internal, lost_};
  }
  // A reply that says the device context is lost, and by what.
  Error lostBy(const Reply& r, const std::optional<Error>& error) {
    const std::string said = error ? error->message : std::string();
    if (r.lost != sandbox::kLostByTheCard) return lose("the kernel faulted: " + said);
    if (lost_.empty()) cardLost_ = true;
    return lose("its card went away under it: " + said);
  }

  // One request, its reply; the sandbox's error as this call's; a lost device for good.
  // Waits for the sandbox's first message (the device is open) once.
  Status ready() const {
    if (!lost_.empty()) return fail(Code::internal, lost_);
    if (ready_) return {};
    auto r = process_->awaitReply(timeoutMs_);
    if (!r) return fail(lose(r.error().message));
    if (r->code != 0) return fail(lose("the sandbox could not open the card: " + process_->said()));
    ready_ = true;
    timesKernels_ = r->timesKernels != 0;
    return {};
  }

  // A posted request whose reply has not been read yet.
  struct Posted {
    uint64_t serial = 0, tag = 0;
    Op op{};
  };
  // Posted requests past which a post first reads the oldest reply. The sandbox answers a
  // run's requests once it has taken them all, so this is well above the card worker's
  // queue depth (64 alone by default): at 64, a run of tiny kernels through the ICD waited
  // here for answers, at 0.82x the rate it has at 256.
  static constexpr size_t kMaxPosted = 256;

  // A reply must answer the request due (an extra or unasked one stops the sandbox).
  Status due(const Reply& r, uint64_t serial) {
    if (r.serial == serial) return {};
    return fail(lose(process_->violated("a reply to request " + std::to_string(r.serial) + " where " +
                                        std::to_string(serial) + " was due").message));
  }

  // The error a reply carries (the window holds its message), or none.
  std::optional<Error> errorOf(const Reply& r) {
    if (r.code == 0) return std::nullopt;
    Code code = r.code <= static_cast<uint32_t>(Code::internal) ? static_cast<Code>(r.code) : Code::internal;
    return Error{code, process_->said(),
                 validOpenclError(r.openclError)};
  }

  // The oldest posted request's reply `r`: a fault loses the device, a failed write too
  // (its arguments were checked here), any other failure waits for takeDeferredErrors().
  Status settle(const Reply& r) {
    if (posted_.size() <= unsent_)  // every request posted is still in the outbox
      return fail(lose(process_->violated("a reply to request " + std::to_string(r.serial) + ", which it was not sent").message));
    const Posted p = posted_.front();
    if (auto s = due(r, p.serial); !s) return s;
    posted_.pop_front();
    if (p.op == Op::write) --postedWrites_;
    auto error = errorOf(r);
    if (r.lost) return fail(lostBy(r, error));
    if (p.op == Op::read) return settleAhead(r, p.serial, std::move(error));
    if (!error || p.op == Op::release || p.op == Op::releaseProgram) return {};  // (a release answers to no instruction)
    if (p.op == Op::write) return fail(lose("a write the sandbox had taken failed: " + error->message));
    if (deferred_.size() < kMaxPosted * 4) deferred_.push_back({p.tag, std::move(*error)});
    return {};
  }
  // The oldest posted request's reply, waited for (the outbox goes first). `spin`: as
  // SandboxProcess::awaitReply's (a call waits on it, not only a full queue).
  Status awaitPosted(bool spin = true) {
    if (auto s = flushOutbox(); !s) return s;
    return awaitSent(spin);
  }
  // The oldest sent request's reply, waited for.
  Status awaitSent(bool spin = true) {
    auto r = process_->awaitReply(timeoutMs_, spin);
    if (!r) return fail(lose(r.error().message));
    return settle(*r);
  }
  // The posted replies that have come (all of them, waiting, with `wait`).
  bool settlePosted(bool wait) {
    while (!posted_.empty()) {
      if (wait) {
        if (!awaitPosted()) return false;
        continue;
      }
      auto r = process_->poll();
      if (!r) return (void)lose(r.error().message), false;
      if (!*r) return true;
      if (!settle(**r)) return false;
    }
    return true;
  }
  // Every posted reply: before a call that waits for its own, or that fills the window
  // (a read-ahead ends: its pieces are dropped).
  Status drainPosted() {
    if (auto s = ready(); !s) return s;
    if (!settlePosted(true)) return fail(Code::internal, lost_);
    return endReadAhead();  // (every piece is answered now: nothing waits)
  }

  // Sends `q` and returns at once, its reply read later. `message` (`bytes` long) begins
  // with `q` itself (a tensor request: its op follows); none: `q` alone. A full socket,
  // or kMaxPosted requests unanswered, first reads the oldest reply.
  // Plugged, it goes in the outbox, sent with the others of the run (unplug(), a full
  // outbox, or anything that waits for a reply).
  Status post(Request& q, const void* message = nullptr, size_t bytes = 0) {
    if (auto s = ready(); !s) return s;
    while (posted_.size() >= kMaxPosted)
      if (auto s = awaitPosted(false); !s) return s;
    if (!message) message = &q, bytes = sizeof q;
    if (plugged_ && outbox_.size() + bytes > sandbox::kMaxBatchBytes)
      if (auto s = flushOutbox(); !s) return s;
    q.serial = ++serial_;
    q.inlineBytes = static_cast<uint32_t>(bytes - sizeof q);
    if (plugged_) {
      auto* b = static_cast<const std::byte*>(message);
      outbox_.insert(outbox_.end(), b, b + bytes);
      ++unsent_;
    } else if (auto s = deliver(message, bytes); !s) {
      return s;
    }
    posted_.push_back({q.serial, q.tag, q.op});
    if (q.op == Op::write) ++postedWrites_;
    // A write goes at once: the sandbox copies it out while the next half fills (and a
    // read ahead: it fills one half while the other is copied out).
    return unsent_ >= sandbox::kMaxBatchRequests || q.op == Op::write || q.op == Op::read ? flushOutbox() : Status{};
  }
  // Sends one message of requests; a full socket first reads the oldest reply of those
  // sent (the sandbox reads nothing until its replies are read).
  Status deliver(const void* message, size_t bytes) {
    for (;;) {
      auto sent = process_->offer(message, bytes);
      if (!sent) return fail(lose(sent.error().message));
      if (*sent) return {};
      if (posted_.size() > unsent_) {
        if (auto s = awaitSent(false); !s) return s;
      } else if (!process_->awaitRoom(timeoutMs_)) {
        return fail(lose("the sandbox took no request for " + std::to_string(timeoutMs_) + " ms and was stopped"));
      }
    }
  }
  Status flushOutbox() {
    if (unsent_ == 0) return {};
    Status s = deliver(outbox_.data(), outbox_.size());
    outbox_.clear();
    unsent_ = 0;
    return s;
  }
  // Work that only queues: posted on a card that times its kernels (their time is
  // charged as they complete), a call elsewhere (the call's own time is what is charged).
  Status submit(Request& q, const void* message = nullptr, size_t bytes = 0) {
    if (auto s = ready(); !s) return s;
    if (timesKernels_) return post(q, message, bytes);
    return statusOf(exchange(q, message ? message : &q, message ? bytes : sizeof q));
  }

  Result<Reply> call(Request q) { return exchange(q, &q, sizeof q); }
  // One request and its reply; `message` begins with `q` (as post's). It goes behind the
  // posted requests, in the same message as those still in the outbox, and their replies
  // are read as they come before its own: a run and the call that ends it (a fence, a
  // read) cost one round trip, not two. (A call that fills the window drains the posted
  // replies itself first: their writes' halves are in it.)
  Result<Reply> exchange(Request& q, const void* message, size_t bytes) {
    if (auto s = endReadAhead(); !s) return fail(s.error());
    if (auto s = ready(); !s) return fail(s.error());
    q.serial = ++serial_;
    q.inlineBytes = static_cast<uint32_t>(bytes - sizeof q);
    if (unsent_ > 0 && outbox_.size() + bytes <= sandbox::kMaxBatchBytes) {
      auto* b = static_cast<const std::byte*>(message);
      outbox_.insert(outbox_.end(), b, b + bytes);
      if (auto s = flushOutbox(); !s) return fail(s.error());
    } else if (auto s = flushOutbox(); !s) {
      return fail(s.error());
    } else if (auto d = deliver(message, bytes); !d) {
      return fail(d.error());
    }
    if (!settlePosted(true)) return fail(Code::internal, lost_);
    auto r = process_->awaitReply(timeoutMs_, q.op != Op::wait);  // (a wait for completions waits long)
    if (!r) return fail(lose(r.error().message));
    if (auto s = due(*r, q.serial); !s) return fail(s.error());
    auto error = errorOf(*r);
    if (r->lost) return fail(lostBy(*r, error));
    if (error) return std::unexpected(std::move(*error));
    return *r;
  }

  // Read-ahead: pieces posted as reads into the window's halves, in order.
  struct AheadPiece {
    uint64_t serial = 0, id = 0, offset = 0, length = 0, half = 0;
    bool answered = false;
    std::optional<Error> error;
  };
  // Posts the next piece into `half` (none left: nothing).
  bool postAhead(uint64_t half) {
    if (aheadNext_ >= aheadEnd_) return true;
    Request q = request(Op::read);
    q.id = aheadBuffer_;
    q.offset = aheadNext_;
    q.length = std::min(aheadPiece_, aheadEnd_ - aheadNext_);
    q.offset2 = half;
    if (!post(q)) return false;
    ahead_.push_back({q.serial, q.id, q.offset, q.length, half});
    aheadNext_ += q.length;
    return true;
  }
  // A posted read's reply: its piece is in its half (the sandbox must fill it whole).
  Status settleAhead(const Reply& r, uint64_t serial, std::optional<Error> error) {
    auto it = std::find_if(ahead_.begin(), ahead_.end(), [&](const AheadPiece& a) { return a.serial == serial; });
    if (it == ahead_.end()) return {};  // (one ended meanwhile)
    if (!error && r.payload != it->length)
      return fail(lose(process_->violated(shortRead(r.payload, it->length)).message));
    it->answered = true;
    it->error = std::move(error);
    return {};
  }
  Status takeAhead(std::span<std::byte> out) {
    while (!ahead_.front().answered)
      if (auto s = awaitPosted(); !s) return s;
    AheadPiece piece = std::move(ahead_.front());
    ahead_.pop_front();
    if (piece.error) {
      (void)endReadAhead();
      return fail(*piece.error);
    }
    std::memcpy(out.data(), process_->window() + piece.half, out.size());
    if (!postAhead(piece.half)) return fail(Code::internal, lost_);  // (the half is free again)
    return {};
  }
  // Ends a read-ahead: the pieces still posted are waited for and dropped.
  Status endReadAhead() {
    aheadNext_ = aheadEnd_ = 0;
    while (!ahead_.empty()) {
      if (!ahead_.back().answered) {
        if (auto s = awaitPosted(); !s) return s;
        continue;
      }
      ahead_.pop_back();
    }
    return {};
  }

  // The kernel times the sandbox has put in the ring since the last look.
  bool readRing(std::vector<hal::KernelTime>& out) {
    sandbox::CompletionRing& ring = process_->ring();
    const uint64_t head = ring.head.load(std::memory_order_acquire);
    if (head < ringTail_ || head - ringTail_ > sandbox::kRingEntries) {
      (void)lose(process_->violated("a completion ring of " + std::to_string(head) + " entries, " +
                                    std::to_string(ringTail_) + " read, " + std::to_string(sandbox::kRingEntries) + " slots")
                     .message);
      return false;
    }
    for (uint64_t i = ringTail_; i < head; ++i) out.push_back(ring.slots[i % sandbox::kRingEntries]);
    ringTail_ = head;
    ring.tail.store(head, std::memory_order_release);
    return true;
  }

  std::unique_ptr<SandboxProcess> process_;
  unsigned timeoutMs_;
  mutable bool ready_ = false, timesKernels_ = false;
  uint64_t nextId_ = 0;
  static constexpr uint64_t kHalf = kWindowBytes / 2;
  std::deque<Posted> posted_;
  unsigned postedWrites_ = 0;  // of posted_: the window's halves in use
  std::deque<AheadPiece> ahead_;  // posted, in order (each in its half until taken)
  uint64_t aheadBuffer_ = 0, aheadNext_ = 0, aheadEnd_ = 0, aheadPiece_ = 0;
  // Plugged: posted requests wait in the outbox, one message's worth; the last unsent_
  // of posted_ are there.
  bool plugged_ = false;
  std::vector<std::byte> outbox_;
  std::vector<std::byte> launchScratch_;  // a launch's request, built by doLaunch
  unsigned unsent_ = 0;
  unsigned nextHalf_ = 0;
  uint64_t serial_ = 0;    // the last request's
  uint64_t ringTail_ = 0;  // ring entries read
  std::vector<hal::DeferredError> deferred_;
  mutable std::string lost_;
  bool cardLost_ = false;  // the sandbox said its card went away under it (kLostByTheCard)
};

SandboxBuffer::~SandboxBuffer() { device->releaseBuffer(id); }
SandboxProgram::~SandboxProgram() { device->releaseProgram(id); }

std::atomic<uint64_t> sandboxSerial{0};

}  // namespace

pid_t SandboxPool::pidOf(const hal::Device& device) {
  auto* d = dynamic_cast<const SandboxDevice*>(&device);
  return d ? d->pid() : 0;
}

std::string defaultSandboxExecutable() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "raccel-sandbox";
  return (self.parent_path() / "raccel-sandbox").string();
}

SandboxPool::SandboxPool(hal::Capabilities caps, SandboxSettings settings, std::string label)
    : caps_(std::move(caps)), settings_(std::move(settings)), label_(std::move(label)) {
  if (settings_.executable.empty()) settings_.executable = defaultSandboxExecutable();
  if (caps_.backend == "opencl")
    template_.emplace(settings_.dir + "/kernel-template",
                      KernelTemplate::nameFor(caps_.backend, caps_.deviceIndex, caps_.model, caps_.driverVersion));
  if (template_) template_->prune();
  // Folders left by the sandboxes of a netaccel that is gone (named PID-N) are removed.
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(settings_.dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    char* end = nullptr;
    long pid = std::strtol(name.c_str(), &end, 10);
    if (pid <= 0 || !end || *end != '-') continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code rm;
      std::filesystem::remove_all(it->path(), rm);
    }
  }
  refill();
}

SandboxPool::~SandboxPool() = default;

void SandboxPool::refill() {
  while (warm_.size() < settings_.warm) {
    auto p = spawn();
    if (!p) {
      RLOG_ERROR("netaccel") << label_ << ": cannot start a sandbox: " << p.error().message;
      return;
    }
    warm_.push_back(std::move(*p));
  }
}

std::unique_ptr<hal::Device> SandboxPool::take() {
  std::unique_ptr<SandboxProcess> process;
  while (!warm_.empty() && !process) {
    auto p = std::move(warm_.front());
    warm_.erase(warm_.begin());
    if (!p->alive()) RLOG_WARN("netaccel") << label_ << ": a warm sandbox had ended (" << p->gone() << "); taking another";
    else if (!p->templated() && template_ && template_->ready())  // (once: it started before the template was)
      RLOG_INFO("netaccel") << label_ << ": the kernel template is ready; starting a sandbox with it";
    else process = std::move(p);
  }
  if (!process) {
    auto p = spawn();
    if (!p) {
      // A device that says why on every call, so the tenant's instructions fail clearly.
      struct Unstarted final : hal::Device {
        Unstarted(hal::Capabilities caps, std::string why) : Device(std::move(caps)), why_(std::move(why)) {}
        Status finish() override { return fail(Code::unavailable, why_); }
        std::string lost() const override { return why_; }
        Result<std::unique_ptr<hal::Buffer>> doAllocate(uint64_t) override { return fail(Code::unavailable, why_); }
        Status doWrite(hal::Buffer&, uint64_t, std::span<const std::byte>) override { return fail(Code::unavailable, why_); }
        Status doRead(const hal::Buffer&, uint64_t, std::span<std::byte>) override { return fail(Code::unavailable, why_); }
        Status doCopy(hal::Buffer&, uint64_t, const hal::Buffer&, uint64_t, uint64_t) override { return fail(Code::unavailable, why_); }
        Status doFill(hal::Buffer&, uint64_t, uint64_t, uint8_t) override { return fail(Code::unavailable, why_); }
        Status doGemm(const hal::GemmArgs&) override { return fail(Code::unavailable, why_); }
        Status doAxpy(uint64_t, float, const hal::Buffer&, hal::Buffer&) override { return fail(Code::unavailable, why_); }
        Status doVadd(uint64_t, const hal::Buffer&, const hal::Buffer&, hal::Buffer&) override { return fail(Code::unavailable, why_); }
        Status doReduceSum(uint64_t, const hal::Buffer&, hal::Buffer&) override { return fail(Code::unavailable, why_); }
        std::string why_;
      };
      return std::make_unique<Unstarted>(caps_, "cannot start a sandbox for this card: " + p.error().message);
    }
    process = std::move(*p);
  }
  auto device = std::make_unique<SandboxDevice>(caps_, std::move(process), settings_.callTimeoutMs);
  refill();
  return device;
}

// The command that builds the card's kernel template: the sandbox, told the card as its
// tenants' sandboxes are (the same device, model and so cache entries).
std::vector<std::string> SandboxPool::templateBuilder() const {
  std::vector<std::string> command = {settings_.executable, "--precompile", "--backend=" + caps_.backend,
                                      "--device=" + std::to_string(caps_.deviceIndex), "--model=" + caps_.model,
                                      "--tflops=" + std::to_string(caps_.tflops)};
  for (auto& r : settings_.readable) command.push_back("--read=" + r);  // (confined as its tenants' are)
  return command;
}

Result<std::unique_ptr<SandboxProcess>> SandboxPool::spawn() {
  std::error_code ec;
  if (std::filesystem::create_directories(settings_.dir, ec)) ::chmod(settings_.dir.c_str(), 0700);  // (ours alone)
  if (ec) return fail(Code::internal, "cannot create " + settings_.dir + ": " + ec.message());
  std::string dir = settings_.dir + "/" + std::to_string(::getpid()) + "-" + std::to_string(++sandboxSerial);
  if (::mkdir(dir.c_str(), 0700) != 0) return fail(Code::internal, "cannot create " + dir + ": " + std::strerror(errno));
  if (template_) template_->build(templateBuilder());
  // Sealed at its size: a sandbox that shrank it would make the netaccel's next access
  // to the window fault (SIGBUS) and take every tenant down.
  int memfd = ::memfd_create("raccel-sandbox-window", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0 || ::ftruncate(memfd, sandbox::kMappedBytes) != 0 ||
      ::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    if (memfd >= 0) ::close(memfd);
    std::filesystem::remove_all(dir, ec);
    return fail(Code::resourceExhausted, std::string("memfd_create: ") + std::strerror(errno));
  }
  void* window = ::mmap(nullptr, sandbox::kMappedBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  int fds[2];
  if (window == MAP_FAILED || ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    std::string why = std::strerror(errno);
    if (window != MAP_FAILED) ::munmap(window, sandbox::kMappedBytes);
    ::close(memfd);
    std::filesystem::remove_all(dir, ec);
    return fail(Code::resourceExhausted, "sandbox window: " + why);
  }
  // The child's fds 3 and 4 are made from these by dup2: neither may already be 3 or 4.
  auto high = [](int& fd) {
    if (fd > 4) return;
    int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 5);
    ::close(fd);
    fd = moved;
  };
  high(fds[1]);
  high(memfd);
  std::vector<std::string> args = {settings_.executable,
                                   "--backend=" + caps_.backend,
                                   "--device=" + std::to_string(caps_.deviceIndex),
                                   "--kind=" + std::string(kindName(caps_.kind)),
                                   "--model=" + caps_.model,
                                   "--tflops=" + std::to_string(caps_.tflops),
                                   "--memory=" + std::to_string(caps_.memoryBytes),
                                   "--host-memory=" + std::to_string(settings_.hostMemoryBytes),
                                   "--workdir=" + dir,
                                   "--fd=3",
                                   "--window-fd=4"};
  if (!caps_.images.supported()) args.push_back("--no-images");
  const bool templated = template_ && template_->ready();
  if (templated) {
    template_->markUsed();
    args.push_back("--kernel-template=" + template_->path());
  }
  for (auto& r : settings_.readable) args.push_back("--read=" + r);
  auto pid = spawnProgram(std::move(args), [&](posix_spawn_file_actions_t* a) {
    posix_spawn_file_actions_adddup2(a, fds[1], 3);
    posix_spawn_file_actions_adddup2(a, memfd, 4);
  });
  ::close(fds[1]);
  ::close(memfd);
  if (!pid) {
    ::close(fds[0]);
    ::munmap(window, sandbox::kMappedBytes);
    std::filesystem::remove_all(dir, ec);
    return fail(pid.error());
  }
  RLOG_DEBUG("netaccel") << label_ << ": sandbox " << *pid << " started in " << dir;
  return std::make_unique<SandboxProcess>(*pid, fds[0], static_cast<std::byte*>(window), dir, templated);
}

}  // namespace raccel::netaccel
