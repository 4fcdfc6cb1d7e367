#include "netaccel/card_worker.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <optional>
#include <unordered_map>

#include "common/limits.h"
#include "common/log.h"
#include "common/usage.h"
#include "hal/slicing.h"
#include "schema/guest.capnp.h"
#include "transport/wire_types.h"

namespace raccel::netaccel {
namespace {

// A hal program description as the wire's ProgramInfo (describeProgram's answer).
void writeDescription(wire::ProgramInfo::Builder out, const hal::ProgramDescription& d) {
  out.setBuildLog(d.buildLog);
  auto kernels = out.initKernels(d.kernels.size());
  for (size_t i = 0; i < d.kernels.size(); ++i) {
    const hal::KernelDescription& k = d.kernels[i];
    auto o = kernels[i];
    o.setName(k.name);
    o.setAttributes(k.attributes);
    o.setWorkGroupSize(k.workGroupSize);
    auto compiled = o.initCompileWorkGroupSize(3);
    for (unsigned j = 0; j < 3; ++j) compiled.set(j, k.compileWorkGroupSize[j]);
    o.setLocalMemBytes(k.localMemBytes);
    o.setPrivateMemBytes(k.privateMemBytes);
    o.setPreferredMultiple(k.preferredMultiple);
    auto args = o.initArgs(k.args.size());
    for (size_t j = 0; j < k.args.size(); ++j) {
      const hal::KernelArgDescription& a = k.args[j];
      args[j].setName(a.name);
      args[j].setTypeName(a.typeName);
      args[j].setAddressSpace(static_cast<wire::KernelArgInfo::AddressSpace>(a.space));
      args[j].setAccess(static_cast<wire::KernelArgInfo::Access>(a.access));
      args[j].setTypeQualifiers(a.typeQualifiers);
      args[j].setSize(a.size);
    }
  }
}

using transport::Body;
using transport::InPlaceMessage;

// Fills and copies go in pieces of this many bytes (memory moves: no rated speed applies).
constexpr uint64_t kSliceBytes = 64ull << 20;
// How long a read's chunk waits for room in a full same-host lane (CardWorker::read).
constexpr unsigned kLaneWaitMs = 100;

// A failed instruction: the error, and the instruction whose failure caused it.
struct Failure {
  Error error;
  uint64_t dependency = 0;
};
using Outcome = std::expected<void, Failure>;

std::unexpected<Failure> failure(Code code, std::string message) {
  return std::unexpected<Failure>(Failure{Error{code, std::move(message)}, 0});
}
std::unexpected<Failure> failure(const Error& e) { return std::unexpected<Failure>(Failure{e, 0}); }

Body errorReply(uint64_t sequence, const Failure& f) {
  capnp::MallocMessageBuilder m;
  auto e = m.initRoot<wire::Reply>().initError();
  e.setSequence(sequence);
  e.setDependency(f.dependency);
  transport::setError(e.initError(), f.error);
  return transport::encodeBody(m);
}


}  // namespace

struct CardWorker::Work {
  enum class Type { instruction, open, close, poison, lane } type = Type::instruction;
  uint32_t context = 0;
  uint64_t sequence = 0;
  Body body;
  uint64_t quota = 0;  // open: memory quota; poison: the handle
  std::string label;  // open: the context's label; poison with sequence 0: what to say
  Code code = Code::internal;
  uint32_t blocks = 1;  // open
  std::string tenant;
  int priority = 0;
  std::shared_ptr<transport::LaneOut> replyLane;  // open, lane
  bool changesContexts() const { return type == Type::open || type == Type::close || type == Type::lane; }
};

namespace {
double nowNs() {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// Kernel time used (ns), decayed with the half-life halfLifeNs_.
using Usage = DecayedUsage;

struct CardWorker::Tenant {
  Usage usage;
  uint32_t blocks = 0;  // of its open contexts here
  uint32_t contexts = 0;
  uint64_t quota = 0;  // the largest memory quota of its contexts (the VM's): the sandbox's allocation cap
  double lastRanNs = -1e300;  // when an instruction of its last ran here
  std::unique_ptr<hal::Device> sandbox;  // with sandboxes: while it has contexts here
};

struct CardWorker::Context {
  struct Poison {
    uint64_t sequence;
    Code code;
    std::string message;  // set: says what became of the handle (a lost sandbox)
  };
  std::unordered_map<uint64_t, std::unique_ptr<hal::Buffer>> buffers;
  std::unordered_map<uint64_t, std::unique_ptr<hal::Program>> programs;
  std::unordered_map<uint64_t, Poison> poisoned;  // handles a failed instruction should have created
  uint64_t quota = 0, used = 0;
  uint32_t id = 0;
  std::string label;
  // Scheduling on the card.
  std::deque<Work> ready;
  // An op cut into slices (hal/slicing.h), under way: it runs before `ready`, a slice at
  // a time. Its buffers are this context's: nothing frees them while it runs (the
  // context's instructions run in order), and it is dropped before they are released.
  std::unique_ptr<hal::SlicedWork> running;
  uint64_t runningSequence = 0;
  uint64_t lastSequence = 0;  // the highest instruction sequence run
  bool hasWork() const { return running || !ready.empty(); }
  Usage usage;
  uint32_t blocks = 1;
  std::string tenant;
  Tenant* tenantState = nullptr;  // (*tenants_)[tenant], set at open (a tenant's entry outlives its contexts)
  int priority = 0;
  std::shared_ptr<transport::LaneOut> replyLane;  // where its read replies are built (null: their own bodies)
  // Its kernels' device times, as the card's clock measured them, by the low 32 bits of
  // the instruction's sequence: given to the guest with its next fence (OpenCL's
  // profiling). The newest kKeptKernelTimes only.
  std::deque<std::pair<uint32_t, uint64_t>> kernelTimes;
};

namespace {
constexpr size_t kKeptKernelTimes = 4096;
// A kernel's tag: its context in the low 32 bits, its instruction's sequence's low 32
// bits above them.
uint64_t kernelTag(uint32_t context, uint64_t sequence) { return context | uint64_t{static_cast<uint32_t>(sequence)} << 32; }
}  // namespace

CardWorker::CardWorker(std::unique_ptr<hal::Device> device, std::function<void()> notify, double halfLifeMs)
    : CardWorker(std::move(device), std::move(notify), Options{halfLifeMs}) {}

CardWorker::CardWorker(std::unique_ptr<hal::Device> device, std::function<void()> notify, Options options)
    : caps_(device->capabilities()),
      options_(std::move(options)),
      device_(std::move(device)),
      notify_(std::move(notify)),
      contexts_(std::make_unique<std::unordered_map<uint32_t, Context>>()),
      tenants_(std::make_unique<std::unordered_map<std::string, Tenant>>()),
      halfLifeNs_(std::max(1.0, options_.halfLifeMs) * 1e6) {
  options_.queueDepth = std::max(1u, options_.queueDepth);
  options_.aloneQueueDepth = std::max(options_.queueDepth, options_.aloneQueueDepth);
  if (options_.sandbox) {
    device_.reset();  // its device context closes: each tenant's sandbox opens its own
    sandboxes_ = std::make_unique<SandboxPool>(caps_, *options_.sandbox, options_.label);
  }
  thread_ = std::thread([this] { run(); });
}

CardWorker::~CardWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Buffers and programs before the devices (a sandbox's) that hold them.
  for (auto& [id, ctx] : *contexts_) {
    ctx.running.reset();
    hal::Device* d = existingDevice(*ctx.tenantState);
    for (auto& [h, b] : ctx.buffers)
      if (d) d->release(std::move(b));
  }
  contexts_->clear();
  tenants_->clear();
}

void CardWorker::openContext(uint32_t context, uint64_t memoryQuota, const std::string& label, uint32_t blocks,
                             const std::string& tenant, int priority, std::shared_ptr<transport::LaneOut> replyLane) {
  Work w;
  w.replyLane = std::move(replyLane);
  w.type = Work::Type::open;
  w.context = context;
  w.quota = memoryQuota;
  w.label = label;
  w.blocks = std::max(1u, blocks);
  w.tenant = tenant.empty() ? label : tenant;
  w.priority = priority;
  staged_.push_back(std::move(w));
}

void CardWorker::closeContext(uint32_t context) {
  Work w;
  w.type = Work::Type::close;
  w.context = context;
  staged_.push_back(std::move(w));
}

void CardWorker::setReplyLane(uint32_t context, std::shared_ptr<transport::LaneOut> lane) {
  Work w;
  w.type = Work::Type::lane;
  w.context = context;
  w.replyLane = std::move(lane);
  staged_.push_back(std::move(w));
}

void CardWorker::poison(uint32_t context, uint64_t handle, uint64_t sequence, Code code, const std::string& message) {
  Work w;
  if (sequence == 0) w.label = limits::clip(message);
  w.type = Work::Type::poison;
  w.context = context;
  w.quota = handle;
  w.sequence = sequence;
  w.code = code;
  staged_.push_back(std::move(w));
}

void CardWorker::enqueue(uint32_t context, uint64_t sequence, Body body) {
  Work w;
  w.context = context;
  w.sequence = sequence;
  w.body = std::move(body);
  staged_.push_back(std::move(w));
}

void CardWorker::submit() {
  if (staged_.empty()) return;
  {
    std::lock_guard lock(mu_);
    for (auto& w : staged_) {
      queuedBytes_ += w.body.size();
      ++queuedCount_;
      queue_.push_back(std::move(w));
    }
  }
  staged_.clear();
  cv_.notify_one();
}

void CardWorker::drainFaults(std::vector<Fault>& out) {
  std::lock_guard lock(mu_);
  for (auto& f : faults_) out.push_back(std::move(f));
  faults_.clear();
}

void CardWorker::drain(std::vector<Output>& out) {
  std::lock_guard lock(mu_);
  for (auto& o : outbox_) out.push_back(std::move(o));
  outbox_.clear();
}

size_t CardWorker::queuedBytes() const {
  std::lock_guard lock(mu_);
  return queuedBytes_;
}

CardWorker::Stats CardWorker::stats() const {
  std::lock_guard lock(mu_);
  Stats s;
  s.busyNs = busyNs_;
  s.instructions = executed_;
  for (auto& [context, buffers] : bufferBytes_)
    for (auto& [handle, bytes] : buffers) s.memoryUsed += bytes;
  s.sandboxesStarted = sandboxesStarted_;
  s.sandboxesLost = sandboxesLost_;
  s.queued = queuedCount_;
  return s;
}

std::vector<std::pair<uint32_t, uint64_t>> CardWorker::kernelTimes() {
  std::lock_guard lock(mu_);
  std::vector<std::pair<uint32_t, uint64_t>> out(kernelNs_.begin(), kernelNs_.end());
  out.insert(out.end(), closedKernelNs_.begin(), closedKernelNs_.end());
  closedKernelNs_.clear();
  return out;
}

std::vector<std::pair<uint64_t, uint64_t>> CardWorker::buffersOf(uint32_t context) const {
  std::lock_guard lock(mu_);
  auto it = bufferBytes_.find(context);
  if (it == bufferBytes_.end()) return {};
  return {it->second.begin(), it->second.end()};
}

size_t CardWorker::queuedInstructions() const {
  std::lock_guard lock(mu_);
  return queuedCount_;
}

void CardWorker::run() {
  std::vector<Work> arrived;
  PluggedRun plugged;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      auto woken = [&] { return stop_ || !queue_.empty(); };
      // Kernels in flight: look at them now and then, to charge their time.
      if (inFlightTotal_ > 0) cv_.wait_for(lock, std::chrono::milliseconds(5), woken);
      else cv_.wait(lock, woken);
      if (stop_) return;
      arrived.swap(queue_);
    }
    intake(arrived);
    collectAll();  // kernels that completed meanwhile: their time is charged before the next pick
    stopStalled();
    // One instruction at a time, the fairest next; newly arrived work joins the choice.
    for (;;) {
      Context* c = pick();
      if (!c) {
        plugged.end();
        if (readyContexts() == 0) break;
        waitForDevice();  // work is ready but the card has queueDepth kernels in flight
        std::lock_guard lock(mu_);
        if (stop_) return;
        if (!queue_.empty()) arrived.swap(queue_);
      } else if (!dispatch(*c, plugged, arrived)) {
        return;  // the rest is dropped with the worker
      }
      // New instructions join the run; an open, a close or a new lane first ends it (a
      // close may end the sandbox the run is plugged into).
      if (!arrived.empty()) {
        if (std::any_of(arrived.begin(), arrived.end(), [](const Work& w) { return w.changesContexts(); }))
          plugged.end();
        intake(arrived);
      }
      // Replies leave now: a context waiting on a fence must not wait for the others' work.
      if (!pendingOut_.empty()) flushOutputs(false);
    }
    flushOutputs(true);
  }
}

bool CardWorker::dispatch(Context& c, PluggedRun& plugged, std::vector<Work>& arrived) {
  const bool slice = c.running != nullptr;  // the next slice of its op, else its next instruction
  Work w;
  if (!slice) {
    w = std::move(c.ready.front());
    c.ready.pop_front();
  }
  size_t bytes = w.body.size();  // execute() consumes the body
  uint32_t id = c.id;
  bool instruction = slice || w.type == Work::Type::instruction;
  hal::Device* device = instruction ? &deviceOf(c) : nullptr;
  plugged.turnTo(device, c.tenantState);
  bool timed = device && device->timesKernels();
  if (device) device->tagKernels(kernelTag(id, slice ? c.runningSequence : w.sequence));
  const double start = instruction && !timed ? nowNs() : 0;
  if (slice) runSlice(c, *device);
  else execute(w);  // may replace a lost sandbox
  // A sandbox lost meanwhile is gone, and with it what it held.
  if (plugged.device && existingDevice(*plugged.tenant) != plugged.device) plugged.device = nullptr;
  auto it = contexts_->find(id);
  if (instruction && it != contexts_->end()) {
    const double now = nowNs();
    it->second.tenantState->lastRanNs = now;
    if (!timed) charge(it->second, now - start, now);
    else if (existingDevice(*it->second.tenantState) == device) {  // not lost meanwhile
      ++outstanding_[device];  // at most one kernel per instruction (or slice) can be in flight for it
      if (device == plugged.device && inFlightTotal_ + 1 < depth()) countPosted(*device);
      else collect(*device);
    }
  }
  std::lock_guard lock(mu_);
  if (!slice) {
    queuedBytes_ -= bytes;
    --queuedCount_;
    executed_ += instruction;
  }
  if (stop_) return false;
  if (!queue_.empty()) arrived.swap(queue_);
  return true;
}

void CardWorker::intake(std::vector<Work>& arrived) {
  for (auto& w : arrived) {
    if (w.changesContexts()) {
      // A close does not wait behind the work it cancels (its session is gone); a new
      // reply lane changes nothing that queued work depends on.
      if (w.type == Work::Type::open) execute(w);
      else if (w.type == Work::Type::close) close(w);
      else if (auto it = contexts_->find(w.context); it != contexts_->end()) it->second.replyLane = std::move(w.replyLane);
      std::lock_guard lock(mu_);
      --queuedCount_;
      continue;
    }
    auto it = contexts_->find(w.context);
    if (it == contexts_->end()) {  // never opened, or closed: nothing to run it on
      std::lock_guard lock(mu_);
      queuedBytes_ -= w.body.size();
      --queuedCount_;
      continue;
    }
    it->second.ready.push_back(std::move(w));
  }
  arrived.clear();
}

CardWorker::Context* CardWorker::pick() {
  const size_t ready = readyContexts();
  if (ready == 0) return nullptr;
  // The card has its depth of kernels in flight: nothing is dispatched until one completes,
  // so that the next is the fairest one then (only asynchronous devices count here).
  if (inFlightTotal_ >= depth()) return nullptr;
  if (ready == 1) {
    for (auto& [id, c] : *contexts_)
      if (c.hasWork()) return &c;
  }
  double now = nowNs();
  // The tenant with work ready and the lowest decayed usage over share...
  const std::string* tenant = nullptr;
  double tenantScore = 0;
  for (auto& [id, c] : *contexts_) {
    if (!c.hasWork() || (tenant && *tenant == c.tenant)) continue;
    const Tenant& t = *c.tenantState;
    double score = t.usage.decayed(now, halfLifeNs_) / std::max(1u, t.blocks);
    if (!tenant || score < tenantScore) tenant = &c.tenant, tenantScore = score;
  }
  // ...then its highest-priority context, the least used for its share among equals.
  Context* best = nullptr;
  double bestOwn = 0;
  for (auto& [id, c] : *contexts_) {
    if (!c.hasWork() || c.tenant != *tenant) continue;
    double own = c.usage.decayed(now, halfLifeNs_) / c.blocks;
    if (!best || c.priority > best->priority || (c.priority == best->priority && own < bestOwn)) best = &c, bestOwn = own;
  }
  return best;
}

unsigned CardWorker::depth() const {
  // Another tenant with work ready, or that ran some lately (a quarter of the half-life:
  // between its batches, waiting on a fence), shares the card: then the shallow queue
  // keeps each dispatch the fairest.
  const double lately = options_.halfLifeMs * 1e6 / 4;
  double now = 0;  // read once, where a context without work is met
  const std::string* first = nullptr;
  for (auto& [id, c] : *contexts_) {
    bool active = c.hasWork();
    if (!active) active = (now = now ? now : nowNs()) - c.tenantState->lastRanNs < lately;
    if (!active) continue;
    if (first && *first != c.tenant) return options_.queueDepth;
    first = &c.tenant;
  }
  return options_.aloneQueueDepth;
}

size_t CardWorker::readyContexts() const {
  size_t n = 0;
  for (auto& [id, c] : *contexts_)
    if (c.hasWork() && ++n == 2) break;
  return n;
}

bool CardWorker::othersWaiting(const Context& self) {
  for (auto& [id, c] : *contexts_)
    if (&c != &self && c.hasWork()) return true;
  std::lock_guard lock(mu_);
  return std::any_of(queue_.begin(), queue_.end(), [&](const Work& w) { return w.context != self.id; });
}

double CardWorker::speedTflops() const { return std::max(caps_.tflops, caps_.ownTflops); }

double CardWorker::sliceFlops() const {
  // A card that states no speed: slices of a billion operations.
  const double tflops = speedTflops();
  return tflops > 0 ? tflops * 1e12 * options_.sliceMs / 1e3 : 1e9;
}

Status CardWorker::withinCeiling(double flops, const std::string& what) const {
  const double tflops = speedTflops();
  if (!(tflops > 0)) return {};
  const double seconds = flops / (tflops * 1e12);
  if (seconds <= options_.maxOpSeconds) return {};
  char text[160];
  std::snprintf(text, sizeof text, "%s: %.3g operations is about %g s of this card (%.3g TFLOPS), over the %g s one op may take",
                what.c_str(), flops, seconds, tflops, options_.maxOpSeconds);
  return fail(Code::resourceExhausted, std::string(text) + " (max_op_seconds); split it into smaller ops");
}

void CardWorker::runSlice(Context& c, hal::Device& device) {
  const uint64_t seq = c.runningSequence;
  auto r = c.running->runNext(device);
  std::optional<Failure> failed;
  if (!r) failed = Failure{r.error(), 0};
  if (!r || *r) c.running.reset();
  if (sandboxes_) {
    if (std::string why = device.lost(); !why.empty()) {
      failed = Failure{Error{Code::internal, lossMessage(why)}, 0};
      sandboxLost(c.tenant, why, seq, device.lostFromOutside());  // ends the running ops of every context of the tenant
    }
  }
  if (failed) emit(c.id, seq, errorReply(seq, *failed));
}

void CardWorker::charge(Context& c, double ns, double now) {
  c.usage.add(now, halfLifeNs_, ns);
  c.tenantState->usage.add(now, halfLifeNs_, ns);
  std::lock_guard lock(mu_);
  kernelNs_[c.id] += static_cast<uint64_t>(ns);
  busyNs_ += static_cast<uint64_t>(ns);
}

hal::Device& CardWorker::deviceOf(Context& c) {
  if (!sandboxes_) return *device_;
  Tenant& t = *c.tenantState;
  if (!t.sandbox) {
    t.sandbox = sandboxes_->take();
    {
      std::lock_guard lock(mu_);
      ++sandboxesStarted_;
    }
    capMemory(t);
    RLOG_INFO("netaccel") << options_.label << ": tenant '" << limits::clip(c.tenant, 64) << "' is served by sandbox process "
                          << SandboxPool::pidOf(*t.sandbox);
  }
  return *t.sandbox;
}

hal::Device* CardWorker::existingDevice(Tenant& t) { return sandboxes_ ? t.sandbox.get() : device_.get(); }

void CardWorker::capMemory(Tenant& t) {
  if (t.sandbox) t.sandbox->setMemoryCap(std::min(t.quota, caps_.memoryBytes));
}

void CardWorker::forgetDevice(hal::Device* device) {
  if (auto it = inFlight_.find(device); it != inFlight_.end()) {
    inFlightTotal_ -= it->second;
    inFlight_.erase(it);
  }
  stalledSince_.erase(device);
  outstanding_.erase(device);
}

void CardWorker::countPosted(hal::Device& device) {
  size_t& inFlight = inFlight_[&device];
  if (inFlight == 0) stalledSince_[&device] = nowNs();
  ++inFlight;
  ++inFlightTotal_;
}

size_t CardWorker::collect(hal::Device& device) {
  completed_.clear();
  size_t n = device.takeCompleted(completed_);
  size_t valid = 0;
  const double now = completed_.empty() ? 0 : nowNs();
  for (auto& k : completed_) {
    auto it = contexts_->find(static_cast<uint32_t>(k.tag));
    if (it == contexts_->end()) continue;
    // A sandbox's report is its own word: it counts only for its own tenant's contexts
    // (never to make another look heavy), and a kernel's time is taken up to an hour.
    if (sandboxes_ && it->second.tenantState->sandbox.get() != &device) continue;
    const uint64_t ns = std::min<uint64_t>(k.ns, 3'600'000'000'000ull);
    charge(it->second, static_cast<double>(ns), now);
    auto& times = it->second.kernelTimes;
    times.emplace_back(static_cast<uint32_t>(k.tag >> 32), ns);
    if (times.size() > kKeptKernelTimes) times.pop_front();
    ++valid;
  }
  if (sandboxes_) reportDeferred(device);  // posted work that failed, answered while nothing else is
  // No more than it was given and has not completed, and at most the deepest queue: a
  // sandbox claiming more would hold the whole card.
  size_t& given = outstanding_[&device];
  given -= std::min(given, valid);
  if (n == 0) given = 0;
  n = std::min<size_t>({n, given, options_.aloneQueueDepth});
  if (n == 0) {
    forgetDevice(&device);
    return valid;
  }
  size_t& inFlight = inFlight_[&device];
  if (valid > 0 || inFlight == 0) stalledSince_[&device] = valid > 0 ? now : nowNs();  // made-up completions are no progress
  inFlightTotal_ = inFlightTotal_ - inFlight + n;
  inFlight = n;
  return valid;
}

size_t CardWorker::collectAll() {
  size_t valid = 0;
  for (auto it = inFlight_.begin(); it != inFlight_.end();) {
    hal::Device* d = (it++)->first;  // collect() may erase it
    valid += collect(*d);
  }
  return valid;
}

void CardWorker::waitForDevice() {
  if (inFlight_.empty()) return;
  if (collectAll() > 0) return;  // completed meanwhile (a sandbox's ring): no wait
  if (inFlight_.empty()) return;
  hal::Device* device = inFlight_.begin()->first;
  device->waitCompleted(2);
  if (collectAll() == 0) {  // a device that returned at once without progress: do not spin
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stop_ || !queue_.empty(); });
  }
  stopStalled();
}

