#include "vmfrontend/raccel.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <sstream>

#include "common/limits.h"
#include "schema/frame.capnp.h"
#include "schema/guest.capnp.h"
#include "transport/blocking_link.h"
#include "transport/wire_types.h"

namespace raccel::client {

namespace {
// The channel this program uses on its own connection; raccel-guestd renumbers it.
constexpr uint32_t kChannel = 1;
// Writes below this size are copied into the send queue; larger ones go out at once,
// their data referenced in place.
constexpr size_t kInlineWrite = 64 * 1024;

// A message builder whose first segment is zeroed scratch on the stack: no heap work
// for the small instructions that make up most streams.
class SmallMessage {
 public:
  SmallMessage() : builder_(kj::arrayPtr(zeroed(scratch_), kWords)) {}
  capnp::MallocMessageBuilder& operator*() { return builder_; }
  wire::Instruction::Builder instruction() { return builder_.initRoot<wire::Instruction>(); }

 private:
  static constexpr size_t kWords = 128;
  static capnp::word* zeroed(capnp::word* w) {
    std::memset(w, 0, kWords * sizeof(capnp::word));
    return w;
  }
  capnp::word scratch_[kWords];
  capnp::MallocMessageBuilder builder_;
};

std::string prefixed(uint64_t sequence, const Error& e) {
  return "instruction #" + std::to_string(sequence) + " failed: " + e.message;
}
}  // namespace

Arg Arg::f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return {Type::f32, bits};
}

Arg Arg::f64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  return {Type::f64, bits};
}

bool CardInfo::runs(ProgramKind kind) const {
  return std::find(programKinds.begin(), programKinds.end(), kind) != programKinds.end();
}

namespace {
// What the scheduler says of a vaccel (its welcome, or describeVaccel's answer); a card's
// image limits are judged here too.
VaccelInfo vaccelFrom(wire::VaccelInfo::Reader v) {
  VaccelInfo info;
  info.id = v.getId();
  info.blockTflops = v.getBlockTflops();
  for (auto b : v.getBlocks()) info.blocks.emplace_back(b.getFirst(), b.getCount());
  info.memoryQuota = v.getMemoryQuota();
  for (auto c : v.getCards()) {
    CardInfo card{c.getNode(), c.getIndex(), transport::fromWire(c.getKind()), c.getModel(), c.getBlocks()};
    card.memoryBytes = c.getMemoryBytes();
    for (auto k : c.getProgramKinds())
      if (transport::validProgramKind(k)) card.programKinds.push_back(transport::fromWire(k));
    card.computeUnits = c.getComputeUnits();
    card.maxWorkGroupSize = c.getMaxWorkGroupSize();
    card.localMemBytes = c.getLocalMemBytes();
    card.openclExtensions = c.getOpenclExtensions();
    card.doubleFpConfig = c.getDoubleFpConfig();
    card.images = transport::imageLimitsFrom(c.getImages());
    if (!checkLimits(card.images)) card.images = {};
    info.cards.push_back(std::move(card));
  }
  return info;
}
}  // namespace

std::string VaccelInfo::describe() const {
  std::ostringstream out;
  out << "vaccel #" << id << ", blocks";
  for (auto& [first, count] : blocks) out << " " << first << "-" << (first + count - 1);
  out << " on";
  for (auto& c : cards) out << " " << c.node << "/" << c.index << "(" << kindName(c.kind) << " " << c.model << " x" << c.blocks << ")";
  return out.str();
}

constexpr size_t kHeldOps = 8, kHeldFills = 64;

namespace {
// The bytes of its buffer that a view over `shape` may touch, from first to last. A view
// whose strides do not match its shape (a reduction's, a matmul's) spans its whole buffer.
struct Span {
  Handle buffer;
  uint64_t first, last;
};
Span spanOf(const TensorOperand& o, const std::vector<uint64_t>& shape) {
  if (o.strides.size() != shape.size()) return Span{o.buffer, 0, UINT64_MAX};
  const uint64_t size = tensorTypeBytes(o.type);
  uint64_t at = o.offset;
  for (size_t d = 0; d < shape.size(); ++d) at = limits::satAdd(at, limits::satMul(shape[d] ? shape[d] - 1 : 0, o.strides[d]));
  return Span{o.buffer, limits::satMul(o.offset, size), limits::satAdd(limits::satMul(at, size), size - 1)};
}
bool meet(const Span& a, const Span& b) { return a.buffer == b.buffer && a.first <= b.last && b.first <= a.last; }
}  // namespace

struct Session::Impl {
  transport::BlockingLink link;
  int timeoutMs = 0;
  // Elementwise tensor ops held back, in the order given (Session::tensor): a later op
  // may fuse into one of them; one that touches their memory sends those it must follow
  // first, and anything else sends them all.
  std::vector<HeldOp> held;
  std::vector<HeldFill> fills;  // fills held apart (Session::passFills)
  std::vector<Span> spans;      // the op being taken in's (spansOf): reused, not allocated an op
  uint64_t fused = 0;
};

