// The sandbox's side of netaccel/sandbox.h: raccel-sandbox (and nothing else) runs
// serveSandbox, which answers the netaccel's requests on one card for one tenant.
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "netaccel/sandbox.h"

namespace raccel::netaccel {

using sandbox::inWindow;
using sandbox::kWindowBytes;
using sandbox::Op;
using sandbox::Reply;
using sandbox::Request;

namespace {
// Moves what completed into the ring, as far as the netaccel has made room, and says
// how many kernels are in flight.
void publish(sandbox::CompletionRing& ring, hal::Device& device, std::vector<hal::KernelTime>& completed) {
  const size_t inFlight = device.takeCompleted(completed);
  const uint64_t head = ring.head.load(std::memory_order_relaxed), tail = ring.tail.load(std::memory_order_acquire);
  const uint64_t room = head >= tail && head - tail <= sandbox::kRingEntries ? sandbox::kRingEntries - (head - tail) : 0;
  const size_t n = std::min<size_t>(completed.size(), room);
  for (size_t i = 0; i < n; ++i) ring.slots[(head + i) % sandbox::kRingEntries] = completed[i];
  completed.erase(completed.begin(), completed.begin() + static_cast<long>(n));
  ring.head.store(head + n, std::memory_order_release);
  ring.pending.store(inFlight + completed.size(), std::memory_order_release);
}

// Requests that only queue work on the device: what a plugged device may hold.
bool queuesOnly(Op op) {
  switch (op) {
    case Op::launch: case Op::tensor: case Op::gemm: case Op::axpy: case Op::vadd: case Op::reduceSum: case Op::copy:
    case Op::fill:
      return true;
    default:
      return false;
  }
}

// Set by noteCardReset (a signal handler): read after every request.
std::atomic<bool> cardReset{false};
static_assert(std::atomic<bool>::is_always_lock_free);

// What a launch request carries (after its Request in the message, or in the window):
// [u32 name bytes][name][u32 grid[3]][u32 block[3]][u32 shared][u64 offset[3]]
// [u32 flags: autoBlock in bit 0, workDim in bits 8-15][u32 count], then per argument
// {u32 type, u32 bytes, u64 value, u64 buffer offset} and a by-value argument's bytes.
class LaunchReader {
 public:
  LaunchReader(const std::byte* from, uint64_t bytes) : from_(from), bytes_(bytes) {}
  bool take(void* v, size_t bytes) {
    if (bytes_ - at_ < bytes) return false;
    std::memcpy(v, from_ + at_, bytes);
    at_ += bytes;
    return true;
  }
  // The next `bytes` in place (they hold still until the reply), or none past the end.
  bool span(size_t bytes, std::span<const std::byte>& out) {
    if (bytes > bytes_ - at_) return false;
    out = std::span(from_ + at_, bytes);
    at_ += bytes;
    return true;
  }

 private:
  const std::byte* from_;
  uint64_t bytes_, at_ = 0;
};

// One tenant's buffers and programs on the sandbox's card, and what each request does
// to them. Every id and number comes from the netaccel and is checked here.
class Server {
 public:
  Server(std::byte* window, hal::Device& device) : window_(window), device_(device) {}

  // Carries out `q`, with the bytes that followed it in its message; what the reply
  // leaves in the window is r.payload.
  Status handle(const Request& q, std::span<const std::byte> extra, Reply& r) {
    switch (q.op) {
      case Op::allocate: return allocate(q);
      case Op::release: release(q); return {};
      case Op::write: case Op::read: return transfer(q, r);
      case Op::copy: case Op::fill: return copyOrFill(q);
      case Op::append:
        if (staged_.size() + q.payload > sandbox::kMaxProgramBytes + 4096) return fail(Code::invalidArgument, "program too large");
        staged_.insert(staged_.end(), window_, window_ + q.payload);
        return {};
      case Op::loadProgram: return loadProgram(q, r);
      case Op::releaseProgram: programs_.erase(q.id); return {};
      case Op::launch: return launch(q, extra);
      case Op::gemm: case Op::axpy: case Op::vadd: case Op::reduceSum: return builtin(q);
      case Op::tensor: return tensor(extra);
      case Op::finish: return device_.finish();
      case Op::wait:  // (every request's answer puts what completed in the ring)
        device_.waitCompleted(static_cast<unsigned>(std::min<uint64_t>(q.length, 60000)));
        return {};
      case Op::memoryCap: device_.setMemoryCap(q.length); return {};
      default: return fail(Code::invalidArgument, "unknown sandbox request " + std::to_string(static_cast<uint32_t>(q.op)));
    }
  }

 private:
  Result<hal::Buffer*> buffer(uint64_t id) {
    auto it = buffers_.find(id);
    if (it == buffers_.end()) return fail(Code::notFound, "no buffer " + std::to_string(id) + " in this sandbox");
    return it->second.get();
  }