void CardWorker::stopStalled() {
  // A sandbox whose kernels make no progress for the call timeout holds a share of the
  // card's queue from everyone else: it is stopped (a kernel that never ends).
  // A kernel may run no longer than one op may take (max_op_seconds), nor past the call
  // timeout: the lesser of the two.
  if (!sandboxes_) return;
  const double limitMs = std::min<double>(options_.sandbox->callTimeoutMs, options_.maxOpSeconds * 1e3);
  double now = nowNs();
  for (auto& [name, t] : *tenants_) {
    if (!t.sandbox) continue;
    auto s = stalledSince_.find(t.sandbox.get());
    if (s == stalledSince_.end() || now - s->second < limitMs * 1e6) continue;
    sandboxLost(name, "its kernels made no progress for " + std::to_string(static_cast<uint64_t>(limitMs)) +
                          " ms (a kernel running past max_op_seconds or sandbox_call_timeout_ms) and its sandbox was stopped",
                0);
    break;  // tenants_ is unchanged, but one at a time keeps this simple
  }
}

std::string CardWorker::lossMessage(const std::string& why) const {
  return why + "; this vaccel's buffers and programs on " + options_.label + " are lost";
}

void CardWorker::sandboxLost(const std::string& tenant, const std::string& why, uint64_t sequence, bool notItsOwn) {
  Tenant& t = (*tenants_)[tenant];
  Fault fault{{}, lossMessage(why), notItsOwn};
  for (auto& [id, c] : *contexts_) {
    if (c.tenant != tenant) continue;
    fault.contexts.push_back(id);
    for (auto& [h, b] : c.buffers) {
      c.poisoned[h] = Context::Poison{sequence, Code::internal, "buffer " + std::to_string(h) + " was lost: " + fault.message};
      if (t.sandbox) t.sandbox->release(std::move(b));
    }
    for (auto& [h, p] : c.programs)
      c.poisoned[h] = Context::Poison{sequence, Code::internal, "program " + std::to_string(h) + " was lost: " + fault.message};
    if (c.running) {  // its op's buffers are gone: it ends here, failing
      if (c.runningSequence != sequence)
        emit(id, c.runningSequence, errorReply(c.runningSequence, Failure{Error{Code::internal, fault.message}, 0}));
      c.running.reset();
    }
    c.buffers.clear();
    c.programs.clear();
    c.used = 0;
    std::lock_guard lock(mu_);
    bufferBytes_.erase(id);
  }
  forgetDevice(t.sandbox.get());
  {
    std::lock_guard lock(mu_);
    ++sandboxesLost_;
  }
  t.sandbox.reset();  // the process is stopped and its folder removed; a new one serves what follows
  RLOG_WARN("netaccel") << options_.label << ": tenant '" << limits::clip(tenant, 64) << "': " << fault.message;
  std::lock_guard lock(mu_);
  faults_.push_back(std::move(fault));
}