Session::Session() : impl_(std::make_unique<Impl>()) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::open(const Options& options) {
  std::unique_ptr<Session> s(new Session());
  s->impl_->timeoutMs = options.timeoutMs;
  auto spin = options.spinMicros < 0 ? transport::spinFromEnvironment() : Result<int64_t>(int64_t(options.spinMicros) * 1000);
  if (!spin) return fail(spin.error());
  if (*spin > transport::kMaxSpinNs)
    return fail(Code::invalidArgument, "spinMicros " + std::to_string(options.spinMicros) + " is over " +
                                           std::to_string(transport::kMaxSpinNs / 1000));
  s->impl_->link.setSpin(*spin);
  if (auto c = s->impl_->link.connectUnix(options.socket); !c)
    return fail(Code::unavailable, c.error().message + " (is raccel-guestd running?)");
  SmallMessage m;
  auto hello = m.instruction().initHello();
  hello.setVersionMajor(wire::PROTOCOL_MAJOR);
  hello.setVersionMinor(wire::PROTOCOL_MINOR);
  hello.setProgram(options.program);
  hello.setTflops(options.tflops);
  hello.setPriority(options.priority);
  hello.setAdmitWaitMs(options.admitWaitMs);
  hello.setNoWait(options.noWait);
  auto kinds = hello.initKinds(options.kinds.size());
  for (size_t i = 0; i < options.kinds.size(); ++i) kinds.set(i, transport::toWire(options.kinds[i]));
  uint64_t seq = s->nextSequence_++;
  if (auto sent = s->impl_->link.sendNow(kChannel, seq, *m); !sent) return fail(sent.error());
  auto frame = s->impl_->link.receive(std::max<int>(options.timeoutMs, static_cast<int>(options.admitWaitMs) + 10000));
  if (!frame) return fail(Code::unavailable, "no welcome from the scheduler: " + frame.error().message);
  Status result;
  auto decoded = transport::decodeGuard([&] {
    transport::MessageIn in(std::move(frame->body));
    auto reply = in.root<wire::Reply>();
    if (reply.which() == wire::Reply::ERROR) {
      result = fail(transport::errorFrom(reply.getError().getError()));
      return;
    }
    if (reply.which() != wire::Reply::WELCOME) {
      result = fail(Code::internal, "the scheduler answered hello with something other than welcome");
      return;
    }
    s->vaccel_ = vaccelFrom(reply.getWelcome().getVaccel());
  });
  if (!decoded) return fail(decoded.error());
  if (!result) return fail(result.error());
  return s;
}

Handle Session::newHandle() {
  if (forcedHandle_) {
    Handle h = forcedHandle_;
    forcedHandle_ = 0;
    return h;
  }
  return nextHandle_++;
}

uint64_t Session::queue(capnp::MessageBuilder& message) {
  sendHeld();
  return queueNow(message);
}
uint64_t Session::queueNow(capnp::MessageBuilder& message) {
  uint64_t seq = nextSequence_++;
  impl_->link.queue(kChannel, seq, message);
  return seq;
}

void Session::noteError(const Error& error) {
  if (!firstError_) firstError_ = error;
}

Handle Session::alloc(uint64_t bytes) {
  Handle h = newHandle();
  SmallMessage m;
  auto a = m.instruction().initAlloc();
  a.setHandle(h);
  a.setSize(bytes);
  queueNow(*m);  // a new buffer: no held op touches it
  return h;
}

void Session::free(Handle handle) {
  SmallMessage m;
  m.instruction().initFree().setHandle(handle);
  sendHeldTouching(handle, 0, UINT64_MAX);
  queueNow(*m);
}

// The held ops that touch the bytes written go first; the others stay held (a scalar
// operand written each step, batch norm's num_batches_tracked += 1, had sent zero_grad's
// held fills before the gradients could fold onto them).
void Session::write(Handle buffer, uint64_t offset, std::span<const std::byte> data) {
  sendHeldTouching(buffer, offset, limits::satAdd(offset, data.empty() ? 0 : data.size() - 1));
  size_t done = 0;
  do {
    size_t n = std::min<size_t>(wire::CHUNK_BYTES, data.size() - done);
    // Referenced in place, a segment is whole words of the caller's memory: only an
    // aligned run of whole words may be (else Cap'n Proto would read past the caller's
    // buffer); the odd tail goes in a copy of its own.
    const std::byte* at = data.data() + done;
    bool inPlace = n >= kInlineWrite && reinterpret_cast<uintptr_t>(at) % sizeof(capnp::word) == 0;
    if (inPlace) n -= n % sizeof(capnp::word);
    capnp::MallocMessageBuilder m(64);
    auto w = m.initRoot<wire::Instruction>().initWrite();
    w.setBuffer(buffer);
    w.setOffset(offset + done);
    capnp::Data::Reader piece(reinterpret_cast<const kj::byte*>(at), n);
    if (!inPlace) {
      w.setData(piece);
      queueNow(m);
    } else {
      w.adoptData(m.getOrphanage().referenceExternalData(piece));
      if (auto s = impl_->link.sendNow(kChannel, nextSequence_++, m); !s) noteError(s.error());
    }
    done += n;
  } while (done < data.size());
}