  Status allocate(const Request& q) {
    auto b = device_.allocate(q.length);
    if (!b) return fail(b.error());
    buffers_[q.id] = std::move(*b);
    return {};
  }
  void release(const Request& q) {
    if (auto it = buffers_.find(q.id); it != buffers_.end()) {
      device_.release(std::move(it->second));
      buffers_.erase(it);
    }
  }

  // A write comes from offset2 in the window (the netaccel alternates halves); a read
  // goes to offset2 (0, or a read-ahead's half).
  Status transfer(const Request& q, Reply& r) {
    const bool write = q.op == Op::write;
    if (!inWindow(q.offset2, write ? q.payload : q.length))
      return fail(Code::invalidArgument, write ? "write past the window" : "read past the window");
    auto b = buffer(q.id);
    if (!b) return fail(b.error());
    if (write) return device_.write(**b, q.offset, std::span(window_ + q.offset2, q.payload));
    auto s = device_.read(**b, q.offset, std::span(window_ + q.offset2, q.length));
    if (s) r.payload = q.length;
    return s;
  }

  Status copyOrFill(const Request& q) {
    auto d = buffer(q.id);
    if (!d) return fail(d.error());
    if (q.op == Op::fill) return device_.fill(**d, q.offset, q.length, static_cast<uint8_t>(q.offset2));
    auto src = buffer(q.id2);
    if (!src) return fail(src.error());
    return device_.copy(**d, q.offset, **src, q.offset2, q.length);
  }

  // The staged code, then the window's last part of it: [u32 name bytes][u32 option
  // bytes after the name][name][options][code]. The reply's window holds the program's
  // description.
  Status loadProgram(const Request& q, Reply& r) {
    staged_.insert(staged_.end(), window_, window_ + q.payload);
    auto s = loadStaged(q, r);
    staged_.clear();
    return s;
  }
  Status loadStaged(const Request& q, Reply& r) {
    uint32_t nameBytes = 0, optionBytes = 0;
    if (staged_.size() >= 4) std::memcpy(&nameBytes, staged_.data(), 4);
    if (staged_.size() >= 8 && nameBytes <= staged_.size() - 8) std::memcpy(&optionBytes, staged_.data() + 4 + nameBytes, 4);
    if (staged_.size() < 8 || nameBytes > staged_.size() - 8 || optionBytes > staged_.size() - 8 - nameBytes)
      return fail(Code::invalidArgument, "malformed program");
    std::string name(reinterpret_cast<const char*>(staged_.data()) + 4, nameBytes);
    std::string options(reinterpret_cast<const char*>(staged_.data()) + 8 + nameBytes, optionBytes);
    const size_t head = 8 + nameBytes + optionBytes;
    auto p = device_.loadProgram(static_cast<ProgramKind>(q.kind), name, std::span(staged_.data() + head, staged_.size() - head),
                                 options);
    if (!p) return fail(p.error());
    std::string description = hal::encodeDescription((*p)->describe());
    if (description.size() > kWindowBytes)
      return fail(Code::invalidArgument, "program '" + name + "' has more kernels and arguments than can be described");
    r.payload = description.size();
    std::memcpy(window_, description.data(), r.payload);
    programs_[q.id] = std::move(*p);
    return {};
  }

  // A launch's arguments follow its Request where they are small, else are in the window.
  Status launch(const Request& q, std::span<const std::byte> extra) {
    if (!extra.empty() && extra.size() != q.payload) return fail(Code::invalidArgument, "malformed launch");
    LaunchReader in(extra.empty() ? window_ : extra.data(), q.payload);  // still until the reply
    std::string name;
    hal::LaunchDims dims;
    uint32_t nameBytes = 0, flags = 0, count = 0;
    std::span<const std::byte> nameIn;
    bool ok = in.take(&nameBytes, 4) && in.span(nameBytes, nameIn);
    if (ok) {
      name.assign(reinterpret_cast<const char*>(nameIn.data()), nameIn.size());
      ok = in.take(dims.grid.data(), 12) && in.take(dims.block.data(), 12) && in.take(&dims.sharedBytes, 4) &&
           in.take(dims.offset.data(), 24) && in.take(&flags, 4) && in.take(&count, 4);
      dims.autoBlock = flags & 1;
      dims.workDim = static_cast<uint8_t>(flags >> 8);
    }
    std::vector<hal::KernelArg> args;
    for (uint32_t i = 0; ok && i < count; ++i) {
      auto a = argument(in);
      if (!a) return fail(a.error());
      if (!a->has_value()) ok = false;
      else args.push_back(**a);
    }
    if (!ok) return fail(Code::invalidArgument, "malformed launch");
    auto program = programs_.find(q.id);
    if (program == programs_.end()) return fail(Code::notFound, "no program " + std::to_string(q.id) + " in this sandbox");
    return device_.launch(*program->second, name, dims, args);
  }
  // One launch argument; none where the bytes do not parse, an error for a buffer that
  // is not here.
  Result<std::optional<hal::KernelArg>> argument(LaunchReader& in) {
    uint32_t type[2];
    uint64_t value;
    hal::KernelArg a;
    if (!in.take(type, 8) || !in.take(&value, 8) || !in.take(&a.offset, 8) ||
        type[0] > static_cast<uint32_t>(hal::KernelArg::Type::sampler))
      return std::optional<hal::KernelArg>();
    a.type = static_cast<hal::KernelArg::Type>(type[0]);
    if (a.type == hal::KernelArg::Type::bytes && !in.span(type[1], a.bytes)) return std::optional<hal::KernelArg>();
    if (a.type == hal::KernelArg::Type::image && (type[1] != sizeof a.image || !in.take(&a.image, sizeof a.image)))
      return std::optional<hal::KernelArg>();  // (the image itself is checked by Device::launch)
    if (a.type == hal::KernelArg::Type::buffer || a.type == hal::KernelArg::Type::image) {
      auto b = buffer(value);
      if (!b) return fail(b.error());
      a.buffer = *b;
    } else {
      std::memcpy(&a.scalar, &value, sizeof value);
    }
    return std::optional<hal::KernelArg>(a);
  }

