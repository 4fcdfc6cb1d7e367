// Multi-card virtual accelerators: running a guest instruction on cards other than the
// primary. The guest's buffers live on the primary; another card gets copies of the
// byte ranges it needs (read from the primary, written there, cached until the guest
// changes the buffer), runs its part, and its results are copied back. While this runs
// the session's later instructions wait (Scheduler::hold), so every card sees the
// guest's order. Each job ends with a fence on every card it touched, so its errors
// are all in before the guest hears of it: one error reply under the guest's sequence.
#include <capnp/message.h>

#include <algorithm>
#include <cstring>

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/scheduler.h"
#include "scheduler/split.h"
#include "scheduler/state.h"
#include "transport/wire_types.h"

namespace raccel::scheduler {

using transport::Body;
using transport::FrameHeader;

// The buffer a kernel argument passes (whole or from an offset on), if it passes one.
std::optional<uint64_t> bufferArg(wire::Arg::Reader arg) {
  if (arg.which() == wire::Arg::BUFFER) return arg.getBuffer();
  if (arg.which() == wire::Arg::SUB_BUFFER) return arg.getSubBuffer().getBuffer();
  if (arg.which() == wire::Arg::IMAGE) return arg.getImage().getBuffer();
  return std::nullopt;
}

// The buffers a built-in op writes (a tensor op its output; nllLoss its total weight
// too; layerNorm each row's mean and rstd too).
std::vector<uint64_t> outputsOf(wire::Op::Reader op) {
  switch (op.which()) {
    case wire::Op::GEMM: return {op.getGemm().getC()};
    case wire::Op::AXPY: return {op.getAxpy().getY()};
    case wire::Op::VADD: return {op.getVadd().getOut()};
    case wire::Op::REDUCE_SUM: return {op.getReduceSum().getOut()};
    case wire::Op::TENSOR: {
      std::vector<uint64_t> out;
      auto operands = op.getTensor().getOperands();
      if (operands.size() > 0) out.push_back(operands[0].getBuffer());
      const auto fn = op.getTensor().getFn();
      if (fn == wire::TensorFn::LAYER_NORM && operands.size() > 2) out.push_back(operands[2].getBuffer());
      if ((fn == wire::TensorFn::NLL_LOSS || fn == wire::TensorFn::LAYER_NORM) && operands.size() > 3)
        out.push_back(operands[3].getBuffer());
      return out;
    }
    default: return {};
  }
}

uint64_t lastElementOf(wire::TensorOperand::Reader operand, capnp::List<uint64_t>::Reader shape) {
  uint64_t last = operand.getOffset();
  auto strides = operand.getStrides();
  for (unsigned d = 0; d < shape.size() && d < strides.size(); ++d)
    if (shape[d] > 0) last = limits::satAdd(last, limits::satMul(shape[d] - 1, strides[d]));
  return last;
}

namespace {
constexpr uint64_t kF32 = 4;

// A tensor matmul ([m, n, k], f32) that the scheduler can split by rows: every view
// inside its buffer, the output's rows apart (each row's n elements contiguous) and its
// elements apart from the inputs'. Element offsets and strides as the op gives them.
struct RowMatmul {
  uint64_t m = 0, n = 0, k = 0;
  uint64_t offOut = 0, rowOut = 0, offA = 0, rowA = 0, kA = 0, offB = 0, colB = 0, kB = 0;
  // The elements [first, last] of each operand that rows [r0, r1) reach.
  std::pair<uint64_t, uint64_t> a(uint64_t r0, uint64_t r1) const { return {offA + r0 * rowA, offA + (r1 - 1) * rowA + (k - 1) * kA}; }
  std::pair<uint64_t, uint64_t> b() const { return {offB, offB + (n - 1) * colB + (k - 1) * kB}; }
  std::pair<uint64_t, uint64_t> out(uint64_t r0, uint64_t r1) const { return {offOut + r0 * rowOut, offOut + (r1 - 1) * rowOut + n - 1}; }
};
template <class Size>
std::optional<RowMatmul> rowMatmul(wire::TensorOp::Reader t, const Size& size) {
  using limits::satAdd;
  using limits::satMul;
  auto shape = t.getShape();
  auto ops = t.getOperands();
  if (t.getFn() != wire::TensorFn::MATMUL || shape.size() != 3 || ops.size() != 3) return std::nullopt;
  for (auto o : ops)
    if (o.getType() != wire::TensorType::F32 || o.getStrides().size() != 3) return std::nullopt;
  RowMatmul r;
  r.m = shape[0], r.n = shape[1], r.k = shape[2];
  if (!r.m || !r.n || !r.k) return std::nullopt;
  auto so = ops[0].getStrides(), sa = ops[1].getStrides(), sb = ops[2].getStrides();
  if ((so[1] != 1 && r.n > 1) || so[2] != 0 || sa[1] != 0 || sb[0] != 0) return std::nullopt;
  if (r.m > 1 && so[0] < r.n) return std::nullopt;  // rows would overlap
  r.offOut = ops[0].getOffset(), r.rowOut = so[0], r.offA = ops[1].getOffset(), r.rowA = sa[0], r.kA = sa[2];
  r.offB = ops[2].getOffset(), r.colB = sb[1], r.kB = sb[2];
  // Each view's last element inside its buffer (saturating: a huge stride fails here).
  auto inside = [&](uint64_t handle, uint64_t last) { return satMul(satAdd(last, 1), kF32) <= size(handle); };
  const uint64_t lastOut = lastElementOf(ops[0], shape), lastA = lastElementOf(ops[1], shape), lastB = lastElementOf(ops[2], shape);
  if (!inside(ops[0].getBuffer(), lastOut) || !inside(ops[1].getBuffer(), lastA) || !inside(ops[2].getBuffer(), lastB))
    return std::nullopt;
  // The output apart from the inputs (raccel.torch's tensors share large buffers: the
  // elements each view spans must not overlap).
  auto apart = [&](unsigned i, uint64_t first, uint64_t last) {
    return ops[0].getBuffer() != ops[i].getBuffer() || lastOut < first || last < r.offOut;
  };
  if (!apart(1, r.offA, lastA) || !apart(2, r.offB, lastB)) return std::nullopt;
  return r;
}

std::string kindsOf(const Pool& pool, const std::vector<Member>& members) {
  std::string out;
  for (auto& m : members) {
    const CardSpec& c = pool.cards()[m.card].spec;
    out += (out.empty() ? "" : ", ") + std::string(kindName(c.kind)) + " (" + c.backend + ", " +
           std::to_string(m.blocks) + " block" + (m.blocks == 1 ? "" : "s") + ")";
  }
  return out;
}
}  // namespace

uint64_t Scheduler::sendRemote(Session& s, size_t member, capnp::MessageBuilder& message,
                               std::function<bool(wire::Reply::Reader)> onReply, Settles settles) {
  uint64_t sequence = s.nextSequence++;
  const bool ofJob = settles == Settles::job;
  // The handler returns true once its instruction is answered; then the entry goes and
  // the job (or the checkpoint under way) settles, which may finish it and end this
  // session: nothing runs after. An error reply becomes the job's error here, for every
  // handler of the job's.
  if (onReply) s.remoteReplies[sequence] = [onReply = std::move(onReply), &s, sequence, ofJob, this](Body& body) {
    bool done = true;
    auto decoded = transport::decodeGuard([&] {
      transport::MessageView in(body);
      auto reply = in.root<wire::Reply>();
      if (ofJob && reply.which() == wire::Reply::ERROR && s.job && !s.job->error && !s.job->finished)
        s.job->error = transport::errorFrom(reply.getError().getError());
      done = onReply(reply);
    });
    if (!decoded) {  // (a malformed reply fails what it settles, job or checkpoint)
      std::optional<Error>* error = ofJob ? (s.job ? &s.job->error : nullptr)
                                          : (s.lineage.underWay ? &s.lineage.underWay->error : nullptr);
      if (error && !*error) *error = decoded.error();
    }
    if (!done) return;
    s.remoteReplies.erase(sequence);
    if (ofJob) settle(s);
    else settleCheckpoint(s);
  };
  Member& m = s.members[member];
  if (m.node) m.node->connection->send(m.context, sequence, message);
  if (ofJob && s.job && std::find(s.job->touched.begin(), s.job->touched.end(), member) == s.job->touched.end())
    s.job->touched.push_back(member);
  return sequence;
}

uint64_t Scheduler::scratch(Session& s, size_t member, uint64_t bytes, bool keep) {
  uint64_t handle = s.nextScratch++;
  capnp::MallocMessageBuilder m;
  auto a = m.initRoot<wire::Instruction>().initAlloc();
  a.setHandle(handle);
  a.setSize(bytes);
  sendRemote(s, member, m);
  if (!keep) s.job->scratch.emplace_back(member, handle);
  return handle;
}

void Scheduler::copyBetween(Session& s, size_t member, uint64_t handle, uint64_t offset, uint64_t length, size_t toMember,
                            uint64_t toHandle, uint64_t toOffset, std::function<void()> done) {
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::Instruction>().initRead();
  r.setBuffer(handle);
  r.setOffset(offset);
  r.setLength(length);
  ++s.job->awaiting;
  sendRemote(s, member, m, [this, &s, toMember, toHandle, toOffset, done = std::move(done)](wire::Reply::Reader reply) {
    if (reply.which() == wire::Reply::ERROR) {
      done();  // the job has the error; whatever waited on this copy goes on, so the job ends
      return true;
    }
    if (reply.which() == wire::Reply::DATA) {
      auto chunk = reply.getData();
      capnp::MallocMessageBuilder w;
      auto write = w.initRoot<wire::Instruction>().initWrite();
      write.setBuffer(toHandle);
      write.setOffset(toOffset + chunk.getOffset());
      write.setData(chunk.getData());
      sendRemote(s, toMember, w);
      s.bytesMoved += chunk.getData().size();
      if (!chunk.getLast()) return false;
      done();
    }
    return true;
  });
}

uint64_t Scheduler::replica(Session& s, size_t member, uint64_t handle, uint64_t offset, uint64_t length, bool cache,
                            std::function<void()> ready) {
  auto key = std::make_tuple(member, handle, offset, length);
  if (cache) {
    if (auto it = s.replicas.find(key); it != s.replicas.end()) {
      ready();
      return it->second;
    }
  }
  uint64_t copy = scratch(s, member, length, cache);
  if (cache) s.replicas[key] = copy;
  copyBetween(s, 0, handle, offset, length, member, copy, 0, std::move(ready));
  return copy;
}

void Scheduler::sendFree(Session& s, size_t member, uint64_t handle) {
  capnp::MallocMessageBuilder m;
  m.initRoot<wire::Instruction>().initFree().setHandle(handle);
  sendRemote(s, member, m);
}

void Scheduler::dropReplicas(Session& s, uint64_t handle, size_t except) {
  for (auto it = s.replicas.begin(); it != s.replicas.end();) {
    if (std::get<1>(it->first) != handle || std::get<0>(it->first) == except) {
      ++it;
      continue;
    }
    sendFree(s, std::get<0>(it->first), it->second);
    it = s.replicas.erase(it);
  }
}

bool Scheduler::routeElsewhere(Session& s, uint64_t sequence, wire::Instruction::Reader in) {
  // Where the guest changes a buffer on the primary, the copies of it on other cards go.
  auto changes = [&](uint64_t handle) {
    if (!s.replicas.empty()) dropReplicas(s, handle);
    return false;
  };
  switch (in.which()) {
    case wire::Instruction::LOAD_PROGRAM: return routeLoad(s, sequence, in.getLoadProgram());
    case wire::Instruction::LAUNCH: return routeLaunch(s, sequence, in.getLaunch());
    case wire::Instruction::DESCRIBE_PROGRAM: return routeDescribe(s, sequence, in.getDescribeProgram());
    case wire::Instruction::OP: {
      auto op = in.getOp();
      if (s.members.size() > 1 && startSplitOp(s, sequence, op)) return true;
      if (!s.replicas.empty())
        for (uint64_t h : outputsOf(op)) dropReplicas(s, h);
      return false;
    }
    case wire::Instruction::GRAPH: return startGraph(s, sequence, in.getGraph());
    case wire::Instruction::FREE: {
      uint64_t handle = in.getFree().getHandle();
      auto home = s.programHome.find(handle);
      if (home == s.programHome.end()) return changes(handle);
      sendFree(s, home->second, handle);
      s.programHome.erase(home);
      return true;
    }
    case wire::Instruction::WRITE: return changes(in.getWrite().getBuffer());
    case wire::Instruction::COPY: return changes(in.getCopy().getDst());
    case wire::Instruction::FILL: return changes(in.getFill().getBuffer());
    default: return false;
  }
}

// A program of a kind the primary's card does not run loads on the first member's that
// does; none of them: refused, naming what the vaccel has.
bool Scheduler::routeLoad(Session& s, uint64_t sequence, wire::LoadProgram::Reader load) {
  if (!transport::validProgramKind(load.getKind())) return false;  // the card says so
  ProgramKind kind = transport::fromWire(load.getKind());
  if (pool().cards()[s.primary().card].spec.runs(kind)) return false;
  for (size_t i = 1; i < s.members.size(); ++i)
    if (pool().cards()[s.members[i].card].spec.runs(kind)) {
      startRemoteLoad(s, sequence, i, load);
      return true;
    }
  Error e{Code::unimplemented, std::string("no card of this virtual accelerator runs ") + programKindName(kind) +
                                   " programs; it has " + kindsOf(pool(), s.members) +
                                   ". Ask for a card kind that runs them in hello (kinds)"};
  replyError(s, sequence, e);
  sendPoison(s, load.getHandle(), sequence, e);
  return true;
}

// A launch of a program loaded on another card runs there; one on the primary changes
// every buffer it is passed.
bool Scheduler::routeLaunch(Session& s, uint64_t sequence, wire::Launch::Reader launch) {
  auto home = s.programHome.find(launch.getProgram());
  if (home != s.programHome.end()) {
    startRemoteLaunch(s, sequence, home->second, launch);
    return true;
  }
  if (!s.replicas.empty())
    for (auto arg : launch.getArgs())
      if (auto h = bufferArg(arg)) dropReplicas(s, *h);
  return false;
}

// A program loaded on another card is described there; its answer goes to the guest.
bool Scheduler::routeDescribe(Session& s, uint64_t sequence, uint64_t program) {
  auto home = s.programHome.find(program);
  if (home == s.programHome.end()) return false;
  s.job = std::make_unique<RemoteJob>();
  s.job->guestSequence = sequence;
  capnp::MallocMessageBuilder m;
  m.initRoot<wire::Instruction>().setDescribeProgram(program);
  ++s.job->awaiting;
  sendRemote(s, home->second, m, [this, &s, sequence](wire::Reply::Reader reply) {
    if (reply.which() == wire::Reply::PROGRAM && s.link) {
      capnp::MallocMessageBuilder out;
      out.setRoot(reply);
      s.link->connection->send(s.channel, sequence, out);
    }
    return true;
  });
  settle(s);
  return true;
}

void Scheduler::startRemoteLoad(Session& s, uint64_t sequence, size_t member, wire::LoadProgram::Reader load) {
  s.job = std::make_unique<RemoteJob>();
  s.job->guestSequence = sequence;
  capnp::MallocMessageBuilder m;
  m.initRoot<wire::Instruction>().setLoadProgram(load);
  sendRemote(s, member, m);
  s.programHome[load.getHandle()] = member;
  const CardSpec& card = pool().cards()[s.members[member].card].spec;
  RLOG_DEBUG("scheduler") << "vaccel #" << s.id << ": " << programKindName(transport::fromWire(load.getKind()))
                          << " program '" << std::string(load.getName()) << "' loads on its " << kindName(card.kind)
                          << " card (" << card.backend << ")";
  settle(s);  // nothing to read back: fence and finish
}

void Scheduler::startRemoteLaunch(Session& s, uint64_t sequence, size_t member, wire::Launch::Reader launch) {
  s.job = std::make_unique<RemoteJob>();
  s.job->guestSequence = sequence;
  auto args = launch.getArgs();
  // Every buffer argument goes there whole and comes back whole (a kernel's writes are
  // not declared); copies on other cards are stale afterwards.
  std::vector<uint64_t> mapped(args.size(), 0);
  std::vector<std::pair<uint64_t, uint64_t>> buffers;  // (guest handle, bytes)
  for (size_t i = 0; i < args.size(); ++i) {
    auto h = bufferArg(args[i]);
    if (!h) continue;
    auto b = s.buffers.find(*h);
    if (b == s.buffers.end()) {
      s.job->error = Error{Code::notFound, "launch argument " + std::to_string(i) + ": no buffer " + std::to_string(*h) +
                                               " in this session"};
      settle(s);
      return;
    }
    buffers.emplace_back(*h, b->second);
  }
  for (auto& [h, bytes] : buffers) dropReplicas(s, h, member);

  auto gate = std::make_shared<Gate>(Gate{buffers.size() + 1, {}});
  auto ready = Gate::ticker(gate);
  auto copy = std::make_shared<capnp::MallocMessageBuilder>();
  copy->setRoot(launch);
  size_t bi = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!bufferArg(args[i])) continue;
    auto [h, bytes] = buffers[bi++];
    mapped[i] = replica(s, member, h, 0, bytes, true, ready);
  }
  gate->then = [this, &s, member, mapped, buffers, copy] {
    // The launch as the guest sent it (every field), its buffers renamed to the copies.
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Instruction>().setLaunch(copy->getRoot<wire::Launch>().asReader());
    auto args = m.getRoot<wire::Instruction>().getLaunch().getArgs();
    for (size_t i = 0; i < args.size(); ++i) {
      if (!mapped[i]) continue;
      if (args[i].which() == wire::Arg::SUB_BUFFER) args[i].getSubBuffer().setBuffer(mapped[i]);
      else if (args[i].which() == wire::Arg::IMAGE) args[i].getImage().setBuffer(mapped[i]);
      else args[i].setBuffer(mapped[i]);
    }
    sendRemote(s, member, m);
    size_t bi = 0;
    for (size_t i = 0; i < mapped.size(); ++i) {
      if (!mapped[i]) continue;
      auto [h, bytes] = buffers[bi++];
      copyBetween(s, member, mapped[i], 0, bytes, 0, h, 0, [] {});
    }
  };
  ready();  // the last of waiting: runs now if every copy was cached
  settle(s);
}