void CardWorker::emit(uint32_t context, uint64_t sequence, Body body) {
  if (sandboxes_)
    if (auto it = contexts_->find(context); it != contexts_->end())
      if (hal::Device* d = existingDevice(*it->second.tenantState)) reportDeferred(*d);
  queueOutput(context, sequence, std::move(body));
}

void CardWorker::reportDeferred(hal::Device& device) {
  for (auto& d : device.takeDeferredErrors()) {
    auto it = contexts_->find(static_cast<uint32_t>(d.tag));
    if (it == contexts_->end()) continue;  // closed meanwhile
    Context& c = it->second;
    if (existingDevice(*c.tenantState) != &device) continue;  // a sandbox speaks for its own tenant only
    // The tag keeps the sequence's low 32 bits: the latest sequence of the context with them.
    uint64_t seq = (c.lastSequence & ~uint64_t{0xffffffff}) | (d.tag >> 32);
    if (seq > c.lastSequence && seq > 0xffffffffull) seq -= uint64_t{1} << 32;
    queueOutput(c.id, seq, errorReply(seq, Failure{std::move(d.error), 0}));
  }
}

void CardWorker::queueOutput(uint32_t context, uint64_t sequence, Body body) {
  pendingOutBytes_ += body.size();
  pendingOut_.push_back(Output{context, sequence, std::move(body)});
  if (pendingOutBytes_ >= 4 * 1024 * 1024) flushOutputs(false);
}