  Status builtin(const Request& q) {
    auto a = buffer(q.id), b = buffer(q.id2);
    switch (q.op) {
      case Op::gemm: {
        auto c = buffer(q.id3);
        if (!a || !b || !c) return fail(Code::notFound, "gemm: no such buffer in this sandbox");
        return device_.gemm({q.m, q.n, q.k, q.alpha, q.beta, *a, *b, *c});
      }
      case Op::axpy:
        if (!a || !b) return fail(Code::notFound, "axpy: no such buffer in this sandbox");
        return device_.axpy(q.length, q.alpha, **a, **b);
      case Op::vadd: {
        auto out = buffer(q.id3);
        if (!a || !b || !out) return fail(Code::notFound, "vadd: no such buffer in this sandbox");
        return device_.vadd(q.length, **a, **b, **out);
      }
      default:  // reduceSum
        if (!a || !b) return fail(Code::notFound, "reduceSum: no such buffer in this sandbox");
        return device_.reduceSum(q.length, **a, **b);
    }
  }

  // A tensor op's TensorWindow follows its Request in the message.
  Status tensor(std::span<const std::byte> extra) {
    sandbox::TensorWindow w;
    if (extra.size() != sizeof w) return fail(Code::invalidArgument, "malformed tensor op");
    std::memcpy(&w, extra.data(), sizeof w);
    if (w.fn >= hal::kTensorFns || w.dims > hal::kMaxTensorDims) return fail(Code::invalidArgument, "malformed tensor op");
    hal::TensorOp op;
    op.fn = static_cast<hal::TensorFn>(w.fn);
    op.dims = w.dims, op.reduceMask = w.reduceMask, op.mean = w.mean != 0;
    op.alpha = w.alpha, op.beta = w.beta, op.ignoreIndex = w.ignoreIndex, op.drawOrigin = w.drawOrigin;
    op.preScale = w.pre[0], op.preShift = w.pre[1], op.postScale = w.post[0], op.postShift = w.post[1];
    for (unsigned d = 0; d < hal::kMaxTensorDims; ++d) op.shape[d] = w.shape[d];
    for (unsigned i = 0; i < hal::tensorFnOperands(op.fn); ++i) {
      auto b = buffer(w.ids[i]);
      if (!b) return fail(Code::notFound, std::string("tensor op: operand ") + std::to_string(i) + ": " + b.error().message);
      if (w.types[i] >= hal::kTensorTypes) return fail(Code::invalidArgument, "malformed tensor op");
      op.operands[i] = {*b, w.offsets[i], {}, static_cast<hal::TensorType>(w.types[i] & 0xff)};
      for (unsigned d = 0; d < hal::kMaxTensorDims; ++d) op.operands[i].strides[d] = w.strides[i][d];
    }
    return device_.tensor(op);
  }

  std::byte* window_;
  hal::Device& device_;
  std::unordered_map<uint64_t, std::unique_ptr<hal::Buffer>> buffers_;
  std::unordered_map<uint64_t, std::unique_ptr<hal::Program>> programs_;
  std::vector<std::byte> staged_;  // program code arriving by `append`
};
}  // namespace

void noteCardReset() { cardReset.store(true, std::memory_order_relaxed); }

namespace {
// The sandbox's side of its socket: messages of requests in, each carried out in order;
// replies held back while more requests wait, then sent as one message.
class Loop {
 public:
  Loop(int fd, std::byte* window, hal::Device& device)
      : fd_(fd), ring_(*sandbox::ringOf(window)), server_(window, device), device_(device), received_(sandbox::kMaxBatchBytes) {
    replies_.reserve(sandbox::kMaxReplies);
  }