void Scheduler::readPartial(Session& s, size_t member, uint64_t handle, double* into) {
  capnp::MallocMessageBuilder r;
  auto read = r.initRoot<wire::Instruction>().initRead();
  read.setBuffer(handle);
  read.setLength(kF32);
  ++s.job->awaiting;
  sendRemote(s, member, r, [into](wire::Reply::Reader reply) {
    if (reply.which() == wire::Reply::DATA && reply.getData().getData().size() == kF32) {
      float v;
      std::memcpy(&v, reply.getData().getData().begin(), kF32);
      *into = v;
    }
    return true;
  });
}

// ---------------------------------------------------------------------------------
// Built-in ops split across the cards that run them, in proportion to their blocks.

namespace {
// What splitting an op comes to: the units it is cut into (rows, elements) and its work;
// for a tensor matmul, its geometry. None: the scheduler cannot vouch for it, and the
// primary runs it whole (answering with the card's own error).
struct SplitShape {
  uint64_t units = 0;
  double flops = 0;
  std::optional<RowMatmul> matmul;
};
template <class Size>
std::optional<SplitShape> splitShapeOf(wire::Op::Reader op, const Size& size) {
  using limits::satMul;
  SplitShape shape;
  switch (op.which()) {
    case wire::Op::GEMM: {
      auto g = op.getGemm();
      uint64_t m = g.getM(), n = g.getN(), k = g.getK();
      if (!m || !n || !k || g.getC() == g.getA() || g.getC() == g.getB()) return std::nullopt;
      if (size(g.getA()) < satMul(m, k, kF32) || size(g.getB()) < satMul(k, n, kF32) || size(g.getC()) < satMul(m, n, kF32))
        return std::nullopt;
      return SplitShape{m, 2.0 * double(m) * double(n) * double(k), {}};
    }
    case wire::Op::AXPY: {
      auto a = op.getAxpy();
      if (size(a.getX()) < satMul(a.getN(), kF32) || size(a.getY()) < satMul(a.getN(), kF32)) return std::nullopt;
      return SplitShape{a.getN(), 2.0 * double(a.getN()), {}};
    }
    case wire::Op::VADD: {
      auto v = op.getVadd();
      const uint64_t bytes = satMul(v.getN(), kF32);
      if (size(v.getA()) < bytes || size(v.getB()) < bytes || size(v.getOut()) < bytes) return std::nullopt;
      return SplitShape{v.getN(), double(v.getN()), {}};
    }
    case wire::Op::REDUCE_SUM: {
      auto r = op.getReduceSum();
      if (size(r.getInput()) < satMul(r.getN(), kF32) || size(r.getOut()) < kF32) return std::nullopt;
      return SplitShape{r.getN(), double(r.getN()), {}};
    }
    case wire::Op::TENSOR: {  // a matmul, by rows
      auto matmul = rowMatmul(op.getTensor(), size);
      if (!matmul) return std::nullopt;
      return SplitShape{matmul->m, 2.0 * double(matmul->m) * double(matmul->n) * double(matmul->k), matmul};
    }
    default:
      return std::nullopt;  // an op this scheduler does not know
  }
}

SplitPart partOf(wire::Op::Reader op, const SplitShape& shape, Slice slice) {
  SplitPart part;
  auto& inputs = part.inputs;
  switch (op.which()) {
    case wire::Op::GEMM: {
      auto g = op.getGemm();
      uint64_t n = g.getN(), k = g.getK();
      inputs.push_back({g.getA(), slice.begin * k * kF32, slice.size() * k * kF32, true});
      inputs.push_back({g.getB(), 0, k * n * kF32, true});
      part.outHandle = g.getC();
      part.outOffset = slice.begin * n * kF32;
      part.outLength = slice.size() * n * kF32;
      part.fresh = g.getBeta() == 0;
      if (!part.fresh) inputs.push_back({g.getC(), part.outOffset, part.outLength, false});
      break;
    }
    case wire::Op::AXPY: {
      auto a = op.getAxpy();
      inputs.push_back({a.getX(), slice.begin * kF32, slice.size() * kF32, true});
      inputs.push_back({a.getY(), slice.begin * kF32, slice.size() * kF32, false});
      part.outHandle = a.getY();
      part.outOffset = slice.begin * kF32;
      part.outLength = slice.size() * kF32;
      break;
    }
    case wire::Op::VADD: {
      auto v = op.getVadd();
      bool aliased = v.getOut() == v.getA() || v.getOut() == v.getB();
      inputs.push_back({v.getA(), slice.begin * kF32, slice.size() * kF32, !aliased});
      inputs.push_back({v.getB(), slice.begin * kF32, slice.size() * kF32, !aliased});
      part.outHandle = v.getOut();
      part.outOffset = slice.begin * kF32;
      part.outLength = slice.size() * kF32;
      part.fresh = true;
      break;
    }
    case wire::Op::REDUCE_SUM: {
      auto r = op.getReduceSum();
      inputs.push_back({r.getInput(), slice.begin * kF32, slice.size() * kF32, r.getOut() != r.getInput()});
      part.fresh = true;
      part.outLength = kF32;
      break;
    }
    case wire::Op::TENSOR: {  // rows [begin, end): a's rows, all of b, the output's rows
      const RowMatmul& mm = *shape.matmul;
      auto [aFirst, aLast] = mm.a(slice.begin, slice.end);
      auto [bFirst, bLast] = mm.b();
      auto [oFirst, oLast] = mm.out(slice.begin, slice.end);
      auto operands = op.getTensor().getOperands();
      inputs.push_back({operands[1].getBuffer(), aFirst * kF32, (aLast - aFirst + 1) * kF32, true});
      inputs.push_back({operands[2].getBuffer(), bFirst * kF32, (bLast - bFirst + 1) * kF32, true});
      part.outHandle = operands[0].getBuffer();
      part.outOffset = oFirst * kF32;
      part.outLength = (oLast - oFirst + 1) * kF32;
      // Rows with gaps between them (a view of a wider tensor): the gaps come over and
      // go back as they were.
      part.fresh = op.getTensor().getBeta() == 0 && (mm.rowOut == mm.n || slice.size() == 1);
      if (!part.fresh) inputs.push_back({part.outHandle, part.outOffset, part.outLength, false});
      break;
    }
    default:
      break;  // (splitShapeOf refused it)
  }
  return part;
}

// The primary's part: the op over units [0, end) of the guest's own buffers; a
// reduction's result goes to `partial`.
void writePrimaryPart(wire::Op::Reader from, wire::Op::Builder to, Slice slice, uint64_t partial) {
  switch (from.which()) {
    case wire::Op::GEMM: to.setGemm(from.getGemm()); to.getGemm().setM(static_cast<uint32_t>(slice.end)); break;
    case wire::Op::AXPY: to.setAxpy(from.getAxpy()); to.getAxpy().setN(slice.end); break;
    case wire::Op::VADD: to.setVadd(from.getVadd()); to.getVadd().setN(slice.end); break;
    case wire::Op::REDUCE_SUM:
      to.setReduceSum(from.getReduceSum());
      to.getReduceSum().setN(slice.end);
      to.getReduceSum().setOut(partial);
      break;
    case wire::Op::TENSOR:
      to.setTensor(from.getTensor());
      to.getTensor().getShape().set(0, slice.end);
      break;
    default:
      break;
  }
}

// Another card's part: the guest's op on that card's copies (`local`, in the order of
// partOf's inputs; the output `result`), over the slice's units.
void writeRemotePart(wire::Op::Reader op, wire::Op::Builder out, Slice slice, const std::vector<uint64_t>& local, uint64_t result) {
  switch (op.which()) {
    case wire::Op::GEMM:
      out.setGemm(op.getGemm());
      out.getGemm().setM(static_cast<uint32_t>(slice.size()));
      out.getGemm().setA(local[0]);
      out.getGemm().setB(local[1]);
      out.getGemm().setC(result);
      break;
    case wire::Op::AXPY:
      out.setAxpy(op.getAxpy());
      out.getAxpy().setN(slice.size());
      out.getAxpy().setX(local[0]);
      out.getAxpy().setY(result);
      break;
    case wire::Op::VADD:
      out.setVadd(op.getVadd());
      out.getVadd().setN(slice.size());
      out.getVadd().setA(local[0]);
      out.getVadd().setB(local[1]);
      out.getVadd().setOut(result);
      break;
    case wire::Op::REDUCE_SUM:
      out.setReduceSum(op.getReduceSum());
      out.getReduceSum().setN(slice.size());
      out.getReduceSum().setInput(local[0]);
      out.getReduceSum().setOut(result);
      break;
    case wire::Op::TENSOR: {  // the copies start at the slice's first elements
      out.setTensor(op.getTensor());
      auto t = out.getTensor();
      t.getShape().set(0, slice.size());
      auto operands = t.getOperands();
      const uint64_t handles[3] = {result, local[0], local[1]};
      for (unsigned i = 0; i < 3; ++i) operands[i].setBuffer(handles[i]), operands[i].setOffset(0);
      break;
    }
    default:
      break;
  }
}
}  // namespace