void CardWorker::flushOutputs(bool force) {
  bool had;
  {
    std::lock_guard lock(mu_);
    had = !pendingOut_.empty();
    for (auto& o : pendingOut_) outbox_.push_back(std::move(o));
  }
  pendingOut_.clear();
  pendingOutBytes_ = 0;
  // Also notify after a batch without output: the loop may be waiting for the queue to drain.
  if (had || force) notify_();
}


void CardWorker::close(Work& work) {
  auto it = contexts_->find(work.context);
  if (it == contexts_->end()) return;
  Context& c = it->second;
  Tenant& t = *c.tenantState;  // kept: its past usage still counts if it comes back
  if (c.running || !c.ready.empty())
    RLOG_INFO("netaccel") << options_.label << ": context " << work.context << " closed; cancelled "
                          << c.ready.size() << " queued instruction(s)"
                          << (c.running ? " and the op of instruction #" + std::to_string(c.runningSequence) +
                                              " after slice " + std::to_string(c.running->done()) + " of " +
                                              std::to_string(c.running->total())
                                        : std::string());
  c.running.reset();  // before the buffers it works on
  hal::Device* d = existingDevice(t);
  for (auto& [h, b] : c.buffers)
    if (d) d->release(std::move(b));
  c.buffers.clear();
  c.programs.clear();
  t.blocks -= std::min(t.blocks, c.blocks);
  t.contexts -= std::min(t.contexts, 1u);
  std::string tenantName = c.tenant;
  {
    std::lock_guard lock(mu_);
    // Its final kernel time goes out once more, with the next heartbeat: what ran
    // after the last one is the tenant's too.
    if (auto k = kernelNs_.find(work.context); k != kernelNs_.end()) {
      closedKernelNs_.emplace_back(k->first, k->second);
      kernelNs_.erase(k);
    }
    bufferBytes_.erase(work.context);
    for (auto& w : c.ready) queuedBytes_ -= w.body.size();  // work before or after its close: dropped with it
    queuedCount_ -= c.ready.size();
  }
  contexts_->erase(it);
  t.quota = 0;
  for (auto& [id, other] : *contexts_)
    if (other.tenant == tenantName) t.quota = std::max(t.quota, other.quota);
  if (t.sandbox && t.contexts == 0) {  // its last context here: the sandbox ends
    forgetDevice(t.sandbox.get());
    t.sandbox.reset();
  } else {
    capMemory(t);
  }
}