  // 0: the netaccel closed the socket; 3: the device was lost (the last reply says so);
  // 1: the socket broke or a message was malformed.
  int run() {
    Reply ready;
    ready.timesKernels = device_.timesKernels();
    replies_.push_back(ready);
    if (!flush()) return 1;
    for (;;) {
      if (auto ended = awaitRequests()) return *ended;
      Request q;
      std::span<const std::byte> extra;
      if (!sandbox::nextRequest(rest_, q, extra)) return 1;
      const Reply r = carryOut(q, extra);
      if (!answer(r, q.op)) return 1;
      if (r.lost) return 3;
    }
  }

 private:
  // The next message if one is waiting; else the device starts what it holds, the
  // completions and the replies held back go, then it waits. An exit status if it ended.
  std::optional<int> awaitRequests() {
    while (rest_.empty()) {
      ssize_t n = ::recv(fd_, received_.data(), received_.size(), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        unplug();
        publish(ring_, device_, completed_);  // (what the run finished at once is seen without a wait)
        if (!flush()) return 1;
        n = ::recv(fd_, received_.data(), received_.size(), 0);
      }
      if (n == 0) return 0;  // the netaccel closed: done
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return 1;
      rest_ = std::span<const std::byte>(received_.data(), static_cast<size_t>(n));
    }
    return std::nullopt;
  }

  // One request carried out, and its reply (a lost device says so in it).
  Reply carryOut(const Request& q, std::span<const std::byte> extra) {
    Reply r;
    r.serial = q.serial;
    Status s;
    if (q.payload > kWindowBytes) {
      s = fail(Code::invalidArgument, "payload larger than the window");
    } else {
      device_.tagKernels(q.tag);
      if (queuesOnly(q.op) && plugged_++ == 0) device_.plug();
      s = server_.handle(q, extra, r);
    }
    if (!s) failed(r, s.error());
    if (plugged_ >= sandbox::kMaxBatchRequests) unplug();
    std::string lost = device_.lost();
    const bool reset = cardReset.load(std::memory_order_relaxed);
    if (!lost.empty() || reset) {
      r.lost = reset || device_.lostFromOutside() ? sandbox::kLostByTheCard : sandbox::kLostByItsWork;
      failed(r, Error{Code::internal, !lost.empty() ? lost : "the sandbox was told its card reset (SIGPWR)"});
    }
    return r;
  }

  // Completions go to the ring as far as it has room (the rest wait in completed_), and
  // the reply joins those held back. Held back: a reply with nothing in the window to
  // read before the next request, and not a write's (the netaccel waits for it to fill
  // that half of the window again). False: the socket broke.
  bool answer(const Reply& r, Op op) {
    publish(ring_, device_, completed_);
    replies_.push_back(r);
    const bool plain = r.code == 0 && r.payload == 0 && !r.lost && op != Op::write;
    return (plain && replies_.size() < sandbox::kMaxReplies) || flush();
  }

  bool flush() {
    const bool sent = sandbox::sendReplies(fd_, replies_, !replies_.empty() && replies_.back().code != 0 ? said_ : "");
    replies_.clear();
    return sent;
  }
  // `r` failed with `e`: its message follows it (a failed reply goes at once, last).
  void failed(Reply& r, const Error& e) {
    r.code = static_cast<uint32_t>(e.code == Code::ok ? Code::internal : e.code);
    r.openclError = e.openclError;
    said_ = e.message.substr(0, sandbox::kMaxMessage);
    r.payload = said_.size();
  }
  void unplug() {
    device_.unplug();
    plugged_ = 0;
  }

  int fd_;
  sandbox::CompletionRing& ring_;
  Server server_;
  hal::Device& device_;
  std::vector<hal::KernelTime> completed_;  // done, not yet in the ring (it was full)
  std::vector<Reply> replies_;              // held back (sandbox.h)
  std::string said_;                        // the last reply's error message
  // A message of requests, each with what may follow it (a tensor op, a launch's
  // arguments), and those of it not yet done.
  std::vector<std::byte> received_;
  std::span<const std::byte> rest_;
  // Work queued since the device was plugged (Device::plug): the device starts it as one
  // run when no request waits, or after a run's most (kMaxBatchRequests) of them.
  unsigned plugged_ = 0;
};
}  // namespace

int serveSandbox(int fd, void* windowPtr, hal::Device& device) {
  return Loop(fd, static_cast<std::byte*>(windowPtr), device).run();
}

}  // namespace raccel::netaccel