Status Session::await(uint64_t seq, const std::function<bool(uint64_t, const void*)>& handle) {
  for (;;) {
    auto frame = impl_->link.receive(impl_->timeoutMs);
    if (!frame) {
      // Given up (timed out, or the link broke): the link closes, so guestd ends the
      // session and the scheduler releases its blocks, buffers and sandbox at once; a
      // late reply can then never be taken for the answer to a later request.
      impl_->link.close();
      noteError(frame.error());
      return fail(frame.error());
    }
    std::optional<Status> done;
    auto decoded = transport::decodeGuard([&] {
      transport::MessageView in(frame->body);
      auto reply = in.root<wire::Reply>();
      uint64_t at = frame->header.sequence;
      if (reply.which() == wire::Reply::ERROR) {
        auto e = reply.getError();
        Error error = transport::errorFrom(e.getError());
        error.message = prefixed(e.getSequence(), error);
        if (errorListener_) errorListener_(e.getSequence(), error);
        if (e.getSequence() == seq) done = fail(error);
        else noteError(error);
        return;
      }
      if (reply.which() == wire::Reply::FENCED && at > completedThrough_ && at < (uint64_t{1} << 62))
        completedThrough_ = at;
      if (reply.which() == wire::Reply::KERNEL_TIMES) {
        if (kernelNs_.size() > 65536) kernelNs_.clear();  // never asked for: not kept without end
        for (auto t : reply.getKernelTimes()) kernelNs_[t.getSequence()] += t.getNs();  // a split op: its parts
        return;
      }
      if (at == seq && handle(at, &reply)) done = Status{};
    });
    if (!decoded) return fail(decoded.error());
    if (done) return *done;
  }
}

std::optional<uint64_t> Session::takeKernelNs(uint64_t sequence) {
  auto it = kernelNs_.find(static_cast<uint32_t>(sequence));
  if (it == kernelNs_.end()) return std::nullopt;
  uint64_t ns = it->second;
  kernelNs_.erase(it);
  return ns;
}

Status Session::read(Handle buffer, uint64_t offset, std::span<std::byte> out) {
  SmallMessage m;
  auto r = m.instruction().initRead();
  r.setBuffer(buffer);
  r.setOffset(offset);
  r.setLength(out.size());
  uint64_t seq = queue(*m);
  Status bounds;
  auto s = await(seq, [&](uint64_t, const void* any) {
    auto& reply = *static_cast<const wire::Reply::Reader*>(any);
    if (reply.which() != wire::Reply::DATA) return false;
    auto chunk = reply.getData();
    auto data = chunk.getData();
    if (chunk.getOffset() > out.size() || data.size() > out.size() - chunk.getOffset()) {
      bounds = fail(Code::internal, "read reply out of bounds");
      return true;
    }
    if (data.size() > 0) std::memcpy(out.data() + chunk.getOffset(), data.begin(), data.size());  // empty: may be null
    return chunk.getLast();
  });
  if (!s) return s;
  return bounds;
}

Result<VaccelInfo> Session::describeVaccel() {
  SmallMessage m;
  m.instruction().setDescribeVaccel();
  uint64_t seq = queue(*m);
  VaccelInfo info;
  auto s = await(seq, [&](uint64_t, const void* any) {
    auto& reply = *static_cast<const wire::Reply::Reader*>(any);
    if (reply.which() != wire::Reply::VACCEL) return false;
    info = vaccelFrom(reply.getVaccel());
    return true;
  });
  if (!s) return fail(s.error());
  vaccel_ = info;
  return info;
}