// One instruction of one context on its device, on the worker thread: one handler per
// instruction, sharing the handle lookups and the bounded-work rule.
class CardWorker::Step {
 public:
  Step(CardWorker& worker, Context& c, Work& work, hal::Device& device)
      : w_(worker), c_(c), work_(work), device_(device), seq_(work.sequence) {}

  Outcome run(wire::Instruction::Reader in) {
    switch (in.which()) {
      case wire::Instruction::ALLOC: return alloc(in.getAlloc());
      case wire::Instruction::FREE: return free(in.getFree().getHandle());
      case wire::Instruction::WRITE: return write(in.getWrite());
      case wire::Instruction::READ: return read(in.getRead());
      case wire::Instruction::COPY: return copy(in.getCopy());
      case wire::Instruction::FILL: return fill(in.getFill());
      case wire::Instruction::LOAD_PROGRAM: return loadProgram(in.getLoadProgram());
      case wire::Instruction::LAUNCH: return launch(in.getLaunch());
      case wire::Instruction::OP: return op(in.getOp());
      case wire::Instruction::DESCRIBE_PROGRAM: return describeProgram(in.getDescribeProgram());
      case wire::Instruction::FENCE: return fence();
      case wire::Instruction::HELLO: return failure(Code::invalidArgument, "hello is for the scheduler, not a card");
      case wire::Instruction::DESCRIBE_VACCEL:
        return failure(Code::invalidArgument, "describeVaccel is for the scheduler, not a card");
      case wire::Instruction::GRAPH: return failure(Code::invalidArgument, "a graph is for the scheduler, not a card");
    }
    return failure(Code::invalidArgument, "unknown instruction (tag " + std::to_string(static_cast<int>(in.which())) +
                                            "); this netaccel speaks instruction set 1.0");
  }

 private:
  using Found = std::expected<hal::Buffer*, Failure>;

  // A handle the instruction needs: the object, or why it is missing (a failed
  // instruction that should have created it, or a handle never seen).
  std::unexpected<Failure> missing(uint64_t h, const char* what, const char* cause, const char* end) const {
    if (auto p = c_.poisoned.find(h); p != c_.poisoned.end()) {
      const Context::Poison& poison = p->second;
      if (!poison.message.empty()) return std::unexpected(Failure{Error{poison.code, poison.message}, poison.sequence});
      return std::unexpected(Failure{Error{poison.code, "dependency failed: " + std::string(what) + " " + std::to_string(h) +
                                                            cause + std::to_string(poison.sequence) + end},
                                     poison.sequence});
    }
    return failure(Code::notFound, std::string(what) + " handle " + std::to_string(h) + " does not exist in this session");
  }
  Found bufferOf(uint64_t h) const {
    if (auto b = c_.buffers.find(h); b != c_.buffers.end()) return b->second.get();
    return missing(h, "buffer", " was never created: instruction #", " failed");
  }
  std::expected<hal::Program*, Failure> programOf(uint64_t h) const {
    if (auto p = c_.programs.find(h); p != c_.programs.end()) return p->second.get();
    return missing(h, "program", " was not loaded (instruction #", " failed)");
  }
  Status freshHandle(uint64_t h) const {
    if (h == 0) return fail(Code::invalidArgument, "handle 0 is reserved");
    if (c_.buffers.count(h) || c_.programs.count(h))
      return fail(Code::invalidArgument, "handle " + std::to_string(h) + " is already in use in this session");
    return {};
  }
  static Outcome status(Status s) {
    if (!s) return failure(s.error());
    return {};
  }
  // Bounded work (hal/slicing.h): refused past max_op_seconds of this card; run at once
  // when it fits one slice, else left running for run() to go on with between others' work.
  Outcome bounded(double flops, const std::string& what, std::unique_ptr<hal::SlicedWork> slices,
                  const std::function<Status()>& whole) {
    if (auto s = w_.withinCeiling(flops, what); !s) return failure(s.error());
    if (!slices) return status(whole());
    c_.running = std::move(slices);
    c_.runningSequence = seq_;
    return {};
  }
  Outcome builtin(const hal::BuiltinOp& op) {
    if (auto s = hal::checkBuiltin(op); !s) return failure(s.error());
    return bounded(hal::builtinWork(op), hal::builtinName(op.fn), hal::sliceBuiltin(op, w_.sliceFlops()),
                   [&] { return device_.run(op); });
  }