bool Scheduler::startSplitOp(Session& s, uint64_t sequence, wire::Op::Reader op) {
  std::vector<size_t> parts;
  std::vector<uint32_t> weights;
  for (size_t i = 0; i < s.members.size(); ++i)
    if (s.members[i].node && pool().cards()[s.members[i].card].spec.runs(ProgramKind::builtin)) {
      parts.push_back(i);
      weights.push_back(s.members[i].blocks);
    }
  if (parts.size() < 2) return false;
  auto size = [&](uint64_t h) -> uint64_t {
    auto b = s.buffers.find(h);
    return b == s.buffers.end() ? 0 : b->second;
  };
  auto shape = splitShapeOf(op, size);
  if (!shape || shape->units < 2 || shape->flops < config_.splitMinMflop * 1e6) return false;
  auto slices = splitByWeight(shape->units, weights);

  // The output's copies elsewhere are stale once this runs.
  for (uint64_t h : outputsOf(op)) dropReplicas(s, h);
  s.job = std::make_unique<RemoteJob>();
  s.job->guestSequence = sequence;
  auto partials = std::make_shared<std::vector<double>>(parts.size(), 0.0);
  // The primary's own slice starts at 0, so it runs on the guest's buffers in place;
  // it is sent after the reads for the other cards, which it never overlaps.
  std::function<void()> primaryPart;
  for (size_t p = 0; p < parts.size(); ++p) {
    if (slices[p].size() == 0) continue;
    if (parts[p] == 0) primaryPart = primarySplitPart(s, op, slices[p], partials, p);
    else startSplitPartOn(s, parts[p], op, partOf(op, *shape, slices[p]), slices[p], partials, p);
  }
  if (primaryPart) primaryPart();
  if (op.which() == wire::Op::REDUCE_SUM) {
    uint64_t outHandle = op.getReduceSum().getOut();
    s.job->whenGathered = [this, &s, partials, outHandle] {
      double total = 0;
      for (double v : *partials) total += v;
      float value = static_cast<float>(total);
      capnp::MallocMessageBuilder m;
      auto w = m.initRoot<wire::Instruction>().initWrite();
      w.setBuffer(outHandle);
      w.setData(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(&value), kF32));
      sendRemote(s, 0, m);
    };
  }
  RLOG_DEBUG("scheduler") << "vaccel #" << s.id << ": op split over " << parts.size() << " cards";
  settle(s);
  return true;
}