Result<ProgramInfo> Session::describeProgram(Handle program) {
  SmallMessage m;
  m.instruction().setDescribeProgram(program);
  uint64_t seq = queue(*m);
  ProgramInfo info;
  auto s = await(seq, [&](uint64_t, const void* any) {
    auto& reply = *static_cast<const wire::Reply::Reader*>(any);
    if (reply.which() != wire::Reply::PROGRAM) return false;
    auto p = reply.getProgram();
    info.buildLog = p.getBuildLog();
    for (auto k : p.getKernels()) {
      KernelInfo ki;
      ki.name = k.getName();
      ki.attributes = k.getAttributes();
      ki.workGroupSize = k.getWorkGroupSize();
      auto compiled = k.getCompileWorkGroupSize();
      for (unsigned d = 0; d < 3 && d < compiled.size(); ++d) ki.compileWorkGroupSize[d] = compiled[d];
      ki.localMemBytes = k.getLocalMemBytes();
      ki.privateMemBytes = k.getPrivateMemBytes();
      ki.preferredMultiple = k.getPreferredMultiple();
      for (auto a : k.getArgs()) {
        KernelArgInfo ai;
        ai.name = a.getName();
        ai.typeName = a.getTypeName();
        ai.space = static_cast<KernelArgInfo::Space>(std::min<unsigned>(static_cast<unsigned>(a.getAddressSpace()), 3));
        ai.access = static_cast<KernelArgInfo::Access>(std::min<unsigned>(static_cast<unsigned>(a.getAccess()), 3));
        ai.typeQualifiers = a.getTypeQualifiers();
        ai.size = a.getSize();
        ki.args.push_back(std::move(ai));
      }
      info.kernels.push_back(std::move(ki));
    }
    return true;
  });
  if (!s) return fail(s.error());
  return info;
}

Result<std::vector<float>> Session::readFloats(Handle buffer, size_t count) {
  std::vector<float> out(count);
  if (auto s = read(buffer, 0, std::as_writable_bytes(std::span(out))); !s) return fail(s.error());
  return out;
}

void Session::copy(Handle dst, uint64_t dstOffset, Handle src, uint64_t srcOffset, uint64_t length) {
  SmallMessage m;
  auto c = m.instruction().initCopy();
  c.setDst(dst);
  c.setDstOffset(dstOffset);
  c.setSrc(src);
  c.setSrcOffset(srcOffset);
  c.setLength(length);
  queue(*m);
}

void Session::fill(Handle buffer, uint64_t offset, uint64_t length, uint8_t value) {
  SmallMessage m;
  auto f = m.instruction().initFill();
  f.setBuffer(buffer);
  f.setOffset(offset);
  f.setLength(length);
  f.setValue(value);
  queue(*m);
}

Handle Session::loadProgram(ProgramKind kind, const std::string& name, std::span<const std::byte> code) {
  return loadProgram(kind, name, code, {});
}

Handle Session::loadProgram(ProgramKind kind, const std::string& name, std::span<const std::byte> code,
                            const std::string& options) {
  Handle h = newHandle();
  capnp::MallocMessageBuilder m;
  auto p = m.initRoot<wire::Instruction>().initLoadProgram();
  p.setHandle(h);
  p.setKind(transport::toWire(kind));
  p.setName(name);
  p.setCode(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(code.data()), code.size()));
  if (!options.empty()) p.setOptions(options);
  queue(m);
  return h;
}

void Session::launch(Handle program, const std::string& kernel, std::vector<uint32_t> grid, std::vector<uint32_t> block,
                     const std::vector<Arg>& args, uint32_t sharedBytes) {
  SmallMessage m;
  auto l = m.instruction().initLaunch();
  l.setProgram(program);
  l.setKernel(kernel);
  auto g = l.initGrid(grid.size());
  for (size_t i = 0; i < grid.size(); ++i) g.set(i, grid[i]);
  auto b = l.initBlock(block.size());
  for (size_t i = 0; i < block.size(); ++i) b.set(i, block[i]);
  l.setSharedBytes(sharedBytes);
  fillLaunchArgs(&l, args);
  queue(*m);
}

void Session::fillLaunchArgs(void* launch, std::span<const Arg> args) {
  auto out = static_cast<wire::Launch::Builder*>(launch)->initArgs(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    uint64_t v = args[i].bits;
    switch (args[i].type) {
      case Arg::Type::buffer:
        if (args[i].offset == 0) {
          out[i].setBuffer(v);
        } else {
          auto sub = out[i].initSubBuffer();
          sub.setBuffer(v);
          sub.setOffset(args[i].offset);
        }
        break;
      case Arg::Type::u32: out[i].setU32(static_cast<uint32_t>(v)); break;
      case Arg::Type::i32: out[i].setI32(static_cast<int32_t>(static_cast<uint32_t>(v))); break;
      case Arg::Type::u64: out[i].setU64(v); break;
      case Arg::Type::i64: out[i].setI64(static_cast<int64_t>(v)); break;
      case Arg::Type::f32: {
        float f;
        uint32_t bits = static_cast<uint32_t>(v);
        std::memcpy(&f, &bits, 4);
        out[i].setF32(f);
        break;
      }
      case Arg::Type::f64: {
        double d;
        std::memcpy(&d, &v, 8);
        out[i].setF64(d);
        break;
      }
      case Arg::Type::local: out[i].setLocal(static_cast<uint32_t>(v)); break;
      case Arg::Type::image: transport::setImageArg(out[i].initImage(), v, args[i].offset, args[i].image); break;
      case Arg::Type::sampler: out[i].setSampler(static_cast<uint32_t>(v)); break;
      case Arg::Type::bytes:
        out[i].setBytes(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(args[i].bytes.data()), args[i].bytes.size()));
        break;
    }
  }
}