  Outcome alloc(wire::Alloc::Reader a) {
    uint64_t h = a.getHandle(), size = a.getSize();
    if (auto s = freshHandle(h); !s) return failure(s.error());
    if (size == 0) return failure(Code::invalidArgument, "cannot allocate a zero-size buffer");
    if (size > c_.quota - std::min(c_.used, c_.quota))
      return failure(Code::resourceExhausted, "allocating " + std::to_string(size) +
                                                  " bytes would exceed this session's quota on the card (" +
                                                  std::to_string(c_.used) + " of " + std::to_string(c_.quota) + " used)");
    auto b = device_.allocate(size);
    if (!b) return failure(b.error());
    c_.used += size;
    c_.poisoned.erase(h);
    c_.buffers.emplace(h, std::move(*b));
    std::lock_guard lock(w_.mu_);
    w_.bufferBytes_[work_.context][h] = size;
    return {};
  }

  Outcome free(uint64_t h) {
    if (auto b = c_.buffers.find(h); b != c_.buffers.end()) {
      c_.used -= std::min(c_.used, b->second->size());
      device_.release(std::move(b->second));
      c_.buffers.erase(b);
      std::lock_guard lock(w_.mu_);
      w_.bufferBytes_[work_.context].erase(h);
      return {};
    }
    if (c_.programs.erase(h) || c_.poisoned.erase(h)) return {};
    return failure(Code::notFound, "handle " + std::to_string(h) + " does not exist in this session");
  }

  Outcome write(wire::Write::Reader w) {
    auto b = bufferOf(w.getBuffer());
    if (!b) return std::unexpected(b.error());
    auto data = w.getData();
    return status(device_.write(**b, w.getOffset(), std::as_bytes(std::span(data.begin(), data.size()))));
  }

  // Answered in chunks of wire::CHUNK_BYTES, each its own reply. Through a same-host lane
  // they are built in it; a read bigger than the lane waits there for the link to carry
  // the chunks before it (the rest by the socket would go at its speed, through TLS where
  // the link has it), while no other context has work for the card.
  Outcome read(wire::Read::Reader r) {
    auto b = bufferOf(r.getBuffer());
    if (!b) return std::unexpected(b.error());
    uint64_t offset = r.getOffset(), length = r.getLength();
    if (offset > (*b)->size() || length > (*b)->size() - offset)
      return failure(Code::invalidArgument, "read of " + std::to_string(length) + " bytes at offset " +
                                                std::to_string(offset) + " is past the end of a " +
                                                std::to_string((*b)->size()) + "-byte buffer");
    if (length > wire::CHUNK_BYTES) device_.readAhead(**b, offset, length, wire::CHUNK_BYTES);
    uint64_t done = 0;
    do {
      uint64_t n = std::min<uint64_t>(wire::CHUNK_BYTES, length - done);
      // Built where it is sent from (the link's same-host lane, while it has room), and
      // only the head zeroed: the card writes every byte of the data (or the reply goes).
      const size_t words = n / 8 + 16;
      Body storage = c_.replyLane ? transport::LaneOut::buildIn(c_.replyLane, 8 + words * 8, w_.othersWaiting(c_) ? 0 : kLaneWaitMs)
                                  : Body();
      InPlaceMessage out = storage.size() ? InPlaceMessage(std::move(storage), true) : InPlaceMessage(words, true);
      auto chunk = out.builder().initRoot<wire::Reply>().initData();
      chunk.setOffset(done);
      chunk.setLast(done + n == length);
      auto data = chunk.initData(n);
      out.fillsBlob(data.begin(), n);
      if (auto s = device_.read(**b, offset + done, std::as_writable_bytes(std::span(data.begin(), n))); !s)
        return failure(s.error());
      w_.emit(work_.context, seq_, out.finish());
      done += n;
    } while (done < length);
    return {};
  }

  Outcome copy(wire::Copy::Reader cp) {
    auto dst = bufferOf(cp.getDst());
    if (!dst) return std::unexpected(dst.error());
    auto src = bufferOf(cp.getSrc());
    if (!src) return std::unexpected(src.error());
    const uint64_t dstOffset = cp.getDstOffset(), srcOffset = cp.getSrcOffset(), length = cp.getLength();
    if (auto s = hal::checkBytes(**src, srcOffset, length, "copy source"); !s) return failure(s.error());
    if (auto s = hal::checkBytes(**dst, dstOffset, length, "copy destination"); !s) return failure(s.error());
    return bounded(0, "copy", hal::sliceCopy(**dst, dstOffset, **src, srcOffset, length, kSliceBytes),
                   [&] { return device_.copy(**dst, dstOffset, **src, srcOffset, length); });
  }

  Outcome fill(wire::Fill::Reader f) {
    auto b = bufferOf(f.getBuffer());
    if (!b) return std::unexpected(b.error());
    const uint64_t offset = f.getOffset(), length = f.getLength();
    const uint8_t value = f.getValue();
    if (auto s = hal::checkBytes(**b, offset, length, "fill"); !s) return failure(s.error());
    return bounded(0, "fill", hal::sliceFill(**b, offset, length, value, kSliceBytes),
                   [&] { return device_.fill(**b, offset, length, value); });
  }

  Outcome loadProgram(wire::LoadProgram::Reader lp) {
    uint64_t h = lp.getHandle();
    if (auto s = freshHandle(h); !s) return failure(s.error());
    if (!transport::validProgramKind(lp.getKind()))
      return failure(Code::invalidArgument, "unknown program kind " + std::to_string(static_cast<int>(lp.getKind())));
    auto code = lp.getCode();
    auto p = device_.loadProgram(transport::fromWire(lp.getKind()), lp.getName(),
                                 std::as_bytes(std::span(code.begin(), code.size())), lp.getOptions());
    if (!p) return failure(p.error());
    c_.poisoned.erase(h);
    c_.programs.emplace(h, std::move(*p));
    return {};
  }

