// Task graphs (datablocks, after PTask: US9996394B2): a guest's DAG of built-in and tensor ops run as one
// instruction across the vaccel's cards. The scheduler tracks, for every buffer, the
// cards holding its latest contents; places each op where its estimated finish is
// earliest (the bytes it would have to copy there count as transfer time, so it goes
// where its inputs already are unless another card is idle enough to pay for the copy);
// and sends an op once everything it depends on has been sent, so each card's own
// in-order queue keeps the data right. At the end every buffer's latest contents go back
// to the primary. Copies are counted in the vaccel's bytesMoved (raccelctl vaccels).
#include <capnp/message.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/scheduler.h"
#include "scheduler/state.h"
#include "transport/wire_types.h"

namespace raccel::scheduler {

namespace {
constexpr uint64_t kF32 = 4;
constexpr size_t kMaxNodes = 4096;
constexpr double kLinkBytesPerSecond = 1.25e9;  // 10 Gbit/s between cards, for the estimate

struct OpBuffers {
  std::vector<uint64_t> reads;
  uint64_t writes = 0;
  bool writeIsFresh = false;  // the output's old contents are not read
  double flops = 0;
  std::string problem;        // when the op's sizes do not fit its buffers
};

// A tensor op: it reads every operand and writes operand 0, in part (a view of its
// buffer: the rest of the buffer's contents stay, so they are not fresh). Each operand
// must hold the last element its view reaches; the card checks the op itself again.
template <class Need>
void tensorBuffers(wire::TensorOp::Reader t, Need& need, OpBuffers& b) {
  using limits::satAdd;
  using limits::satMul;
  if (t.getFn() == wire::TensorFn::LAYER_NORM || t.getFn() == wire::TensorFn::NLL_LOSS) {
    b.problem = "a tensor op that writes more than its output (layerNorm, nllLoss) is sent on its own, not in a graph";
    return;
  }
  auto shape = t.getShape();
  auto operands = t.getOperands();
  if (operands.size() == 0 || operands.size() > 4 || shape.size() == 0 || shape.size() > 6) {
    b.problem = "a tensor op of " + std::to_string(operands.size()) + " operands over " + std::to_string(shape.size()) +
                " dimensions (1 to 4, over 1 to 6)";
    return;
  }
  uint64_t elements = 1;
  for (uint64_t d : shape) elements = satMul(elements, d);
  for (unsigned i = 0; i < operands.size(); ++i) {
    auto o = operands[i];
    if (o.getStrides().size() != shape.size()) {
      b.problem = "tensor operand " + std::to_string(i) + " has " + std::to_string(o.getStrides().size()) +
                  " strides for a shape of " + std::to_string(shape.size());
      return;
    }
    const uint64_t last = lastElementOf(o, shape);
    const uint64_t size = tensorTypeBytes(transport::fromWire(o.getType()));
    const std::string role = "tensor operand " + std::to_string(i);
    if (elements > 0) need(o.getBuffer(), satMul(satAdd(last, 1), size), role.c_str());
    else need(o.getBuffer(), 0, role.c_str());
    b.reads.push_back(o.getBuffer());
  }
  b.writes = operands[0].getBuffer();
  b.flops = double(elements) * (t.getFn() == wire::TensorFn::MATMUL ? 2 : 1);
}

OpBuffers buffersOf(wire::Op::Reader op, const std::unordered_map<uint64_t, uint64_t>& sizes) {
  OpBuffers b;
  auto need = [&](uint64_t h, uint64_t bytes, const char* role) {
    auto it = sizes.find(h);
    if (it == sizes.end()) b.problem = std::string(role) + " is buffer " + std::to_string(h) + ", which does not exist";
    else if (it->second < bytes && b.problem.empty())
      b.problem = std::string(role) + " (buffer " + std::to_string(h) + ") holds " + std::to_string(it->second) +
                  " bytes; the op needs " + std::to_string(bytes);
  };
  using limits::satMul;
  switch (op.which()) {
    case wire::Op::GEMM: {
      auto g = op.getGemm();
      uint64_t m = g.getM(), n = g.getN(), k = g.getK();
      need(g.getA(), satMul(m, k, kF32), "a"), need(g.getB(), satMul(k, n, kF32), "b"), need(g.getC(), satMul(m, n, kF32), "c");
      b.reads = {g.getA(), g.getB()};
      if (g.getBeta() != 0) b.reads.push_back(g.getC());
      b.writes = g.getC();
      b.writeIsFresh = g.getBeta() == 0 && g.getC() != g.getA() && g.getC() != g.getB();
      b.flops = 2.0 * m * n * k;
      break;
    }
    case wire::Op::AXPY: {
      auto a = op.getAxpy();
      need(a.getX(), satMul(a.getN(), kF32), "x"), need(a.getY(), satMul(a.getN(), kF32), "y");
      b.reads = {a.getX(), a.getY()};
      b.writes = a.getY();
      b.flops = 2.0 * a.getN();
      break;
    }
    case wire::Op::VADD: {
      auto v = op.getVadd();
      need(v.getA(), satMul(v.getN(), kF32), "a"), need(v.getB(), satMul(v.getN(), kF32), "b"),
          need(v.getOut(), satMul(v.getN(), kF32), "out");
      b.reads = {v.getA(), v.getB()};
      b.writes = v.getOut();
      b.writeIsFresh = v.getOut() != v.getA() && v.getOut() != v.getB();
      b.flops = double(v.getN());
      break;
    }
    case wire::Op::REDUCE_SUM: {
      auto r = op.getReduceSum();
      need(r.getInput(), satMul(r.getN(), kF32), "input"), need(r.getOut(), kF32, "out");
      b.reads = {r.getInput()};
      b.writes = r.getOut();
      b.writeIsFresh = r.getOut() != r.getInput();
      b.flops = double(r.getN());
      break;
    }
    case wire::Op::TENSOR:
      tensorBuffers(op.getTensor(), need, b);
      break;
    default:
      b.problem = "unknown built-in op (tag " + std::to_string(static_cast<unsigned>(op.which())) +
                  "); a graph takes gemm, axpy, vadd, reduceSum and tensor ops";
      break;
  }
  return b;
}

// The op with every buffer handle replaced by its copy on the card that runs it.
void remap(wire::Op::Reader from, wire::Op::Builder to, const std::function<uint64_t(uint64_t)>& local) {
  switch (from.which()) {
    case wire::Op::GEMM: {
      to.setGemm(from.getGemm());
      auto g = to.getGemm();
      g.setA(local(g.getA())), g.setB(local(g.getB())), g.setC(local(g.getC()));
      break;
    }
    case wire::Op::AXPY: {
      to.setAxpy(from.getAxpy());
      auto a = to.getAxpy();
      a.setX(local(a.getX())), a.setY(local(a.getY()));
      break;
    }
    case wire::Op::VADD: {
      to.setVadd(from.getVadd());
      auto v = to.getVadd();
      v.setA(local(v.getA())), v.setB(local(v.getB())), v.setOut(local(v.getOut()));
      break;
    }
    case wire::Op::REDUCE_SUM: {
      to.setReduceSum(from.getReduceSum());
      auto r = to.getReduceSum();
      r.setInput(local(r.getInput())), r.setOut(local(r.getOut()));
      break;
    }
    case wire::Op::TENSOR: {
      to.setTensor(from.getTensor());
      for (auto o : to.getTensor().getOperands()) o.setBuffer(local(o.getBuffer()));
      break;
    }
    default:
      break;  // refused before it runs (buffersOf)
  }
}
}  // namespace

// One graph under way (owned by the closures of its session's job).
struct GraphRun {
  capnp::MallocMessageBuilder copy;  // the guest's graph, kept while it runs
  std::vector<OpBuffers> ops;
  std::vector<std::vector<size_t>> preds, dependents;
  std::vector<size_t> waitingFor;     // predecessors not yet sent
  std::vector<double> finish;         // estimated, seconds from the start
  std::vector<size_t> ready;          // all predecessors sent, not placed yet
  size_t sent = 0;
  bool pumping = false;
  bool gathered = false;              // results sent back to the primary
  bool roundRobin = false;
  std::vector<size_t> candidates;     // members that run built-in ops
  std::vector<double> memberFree;     // estimated time each member frees
  std::map<uint64_t, std::set<size_t>> valid;                 // buffer -> members with its latest contents
  std::map<std::pair<size_t, uint64_t>, uint64_t> local;      // (member, buffer) -> its copy there
};

bool Scheduler::startGraph(Session& s, uint64_t sequence, wire::Graph::Reader graph) {
  auto run = std::make_shared<GraphRun>();
  run->copy.setRoot(graph);
  auto nodes = run->copy.getRoot<wire::Graph>().asReader().getNodes();
  auto refuse = [&](const std::string& why) {
    replyError(s, sequence, Error{Code::invalidArgument, "graph: " + why});
    return true;
  };
  if (nodes.size() == 0) return refuse("it has no nodes");
  if (nodes.size() > kMaxNodes) return refuse("it has " + std::to_string(nodes.size()) + " nodes; at most " +
                                              std::to_string(kMaxNodes) + " in one graph");
  run->roundRobin = graph.getPlacement() == wire::Graph::Placement::ROUND_ROBIN;
  for (size_t i = 0; i < s.members.size(); ++i)
    if (s.members[i].node && pool().cards()[s.members[i].card].spec.runs(ProgramKind::builtin)) run->candidates.push_back(i);
  if (run->candidates.empty()) return refuse("no card of this virtual accelerator runs built-in ops");
  run->memberFree.assign(s.members.size(), 0);

  // Dependences: explicit `after`, and each op's data (RAW, WAR, WAW).
  const size_t n = nodes.size();
  std::vector<std::set<size_t>> preds(n);
  std::map<uint64_t, size_t> lastWriter;
  std::map<uint64_t, std::vector<size_t>> readersSince;
  for (size_t i = 0; i < n; ++i) {
    run->ops.push_back(buffersOf(nodes[i].getOp(), s.buffers));
    const OpBuffers& b = run->ops.back();
    if (!b.problem.empty()) return refuse("node " + std::to_string(i) + ": " + b.problem);
    for (uint32_t a : nodes[i].getAfter()) {
      if (a >= i) return refuse("node " + std::to_string(i) + " is after node " + std::to_string(a) + ", which is not an earlier node");
      preds[i].insert(a);
    }
    for (uint64_t h : b.reads)
      if (auto w = lastWriter.find(h); w != lastWriter.end()) preds[i].insert(w->second);
    if (auto w = lastWriter.find(b.writes); w != lastWriter.end()) preds[i].insert(w->second);
    for (size_t r : readersSince[b.writes])
      if (r != i) preds[i].insert(r);
    for (uint64_t h : b.reads) readersSince[h].push_back(i);
    readersSince[b.writes].clear();
    lastWriter[b.writes] = i;
  }
  run->dependents.resize(n);
  for (size_t i = 0; i < n; ++i) run->preds.emplace_back(preds[i].begin(), preds[i].end());
  run->waitingFor.resize(n);
  run->finish.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    run->waitingFor[i] = preds[i].size();
    for (size_t p : preds[i]) run->dependents[p].push_back(i);
    if (preds[i].empty()) run->ready.push_back(i);
  }
  for (auto& [h, bytes] : s.buffers) {
    run->valid[h] = {0};
    run->local[{0, h}] = h;
  }
  for (auto& b : run->ops) dropReplicas(s, b.writes);  // the split ops' cached copies go stale