void Session::launchRange(Handle program, const std::string& kernel, std::span<const uint64_t> global,
                          std::span<const uint64_t> local, std::span<const uint64_t> offset, std::span<const Arg> args) {
  SmallMessage m;
  auto l = m.instruction().initLaunch();
  l.setProgram(program);
  l.setKernel(kernel);
  l.setWorkDim(static_cast<uint8_t>(global.size()));
  auto g = l.initGrid(global.size());
  if (local.empty()) {
    l.setAutoBlock(true);
    for (size_t i = 0; i < global.size(); ++i) g.set(i, static_cast<uint32_t>(global[i]));
  } else {
    auto b = l.initBlock(local.size());
    for (size_t i = 0; i < global.size(); ++i) {
      uint64_t group = i < local.size() && local[i] ? local[i] : 1;
      g.set(i, static_cast<uint32_t>(global[i] / group));
      if (i < local.size()) b.set(i, static_cast<uint32_t>(local[i]));
    }
  }
  bool anyOffset = false;
  for (auto o : offset) anyOffset |= o != 0;
  if (anyOffset) {
    auto o = l.initOffset(offset.size());
    for (size_t i = 0; i < offset.size(); ++i) o.set(i, offset[i]);
  }
  fillLaunchArgs(&l, args);
  queue(*m);
}

void Session::gemm(uint32_t m, uint32_t n, uint32_t k, float alpha, Handle a, Handle b, float beta, Handle c) {
  SmallMessage msg;
  auto g = msg.instruction().initOp().initGemm();
  g.setM(m);
  g.setN(n);
  g.setK(k);
  g.setAlpha(alpha);
  g.setBeta(beta);
  g.setA(a);
  g.setB(b);
  g.setC(c);
  queue(*msg);
}