  std::expected<hal::KernelArg, Failure> kernelArg(wire::Arg::Reader a) const {
    hal::KernelArg k;
    auto withBuffer = [&](uint64_t handle, hal::KernelArg::Type type, uint64_t offset) -> std::expected<hal::KernelArg, Failure> {
      auto b = bufferOf(handle);
      if (!b) return std::unexpected(b.error());
      k.type = type;
      k.buffer = *b;
      k.offset = offset;
      return k;
    };
    switch (a.which()) {
      case wire::Arg::BUFFER: return withBuffer(a.getBuffer(), hal::KernelArg::Type::buffer, 0);
      case wire::Arg::SUB_BUFFER:
        return withBuffer(a.getSubBuffer().getBuffer(), hal::KernelArg::Type::buffer, a.getSubBuffer().getOffset());
      case wire::Arg::IMAGE:
        k.image = transport::imageDescFrom(a.getImage());
        return withBuffer(a.getImage().getBuffer(), hal::KernelArg::Type::image, a.getImage().getOffset());
      case wire::Arg::SAMPLER: k.type = hal::KernelArg::Type::sampler; k.scalar.u32 = a.getSampler(); return k;
      case wire::Arg::LOCAL: k.type = hal::KernelArg::Type::local; k.scalar.u32 = a.getLocal(); return k;
      case wire::Arg::BYTES: {
        auto bytes = a.getBytes();
        k.type = hal::KernelArg::Type::bytes;
        k.bytes = std::as_bytes(std::span(bytes.begin(), bytes.size()));
        return k;
      }
      case wire::Arg::U32: k.type = hal::KernelArg::Type::u32; k.scalar.u32 = a.getU32(); return k;
      case wire::Arg::I32: k.type = hal::KernelArg::Type::i32; k.scalar.i32 = a.getI32(); return k;
      case wire::Arg::U64: k.type = hal::KernelArg::Type::u64; k.scalar.u64 = a.getU64(); return k;
      case wire::Arg::I64: k.type = hal::KernelArg::Type::i64; k.scalar.i64 = a.getI64(); return k;
      case wire::Arg::F32: k.type = hal::KernelArg::Type::f32; k.scalar.f32 = a.getF32(); return k;
      case wire::Arg::F64: k.type = hal::KernelArg::Type::f64; k.scalar.f64 = a.getF64(); return k;
    }
    return failure(Code::invalidArgument, "unknown kernel argument type");
  }

  Outcome launch(wire::Launch::Reader l) {
    auto p = programOf(l.getProgram());
    if (!p) return std::unexpected(p.error());
    hal::LaunchDims dims;
    auto grid = l.getGrid(), block = l.getBlock();
    auto offset = l.getOffset();
    if (grid.size() > 3 || block.size() > 3 || offset.size() > 3)
      return failure(Code::invalidArgument, "grid, block and offset have at most 3 dimensions");
    for (unsigned i = 0; i < grid.size(); ++i) dims.grid[i] = grid[i];
    for (unsigned i = 0; i < block.size(); ++i) dims.block[i] = block[i];
    for (unsigned i = 0; i < offset.size(); ++i) dims.offset[i] = offset[i];
    dims.sharedBytes = l.getSharedBytes();
    dims.autoBlock = l.getAutoBlock();
    dims.workDim = l.getWorkDim();
    if (l.getArgs().size() > hal::kMaxKernelArgs)
      return failure(Code::invalidArgument, "a launch takes at most " + std::to_string(hal::kMaxKernelArgs) + " arguments");
    std::vector<hal::KernelArg> args;
    args.reserve(l.getArgs().size());
    for (auto a : l.getArgs()) {
      auto k = kernelArg(a);
      if (!k) return std::unexpected(k.error());
      args.push_back(*k);
    }
    if ((*p)->kind() == ProgramKind::builtin) {  // the built-in library's kernels are ops: bounded alike
      if (auto s = hal::checkLaunch(w_.caps_, l.getKernel(), dims, args); !s) return failure(s.error());
      auto op = hal::parseBuiltin(l.getKernel(), args);
      if (!op) return failure(op.error());
      return builtin(*op);
    }
    return status(device_.launch(**p, l.getKernel(), dims, args));
  }

  // The buffers of an op's handles, in order, or the first that is missing.
  std::expected<std::vector<hal::Buffer*>, Failure> buffersOf(std::initializer_list<uint64_t> handles) const {
    std::vector<hal::Buffer*> out;
    for (uint64_t h : handles) {
      auto b = bufferOf(h);
      if (!b) return std::unexpected(b.error());
      out.push_back(*b);
    }
    return out;
  }

  Outcome op(wire::Op::Reader op) {
    hal::BuiltinOp o;
    std::expected<std::vector<hal::Buffer*>, Failure> b;
    switch (op.which()) {
      case wire::Op::GEMM: {
        auto g = op.getGemm();
        if (!(b = buffersOf({g.getA(), g.getB(), g.getC()}))) return std::unexpected(b.error());
        o.fn = hal::BuiltinOp::Fn::gemm;
        o.gemm = {g.getM(), g.getN(), g.getK(), g.getAlpha(), g.getBeta(), (*b)[0], (*b)[1], (*b)[2]};
        return builtin(o);
      }
      case wire::Op::AXPY: {
        auto w = op.getAxpy();
        if (!(b = buffersOf({w.getX(), w.getY()}))) return std::unexpected(b.error());
        o.fn = hal::BuiltinOp::Fn::axpy, o.n = w.getN(), o.alpha = w.getAlpha(), o.x = (*b)[0], o.y = (*b)[1];
        return builtin(o);
      }
      case wire::Op::VADD: {
        auto w = op.getVadd();
        if (!(b = buffersOf({w.getA(), w.getB(), w.getOut()}))) return std::unexpected(b.error());
        o.fn = hal::BuiltinOp::Fn::vadd, o.n = w.getN(), o.x = (*b)[0], o.y = (*b)[1], o.out = (*b)[2];
        return builtin(o);
      }
      case wire::Op::REDUCE_SUM: {
        auto w = op.getReduceSum();
        if (!(b = buffersOf({w.getInput(), w.getOut()}))) return std::unexpected(b.error());
        o.fn = hal::BuiltinOp::Fn::reduceSum, o.n = w.getN(), o.x = (*b)[0], o.out = (*b)[1];
        return builtin(o);
      }
      case wire::Op::TENSOR: return tensor(op.getTensor());
    }
    return failure(Code::invalidArgument, "unknown built-in op (tag " + std::to_string(static_cast<int>(op.which())) +
                                            "); this netaccel speaks instruction set 1.0");
  }