// The primary's slice of a split op, to send once the other cards' inputs are read: in
// place, except a reduction's partial, which goes to a scratch float (partials[p]).
std::function<void()> Scheduler::primarySplitPart(Session& s, wire::Op::Reader op, Slice slice,
                                                  const std::shared_ptr<std::vector<double>>& partials, size_t p) {
  const uint64_t partial = op.which() == wire::Op::REDUCE_SUM ? scratch(s, 0, kF32) : 0;
  auto copy = std::make_shared<capnp::MallocMessageBuilder>();
  copy->setRoot(op);
  return [this, &s, copy, slice, partial, partials, p] {
    capnp::MallocMessageBuilder m;
    writePrimaryPart(copy->getRoot<wire::Op>().asReader(), m.initRoot<wire::Instruction>().initOp(), slice, partial);
    sendRemote(s, 0, m);
    if (partial) readPartial(s, 0, partial, &(*partials)[p]);
  };
}

// Another card's part of a split op: copies of its inputs there, then its part once they
// are all sent, then its output comes back (a reduction's partial into partials[p]).
void Scheduler::startSplitPartOn(Session& s, size_t member, wire::Op::Reader op, const SplitPart& part, Slice slice,
                                 const std::shared_ptr<std::vector<double>>& partials, size_t p) {
  const bool reduce = op.which() == wire::Op::REDUCE_SUM;
  auto gate = std::make_shared<Gate>(Gate{part.inputs.size() + 1, {}});
  auto ready = Gate::ticker(gate);
  std::vector<uint64_t> local;
  for (auto& in : part.inputs) local.push_back(replica(s, member, in.handle, in.offset, in.length, in.cache, ready));
  uint64_t result = part.fresh ? scratch(s, member, part.outLength) : local.back();
  auto rewritten = std::make_shared<capnp::MallocMessageBuilder>();
  writeRemotePart(op, rewritten->initRoot<wire::Instruction>().initOp(), slice, local, result);
  gate->then = [this, &s, member, rewritten, result, part, reduce, partials, p] {
    sendRemote(s, member, *rewritten);
    if (!reduce) {
      copyBetween(s, member, result, 0, part.outLength, 0, part.outHandle, part.outOffset, [] {});
      return;
    }
    readPartial(s, member, result, &(*partials)[p]);
  };
  ready();
}