namespace {
void writeTensorOp(wire::TensorOp::Builder t, const TensorOp& op) {
  t.setFn(static_cast<wire::TensorFn>(op.fn));
  auto shape = t.initShape(static_cast<unsigned>(op.shape.size()));
  for (size_t i = 0; i < op.shape.size(); ++i) shape.set(i, op.shape[i]);
  auto operands = t.initOperands(static_cast<unsigned>(op.operands.size()));
  for (size_t i = 0; i < op.operands.size(); ++i) {
    auto o = operands[i];
    o.setBuffer(op.operands[i].buffer);
    o.setOffset(op.operands[i].offset);
    o.setType(transport::toWire(op.operands[i].type));
    auto strides = o.initStrides(static_cast<unsigned>(op.operands[i].strides.size()));
    for (size_t d = 0; d < op.operands[i].strides.size(); ++d) strides.set(d, op.operands[i].strides[d]);
  }
  t.setAlpha(op.alpha);
  t.setBeta(op.beta);
  t.setReduceMask(op.reduceMask);
  t.setIgnoreIndex(op.ignoreIndex);
  t.setMean(op.mean);
  t.setPreScale(op.preScale);
  t.setPreShift(op.preShift);
  t.setPostScale(op.postScale);
  t.setPostShift(op.postShift);
}

bool unscaled(const TensorOp& op) { return op.preScale == 1 && op.preShift == 0 && op.postScale == 1 && op.postShift == 0; }
// A map over f32 with its operands' strides given for the whole shape: one that may fuse.
bool fusible(const TensorOp& op) {
  if (!takesFusedScale(op.fn) || op.operands.size() < 2) return false;  // (fill reads no operand a)
  for (auto& o : op.operands)
    if (o.type != TensorType::f32 || o.strides.size() != op.shape.size()) return false;
  return true;
}
bool sameView(const TensorOperand& a, const TensorOperand& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.strides == b.strides && a.type == b.type;
}
// Whether two views, a over shapeA and b over shapeB, may touch a common byte.
bool overlap(const TensorOperand& a, const std::vector<uint64_t>& shapeA, const TensorOperand& b,
             const std::vector<uint64_t>& shapeB) {
  return meet(spanOf(a, shapeA), spanOf(b, shapeB));
}
bool overlap(const TensorOperand& a, const TensorOperand& b, const std::vector<uint64_t>& shape) {
  return overlap(a, shape, b, shape);
}
// The bytes each operand of `op` may touch, into `out`.
void spansOf(const TensorOp& op, std::vector<Span>& out) {
  out.clear();
  for (auto& o : op.operands) out.push_back(spanOf(o, op.shape));
}
// Whether any of `mine` meets any of `theirs`.
bool anyMeet(const std::vector<Span>& mine, const std::vector<Span>& theirs) {
  for (auto& m : mine)
    for (auto& t : theirs)
      if (meet(m, t)) return true;
  return false;
}
// Whether the map writing (operand 0) over `a` and one touching `b` must keep their order,
// either way round: one writes what the other touches.
bool ordered(const std::vector<Span>& a, const std::vector<Span>& b) {
  if (a.empty() || b.empty()) return false;  // (a map without operands touches nothing)
  for (auto& t : b)
    if (meet(a[0], t)) return true;
  for (auto& t : a)
    if (meet(b[0], t)) return true;
  return false;
}

// Whether `next` may fold into `held` at all (fuseInto's precondition), asked before
// anything is copied: both write one view of one shape, and next is a plain map.
bool writeAlike(const TensorOp& held, const TensorOp& next) {
  return fusible(next) && unscaled(next) && next.shape == held.shape && !held.operands.empty() &&
         sameView(next.operands[0], held.operands[0]);
}

// Folds `next` into `held` where one op computes both (schema/guest.capnp's pre- and
// post-scales) with the very arithmetic the two ops would do: one scale and shift, never
// a product of two (x * a * b rounds otherwise than x * (a * b)); false where it cannot,
// and `held` is as it was. The caller has asked writeAlike: both write the same view of
// the same shape, so what `held` wrote is all overwritten by `next`:
//   - next scales in place what held wrote (x.mul_(c), x.add_(c), x / c + eps): held's
//     result is scaled as it is written;
//   - held was an affine (out = a x + b, e.g. exp_avg.mul_(beta1)) and next reads its
//     result as operand a and nothing else of it (exp_avg.add_(grad, 1 - beta1)): next
//     reads x instead, scaled as it is read.
bool fuseInto(TensorOp& held, const TensorOp& next) {
  const TensorOperand& out = held.operands[0];
  if (next.fn == TensorFn::affine && sameView(next.operands[1], out) && held.postScale == 1 && held.postShift == 0) {
    held.postScale = next.alpha, held.postShift = next.beta;
    return true;
  }
  if (held.fn != TensorFn::affine || !unscaled(held) || !sameView(next.operands[1], out)) return false;
  for (size_t i = 2; i < next.operands.size(); ++i)
    if (overlap(next.operands[i], out, next.shape)) return false;
  const TensorOperand& x = held.operands[1];
  if (!sameView(x, out) && overlap(x, out, next.shape)) return false;  // x is the output itself, or apart from it
  TensorOp fused = next;
  fused.operands[1] = x;
  fused.preScale = held.alpha, fused.preShift = held.beta;
  held = std::move(fused);
  return true;
}

// A fill of f32 memory whose strides match its shape, unscaled: one that can be held
// until an op touches its memory.
bool holdableFill(const TensorOp& op) {
  return op.fn == TensorFn::fill && unscaled(op) && op.operands.size() == 1 && op.operands[0].type == TensorType::f32 &&
         op.operands[0].strides.size() == op.shape.size();
}
// An add onto what a fill of v wrote, in place and reading nothing else of it (a
// gradient's grad += g after zero_grad's fill): one affine of the addend, k g + v, which
// is v + k g to the bit (an addition's operands commute, and both are a product plus a
// term where a compiler contracts them).
std::optional<TensorOp> addOntoFill(const TensorOp& fill, const TensorOp& next) {
  const TensorOperand& out = fill.operands[0];
  if (next.fn != TensorFn::add || next.operands.size() != 3 || !fusible(next) || !unscaled(next) ||
      next.shape != fill.shape || !sameView(next.operands[0], out) || !sameView(next.operands[1], out) ||
      overlap(next.operands[2], out, next.shape))
    return std::nullopt;
  TensorOp affine = next;
  affine.fn = TensorFn::affine;
  affine.operands = {out, next.operands[2]};
  affine.beta = fill.alpha;
  return affine;
}
}  // namespace

struct Session::HeldFill {
  TensorOp op;
  Span span;
};
// A held map and the bytes each of its operands may touch (its spans, made once: a later
// op is checked against every held op's).
struct Session::HeldOp {
  explicit HeldOp(TensorOp o) : op(std::move(o)) { spansOf(op, spans); }
  TensorOp op;
  std::vector<Span> spans;
};