  Outcome tensor(wire::TensorOp::Reader t) {
    hal::TensorOp h;
    const auto fn = static_cast<unsigned>(t.getFn());
    if (fn >= hal::kTensorFns)
      return failure(Code::invalidArgument, "unknown tensor function " + std::to_string(fn) + "; this netaccel knows " +
                                                std::to_string(hal::kTensorFns));
    h.fn = static_cast<hal::TensorFn>(fn);
    auto shape = t.getShape();
    auto operands = t.getOperands();
    const std::string name = std::string("tensor op ") + hal::tensorFnName(h.fn);
    if (shape.size() < 1 || shape.size() > hal::kMaxTensorDims)
      return failure(Code::invalidArgument, name + ": a shape of " + std::to_string(shape.size()) + " dimensions (1 to " +
                                                std::to_string(hal::kMaxTensorDims) + ")");
    if (operands.size() != hal::tensorFnOperands(h.fn))
      return failure(Code::invalidArgument, name + " takes " + std::to_string(hal::tensorFnOperands(h.fn)) +
                                                " operands, " + std::to_string(operands.size()) + " given");
    h.dims = shape.size();
    for (unsigned d = 0; d < h.dims; ++d) h.shape[d] = shape[d];
    for (unsigned i = 0; i < operands.size(); ++i) {
      auto b = bufferOf(operands[i].getBuffer());
      if (!b) return std::unexpected(b.error());
      auto strides = operands[i].getStrides();
      if (strides.size() != h.dims)
        return failure(Code::invalidArgument, name + ": operand " + std::to_string(i) + " has " +
                                                  std::to_string(strides.size()) + " strides for a shape of " +
                                                  std::to_string(h.dims) + " dimensions");
      h.operands[i].buffer = *b;
      h.operands[i].offset = operands[i].getOffset();
      h.operands[i].type = transport::fromWire(operands[i].getType());  // an unknown one is refused by lowering
      for (unsigned d = 0; d < h.dims; ++d) h.operands[i].strides[d] = strides[d];
    }
    h.alpha = t.getAlpha(), h.beta = t.getBeta(), h.reduceMask = t.getReduceMask();
    h.ignoreIndex = t.getIgnoreIndex(), h.mean = t.getMean();
    h.drawOrigin = h.operands[0].offset;  // (hal/tensor.h: draws that do not depend on where the output lies)
    h.preScale = t.getPreScale(), h.preShift = t.getPreShift(), h.postScale = t.getPostScale(), h.postShift = t.getPostShift();
    auto lowered = hal::lowerTensorOp(h);  // checked once here; each slice again where it runs
    if (!lowered) return failure(lowered.error());
    if (lowered->empty) return {};
    return bounded(lowered->flops, name, lowered->flops > w_.sliceFlops() ? hal::sliceTensor(h, w_.sliceFlops()) : nullptr,
                   [&] { return device_.tensor(h); });
  }

  Outcome describeProgram(uint64_t handle) {
    auto p = programOf(handle);
    if (!p) return std::unexpected(p.error());
    capnp::MallocMessageBuilder m;
    writeDescription(m.initRoot<wire::Reply>().initProgram(), (*p)->describe());
    w_.emit(work_.context, seq_, transport::encodeBody(m));
    return {};
  }

  // Everything before it has completed: the kernels' own times first (OpenCL's
  // profiling reads them), then the fence.
  Outcome fence() {
    if (auto s = device_.finish(); !s) return failure(s.error());
    w_.collect(device_);
    if (auto it = w_.contexts_->find(work_.context); it != w_.contexts_->end() && !it->second.kernelTimes.empty()) {
      auto& times = it->second.kernelTimes;
      capnp::MallocMessageBuilder t;
      auto list = t.initRoot<wire::Reply>().initKernelTimes(static_cast<unsigned>(times.size()));
      for (unsigned i = 0; i < times.size(); ++i) {
        list[i].setSequence(times[i].first);
        list[i].setNs(times[i].second);
      }
      times.clear();
      w_.emit(work_.context, seq_, transport::encodeBody(t));
    }
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Reply>().setFenced();
    w_.emit(work_.context, seq_, transport::encodeBody(m));
    return {};
  }

  CardWorker& w_;
  Context& c_;
  Work& work_;
  hal::Device& device_;
  const uint64_t seq_;
};

void CardWorker::open(Work& work) {
  if (contexts_->count(work.context)) return;  // the scheduler never reuses an open id
  Context& c = (*contexts_)[work.context];
  c.id = work.context;
  c.quota = work.quota ? work.quota : caps_.memoryBytes;
  c.label = work.label;
  c.blocks = work.blocks;
  c.tenant = work.tenant;
  c.priority = work.priority;
  c.replyLane = std::move(work.replyLane);
  Tenant& t = (*tenants_)[c.tenant];
  c.tenantState = &t;
  t.blocks += c.blocks;
  ++t.contexts;
  t.quota = std::max(t.quota, c.quota);
  capMemory(t);
}

void CardWorker::execute(Work& work) {
  if (work.type == Work::Type::open) return open(work);
  auto it = contexts_->find(work.context);
  if (it == contexts_->end()) return;  // closed meanwhile: the session is gone
  Context& c = it->second;
  if (work.type == Work::Type::poison) {
    if (!c.buffers.count(work.quota) && !c.programs.count(work.quota))
      c.poisoned[work.quota] = Context::Poison{work.sequence, work.code, work.label};
    return;
  }
  const uint64_t seq = work.sequence;
  c.lastSequence = std::max(c.lastSequence, seq);
  hal::Device& device = deviceOf(c);
  std::optional<uint64_t> created;
  Outcome outcome;
  auto decoded = transport::decodeGuard([&] {
    transport::MessageIn message(std::move(work.body));
    auto in = message.root<wire::Instruction>();
    created = transport::handleCreatedBy(in);
    outcome = Step(*this, c, work, device).run(in);
  });
  if (!decoded) outcome = failure(decoded.error());
  // The tenant's sandbox died or its device faulted: this instruction fails naming the
  // fault, the tenant's buffers and programs here are gone, a fresh sandbox follows.
  if (sandboxes_) {
    if (std::string why = device.lost(); !why.empty()) {
      outcome = failure(Code::internal, lossMessage(why));
      sandboxLost(c.tenant, why, seq, device.lostFromOutside());
    }
  }
  if (outcome) return;
  const Failure& f = outcome.error();
  uint64_t root = f.dependency ? f.dependency : seq;
  // A handle the failed instruction should have created names its cause from now on.
  // Existing buffers are never touched: validation precedes every mutation.
  if (created && *created != 0 && !c.buffers.count(*created) && !c.programs.count(*created))
    c.poisoned[*created] = Context::Poison{root, f.error.code, {}};
  emit(work.context, seq, errorReply(seq, f));
}

}  // namespace raccel::netaccel