  s.job = std::make_unique<RemoteJob>();
  s.job->guestSequence = sequence;
  RLOG_DEBUG("scheduler") << labelOf(s) << ": graph of " << n << " node(s) over " << run->candidates.size() << " card(s)";
  pumpGraph(s, run);
  return true;
}

// The card node i runs on: the earliest estimated finish (fewest bytes to copy there,
// then the lowest member, on ties), or the next in turn with roundRobin. Books its time.
size_t Scheduler::placeGraphNode(Session& s, GraphRun& run, size_t i) {
  const OpBuffers& b = run.ops[i];
  double depsDone = 0;
  for (size_t p : run.preds[i]) depsDone = std::max(depsDone, run.finish[p]);
  auto speedOf = [&](size_t c) { return std::max(1.0, s.members[c].blocks * pool().blockTflops() * 1e12); };
  size_t member = run.candidates[i % run.candidates.size()];
  if (!run.roundRobin) {
    double bestFinish = 0;
    uint64_t bestBytes = 0;
    bool first = true;
    for (size_t c : run.candidates) {
      uint64_t bytes = 0;
      for (uint64_t h : b.reads)
        if (!run.valid[h].count(c)) bytes += s.buffers.at(h);
      double start = std::max(run.memberFree[c], depsDone) + bytes / kLinkBytesPerSecond;
      double finish = start + b.flops / speedOf(c);
      if (first || finish < bestFinish - 1e-12 || (std::abs(finish - bestFinish) <= 1e-12 && bytes < bestBytes)) {
        member = c, bestFinish = finish, bestBytes = bytes, first = false;
      }
    }
  }
  run.finish[i] = std::max(run.memberFree[member], depsDone) + b.flops / speedOf(member);
  run.memberFree[member] = run.finish[i];
  return member;
}