// A fill (zero_grad's) is held apart until an op touches its memory: an add onto it in
// place becomes one affine (addOntoFill); anything else sends it first. At most
// kHeldFills are held: the oldest goes when one more comes.
const TensorOp* Session::passFills(const TensorOp& op, std::optional<TensorOp>& rewritten) {
  auto& fills = impl_->fills;
  if (fills.empty()) return &op;
  for (size_t i = 0; i < fills.size(); ++i)
    if ((rewritten = addOntoFill(fills[i].op, op))) {
      fills.erase(fills.begin() + long(i));
      ++impl_->fused;
      break;
    }
  const TensorOp& next = rewritten ? *rewritten : op;
  auto& spans = impl_->spans;
  spansOf(next, spans);
  sendFillsWhere([&](const HeldFill& f) {
    return std::any_of(spans.begin(), spans.end(), [&](const Span& s) { return meet(s, f.span); });
  });
  return &next;
}
// Sends the held fills for which `mustGo` holds (their order among themselves is free:
// no two share memory); the others stay held, in their order.
void Session::sendFillsWhere(const std::function<bool(const HeldFill&)>& mustGo) {
  auto& fills = impl_->fills;
  size_t kept = 0;
  for (size_t i = 0; i < fills.size(); ++i)
    if (mustGo(fills[i])) queueTensor(fills[i].op);
    else if (kept++ != i) fills[kept - 1] = std::move(fills[i]);
  fills.resize(kept);
}

// The latest held op that `op` fuses into (fuseInto), where that op may wait behind the
// ones held after it, becomes the fused op at the end. Otherwise the held ops `op` must
// follow go first (sendHeldBefore), and op is held (a map) or sent; the held ops it does
// not touch stay held, so that an in-place step (AdamW's param.mul_(1 - lr * wd)) can
// wait past other tensors' ops for the op that fuses into it (param.addcdiv_). At most
// kHeldOps are held: the oldest goes when one more comes. Held fills come first
// (passFills).
void Session::tensor(const TensorOp& given) {
  std::optional<TensorOp> rewritten;
  const TensorOp& op = *passFills(given, rewritten);
  auto& held = impl_->held;
  if (holdableFill(op)) {
    sendHeldBefore(op);
    impl_->fills.push_back({op, spanOf(op.operands[0], op.shape)});
    if (impl_->fills.size() > kHeldFills) {
      queueTensor(impl_->fills.front().op);
      impl_->fills.erase(impl_->fills.begin());
    }
    return;
  }
  for (size_t i = held.size(); i-- > 0;) {
    if (!writeAlike(held[i].op, op)) continue;
    TensorOp candidate = held[i].op;
    if (!fuseInto(candidate, op)) continue;
    bool canWait = true;
    for (size_t j = i + 1; j < held.size() && canWait; ++j) canWait = !ordered(held[i].spans, held[j].spans);
    if (!canWait) continue;
    held.erase(held.begin() + long(i));
    held.emplace_back(std::move(candidate));
    ++impl_->fused;
    return;
  }
  sendHeldBefore(op);
  if (!fusible(op)) return queueTensor(op);
  held.emplace_back(op);
  if (held.size() > kHeldOps) {
    queueTensor(held.front().op);
    held.erase(held.begin());
  }
}

// Sends the held ops that `op` must follow, with the earlier held ops those must follow,
// in their order; the others stay held.
void Session::sendHeldBefore(const TensorOp& op) {
  if (impl_->held.empty()) return;
  auto& later = impl_->spans;  // once, not once a held op
  spansOf(op, later);
  sendHeldWhere([&](const HeldOp& held) { return anyMeet(held.spans, later); });
}
// Sends the held fills and maps that touch bytes [first, last] of `buffer` (what a write
// or a free changes), with the earlier held maps those must follow. Held fills and maps
// never share memory (each sends the other first), so their order between them is free.
void Session::sendHeldTouching(Handle buffer, uint64_t first, uint64_t last) {
  const Span span{buffer, first, last};
  sendFillsWhere([&](const HeldFill& f) { return meet(f.span, span); });
  const std::vector<Span> written = {span};
  sendHeldWhere([&](const HeldOp& held) { return anyMeet(held.spans, written); });
}
// Sends the held maps for which `mustGo` holds, with the earlier held maps those must
// follow, in their order; the others stay held, in theirs.
void Session::sendHeldWhere(const std::function<bool(const HeldOp&)>& mustGo) {
  auto& held = impl_->held;
  std::array<bool, kHeldOps + 1> first{};  // (at most kHeldOps are held between two ops)
  for (size_t i = held.size(); i-- > 0;) {
    first[i] = mustGo(held[i]);
    for (size_t j = i + 1; j < held.size() && !first[i]; ++j) first[i] = first[j] && ordered(held[i].spans, held[j].spans);
  }
  size_t kept = 0;
  for (size_t i = 0; i < held.size(); ++i)
    if (first[i]) queueTensor(held[i].op);
    else if (kept++ != i) held[kept - 1] = std::move(held[i]);
  held.erase(held.begin() + long(kept), held.end());
}

// Every op held is independent of the ones held after it or it would have gone before
// them: the fills, then the maps in their order.
void Session::sendHeld() {
  for (auto& f : impl_->fills) queueTensor(f.op);
  impl_->fills.clear();
  for (auto& h : impl_->held) queueTensor(h.op);
  impl_->held.clear();
}

void Session::queueTensor(const TensorOp& op) {
  SmallMessage m;
  writeTensorOp(m.instruction().initOp().initTensor(), op);
  queueNow(*m);
}