// ---------------------------------------------------------------------------------
// Job bookkeeping

void Scheduler::settle(Session& s) {
  RemoteJob* job = s.job.get();
  if (!job) return;
  if (job->awaiting > 0 && --job->awaiting > 0) return;
  if (!job->fencing) {
    if (job->whenGathered) {
      auto gathered = std::move(job->whenGathered);
      job->whenGathered = nullptr;
      if (!job->error) gathered();
    }
    job->fencing = true;
    std::vector<size_t> members = job->touched;
    if (members.empty()) members.push_back(0);
    job->awaiting = static_cast<unsigned>(members.size()) + 1;  // +1: released below
    for (size_t m : members) {
      capnp::MallocMessageBuilder f;
      f.initRoot<wire::Instruction>().setFence();
      sendRemote(s, m, f, [](wire::Reply::Reader) { return true; });
    }
    settle(s);
    return;
  }
  finishJob(s);
}

void Scheduler::onRemoteReply(Session& s, uint64_t sequence, Body& body) {
  auto it = s.remoteReplies.find(sequence);
  if (it != s.remoteReplies.end()) {
    auto handler = it->second;  // may erase itself
    handler(body);
    return;
  }
  // An instruction with no reply of its own failed (an alloc, a write, a split op).
  auto decoded = transport::decodeGuard([&] {
    transport::MessageView in(body);
    auto reply = in.root<wire::Reply>();
    if (reply.which() != wire::Reply::ERROR) return;
    Error e = transport::errorFrom(reply.getError().getError());
    if (s.job && !s.job->error) s.job->error = e;
    else if (!s.job) RLOG_WARN("scheduler") << "vaccel #" << s.id << ": a scheduler instruction failed: " << e.message;
  });
  if (!decoded) RLOG_ERROR("scheduler") << "malformed reply to a scheduler instruction: " << decoded.error().message;
}