// Node i on `member`: its inputs' latest contents copied there, then the op; when it has
// gone, the nodes waiting only for it are ready, and the pump goes on.
void Scheduler::sendGraphNode(Session& s, const std::shared_ptr<GraphRun>& run, size_t i, size_t member) {
  const OpBuffers& b = run->ops[i];
  auto gate = std::make_shared<Gate>(Gate{1, {}});
  auto copied = Gate::ticker(gate);
  for (uint64_t h : b.reads) {
    auto& where = run->valid[h];
    if (where.count(member)) continue;
    size_t from = where.count(0) ? 0 : *where.begin();
    uint64_t bytes = s.buffers.at(h);
    uint64_t& to = run->local[{member, h}];
    if (!to) to = scratch(s, member, bytes);
    ++gate->left;
    copyBetween(s, from, run->local.at({from, h}), 0, bytes, member, to, 0, copied);
    where.insert(member);
  }
  if (!run->local.count({member, b.writes})) run->local[{member, b.writes}] = scratch(s, member, s.buffers.at(b.writes));
  run->valid[b.writes] = {member};
  gate->then = [this, &s, run, i, member] {
    capnp::MallocMessageBuilder m;
    auto nodes = run->copy.getRoot<wire::Graph>().asReader().getNodes();
    remap(nodes[i].getOp(), m.initRoot<wire::Instruction>().initOp(),
          [&](uint64_t h) { return run->local.at({member, h}); });
    sendRemote(s, member, m);
    ++run->sent;
    for (size_t d : run->dependents[i])
      if (--run->waitingFor[d] == 0) run->ready.push_back(d);
    pumpGraph(s, run);
  };
  copied();  // the gate's own tick: fires now when nothing had to be copied
}

void Scheduler::pumpGraph(Session& s, const std::shared_ptr<GraphRun>& run) {
  if (run->pumping) return;  // a gate that fired while placing: the loop below picks it up
  run->pumping = true;
  while (!run->ready.empty()) {
    std::sort(run->ready.begin(), run->ready.end());
    size_t i = run->ready.front();
    run->ready.erase(run->ready.begin());
    sendGraphNode(s, run, i, placeGraphNode(s, *run, i));
  }
  run->pumping = false;
  const size_t nodes = run->copy.getRoot<wire::Graph>().asReader().getNodes().size();
  if (run->sent < nodes || run->gathered) return;  // copies under way: their gates pump again
  run->gathered = true;
  // Every buffer's latest contents back on the primary.
  for (auto& [h, where] : run->valid)
    if (!where.count(0)) copyBetween(s, *where.begin(), run->local.at({*where.begin(), h}), 0, s.buffers.at(h), 0, h, 0, [] {});
  settle(s);
}

}  // namespace raccel::scheduler