uint64_t Session::fusedTensorOps() const { return impl_->fused; }

void Session::axpy(uint64_t n, float alpha, Handle x, Handle y) {
  SmallMessage m;
  auto o = m.instruction().initOp().initAxpy();
  o.setN(n);
  o.setAlpha(alpha);
  o.setX(x);
  o.setY(y);
  queue(*m);
}

void Session::vadd(uint64_t n, Handle a, Handle b, Handle out) {
  SmallMessage m;
  auto o = m.instruction().initOp().initVadd();
  o.setN(n);
  o.setA(a);
  o.setB(b);
  o.setOut(out);
  queue(*m);
}

uint32_t Graph::add(Node node) {
  nodes_.push_back(std::move(node));
  return static_cast<uint32_t>(nodes_.size() - 1);
}
uint32_t Graph::gemm(uint32_t m, uint32_t n, uint32_t k, float alpha, Handle a, Handle b, float beta, Handle c,
                     std::vector<uint32_t> after) {
  return add({Node::Op::gemm, m, n, k, alpha, beta, a, b, c, std::move(after)});
}
uint32_t Graph::axpy(uint64_t n, float alpha, Handle x, Handle y, std::vector<uint32_t> after) {
  return add({Node::Op::axpy, n, 0, 0, alpha, 0, x, 0, y, std::move(after)});
}
uint32_t Graph::vadd(uint64_t n, Handle a, Handle b, Handle out, std::vector<uint32_t> after) {
  return add({Node::Op::vadd, n, 0, 0, 0, 0, a, b, out, std::move(after)});
}
uint32_t Graph::reduceSum(uint64_t n, Handle input, Handle out, std::vector<uint32_t> after) {
  return add({Node::Op::reduceSum, n, 0, 0, 0, 0, input, 0, out, std::move(after)});
}
uint32_t Graph::tensor(TensorOp op, std::vector<uint32_t> after) {
  Node node{Node::Op::tensor, 0, 0, 0, 0, 0, 0, 0, 0, std::move(after)};
  node.tensor = std::move(op);
  return add(std::move(node));
}

void Session::submitGraph(const Graph& graph, Graph::Placement placement) {
  capnp::MallocMessageBuilder m;
  auto g = m.initRoot<wire::Instruction>().initGraph();
  g.setPlacement(placement == Graph::Placement::roundRobin ? wire::Graph::Placement::ROUND_ROBIN
                                                           : wire::Graph::Placement::FEWEST_BYTES);
  auto nodes = g.initNodes(graph.nodes().size());
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const Graph::Node& from = graph.nodes()[i];
    auto to = nodes[i];
    auto after = to.initAfter(from.after.size());
    for (size_t j = 0; j < from.after.size(); ++j) after.set(j, from.after[j]);
    auto op = to.initOp();
    switch (from.op) {
      case Graph::Node::Op::gemm: {
        auto o = op.initGemm();
        o.setM(static_cast<uint32_t>(from.n)), o.setN(from.gemmN), o.setK(from.gemmK);
        o.setAlpha(from.alpha), o.setBeta(from.beta), o.setA(from.a), o.setB(from.b), o.setC(from.c);
        break;
      }
      case Graph::Node::Op::axpy: {
        auto o = op.initAxpy();
        o.setN(from.n), o.setAlpha(from.alpha), o.setX(from.a), o.setY(from.c);
        break;
      }
      case Graph::Node::Op::vadd: {
        auto o = op.initVadd();
        o.setN(from.n), o.setA(from.a), o.setB(from.b), o.setOut(from.c);
        break;
      }
      case Graph::Node::Op::reduceSum: {
        auto o = op.initReduceSum();
        o.setN(from.n), o.setInput(from.a), o.setOut(from.c);
        break;
      }
      case Graph::Node::Op::tensor:
        writeTensorOp(op.initTensor(), from.tensor);
        break;
    }
  }
  queue(m);
}

void Session::reduceSum(uint64_t n, Handle input, Handle out) {
  SmallMessage m;
  auto o = m.instruction().initOp().initReduceSum();
  o.setN(n);
  o.setInput(input);
  o.setOut(out);
  queue(*m);
}

Status Session::flush() {
  sendHeld();
  return sendQueued();
}
Status Session::sendQueued() { return impl_->link.flush(); }

Status Session::fence() {
  SmallMessage m;
  m.instruction().setFence();
  uint64_t seq = queue(*m);
  auto s = await(seq, [&](uint64_t, const void* any) {
    return static_cast<const wire::Reply::Reader*>(any)->which() == wire::Reply::FENCED;
  });
  if (!s) noteError(s.error());
  else if (seq > completedThrough_) completedThrough_ = seq;
  if (auto e = takeError()) return fail(*e);
  return {};
}

}  // namespace raccel::client