void Scheduler::finishJob(Session& s) {
  auto job = std::move(s.job);
  for (auto& [member, handle] : job->scratch) sendFree(s, member, handle);
  if (job->finished) {  // the scheduler's own (saving, restoring)
    job->finished(job->error);
    return;
  }
  if (job->error) replyError(s, job->guestSequence, *job->error);
  if (s.idle) {  // a suspension or a move waited for this job
    auto idle = std::move(s.idle);
    s.idle = nullptr;
    idle();
    return;
  }
  runHeld(s);  // the guest's next instructions, in order, until one starts another job
}

void Scheduler::abandonJob(Session& s) {
  s.remoteReplies.clear();
  s.lineage.abandonReads();  // (nor its reads' replies)
  if (!s.job) return;
  if (!s.job->error) s.job->error = Error{Code::unavailable, s.unavailable};
  s.job->awaiting = 0;
  s.job->fencing = true;
  finishJob(s);  // replies to what waits: the session is unavailable now
}

void Scheduler::hold(Session& s, const FrameHeader& h, Body body) {
  s.heldBytes += body.size();
  s.held.emplace_back(h, std::move(body));
  // A guest that keeps streaming behind a long job waits at its link (all of its VM's
  // programs share it) rather than in the scheduler's memory.
  if (s.heldOverLimit() && s.link) s.link->connection->pauseReading();
  // Held for its link's backlog: it goes on once the guest has read enough, even if the
  // guest sends nothing more (answers the scheduler makes itself back a link up too).
  if (s.link) awaitDrain(*s.link);
}

}  // namespace raccel::scheduler
