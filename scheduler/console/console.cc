#include "scheduler/console/console.h"

#include <chrono>

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/links/node_links.h"
#include "scheduler/relocate/relocator.h"
#include "scheduler/state.h"

namespace raccel::scheduler {

using transport::Body;
using transport::Connection;
using transport::ConnectionPtr;
using transport::FrameHeader;
using transport::MessageIn;

namespace {
wire::PoolRange::State wireBlockState(Pool::BlockState state) {
  switch (state) {
    case Pool::BlockState::free: return wire::PoolRange::State::FREE;
    case Pool::BlockState::used: return wire::PoolRange::State::USED;
    case Pool::BlockState::draining: return wire::PoolRange::State::DRAINING;
    case Pool::BlockState::offline: return wire::PoolRange::State::OFFLINE;
  }
  return wire::PoolRange::State::OFFLINE;
}
}  // namespace

Console::Console(uv_loop_t* loop, const SchedulerConfig& config, Scheduler& scheduler)
    : loop_(loop), config_(config), ops_(scheduler), s_(scheduler) {}

Console::~Console() = default;

Status Console::start() {
  auto address = transport::parseAddress(config_.console);
  if (!address) return fail(address.error());
  auto listener = transport::Listener::listen(loop_, *address, 1 << 20, [this](ConnectionPtr c) { accept(std::move(c)); }, 0600);
  if (!listener) return fail(listener.error());
  listener_ = std::move(*listener);
  return startHttp();
}

void Console::stop() {
  listener_.reset();
  if (http_) http_->stop();
  auto all = consoles_;
  for (auto& c : all) c->close();
}

void Console::event(const std::string& kind, const std::string& subjectText, const std::string& detailText) {
  // Subjects and details carry peers' text (program names, errors): kept clipped, so
  // the ring holds at most kKeptEvents * 2 * kMaxLoggedBytes of it.
  std::string subject = limits::clip(subjectText), detail = limits::clip(detailText);
  uint64_t unixMs = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  events_.push_back({unixMs, kind, subject, detail});
  if (events_.size() > kKeptEvents) events_.pop_front();
  ++eventCounts_[kind];
  if (http_ && http_->streams() > 0) http_->publish(sseData(events_.back()));
  for (auto& [connection, sequence] : subscribers_) {
    capnp::MallocMessageBuilder m;
    fillEvent(m.initRoot<wire::ConsoleReply>().initEvent(), unixMs, kind, subject, detail);
    connection->send(0, sequence, m);
  }
}

void Console::accept(ConnectionPtr connection) {
  constexpr size_t kMaxConsoles = 64;  // raccelctl clients at once (the socket is 0600: root's)
  if (consoles_.size() >= kMaxConsoles) {
    if (++refused_ % 1000 == 1) RLOG_WARN("scheduler") << "console: " << consoles_.size() << " clients; refusing another";
    connection->close();
    return;
  }
  Connection::Callbacks cb;
  cb.onFrame = [this](Connection& c, const FrameHeader& h, Body body) { onFrame(c, h, std::move(body)); };
  cb.onClose = [this](Connection& c, bool) {
    std::erase_if(subscribers_, [&](auto& sub) { return sub.first == &c; });
    consoles_.erase(std::remove_if(consoles_.begin(), consoles_.end(), [&](auto& p) { return p.get() == &c; }), consoles_.end());
  };
  connection->setCallbacks(cb);
  consoles_.push_back(connection);
  connection->start();
}

void Console::onFrame(Connection& connection, const FrameHeader& h, Body body) {
  capnp::MallocMessageBuilder m;
  auto reply = m.initRoot<wire::ConsoleReply>();
  bool subscribed = false;  // events: the replies are the events themselves
  auto decoded = transport::decodeGuard([&] {
    MessageIn in(std::move(body));
    auto request = in.root<wire::ConsoleRequest>();
    if (request.which() != wire::ConsoleRequest::EVENTS) return answer(request, reply);
    for (auto& e : events_) {
      capnp::MallocMessageBuilder one;
      fillEvent(one.initRoot<wire::ConsoleReply>().initEvent(), e.unixMs, e.kind, e.subject, e.detail);
      connection.send(0, h.sequence, one);
    }
    capnp::MallocMessageBuilder mark;  // the recent ones end here; live ones follow
    mark.initRoot<wire::ConsoleReply>().setDone("recent events sent");
    connection.send(0, h.sequence, mark);
    subscribers_.emplace_back(&connection, h.sequence);
    subscribed = true;
  });
  if (!decoded) transport::setError(reply.initError(), decoded.error());
  else if (subscribed) return;
  connection.send(h.channel, h.sequence, m);
}

void Console::answer(wire::ConsoleRequest::Reader request, wire::ConsoleReply::Builder reply) {
  switch (request.which()) {
    case wire::ConsoleRequest::NODES: return nodes(reply);
    case wire::ConsoleRequest::CARDS: return cards(reply);
    case wire::ConsoleRequest::POOL: return poolMap(reply);
    case wire::ConsoleRequest::VMS: return vms(reply);
    case wire::ConsoleRequest::VACCELS: return vaccels(reply);
    case wire::ConsoleRequest::EVENTS: break;  // a subscription: onFrame, onHttp
    default: return act(request, reply);
  }
  transport::setError(reply.initError(), Error{Code::unimplemented, "unknown console request"});
}

void Console::act(wire::ConsoleRequest::Reader request, wire::ConsoleReply::Builder reply) {
  auto answerWith = [&](const Result<std::string>& done) {
    if (done) reply.setDone(*done);
    else transport::setError(reply.initError(), done.error());
  };
  switch (request.which()) {
    case wire::ConsoleRequest::PREEMPT: return answerWith(ops_.relocator_->preemptByOperator(request.getPreempt()));
    case wire::ConsoleRequest::RESUME: {
      auto resumed = ops_.relocator_->resumeByOperator(request.getResume());
      if (!resumed) return answerWith(fail(resumed.error()));
      return answerWith("vaccel #" + std::to_string(request.getResume()) + " resumes as soon as its blocks are free");
    }
    case wire::ConsoleRequest::PREEMPT_ELSEWHERE:
    case wire::ConsoleRequest::RESUME_ELSEWHERE: {
      const bool preempt = request.which() == wire::ConsoleRequest::PREEMPT_ELSEWHERE;
      auto ref = preempt ? request.getPreemptElsewhere() : request.getResumeElsewhere();
      return answerWith(ops_.state_->actElsewhere(ref.getHost(), ref.getId(), preempt));
    }
    case wire::ConsoleRequest::DEFRAG:
      return answerWith(ops_.relocator_->defrag(request.getDefrag().getMaxMoves(), request.getDefrag().getMaxMoveBytes()));
    case wire::ConsoleRequest::DRAIN: return answerWith(ops_.relocator_->drainNode(request.getDrain().getNode(), request.getDrain().getUndo()));
    case wire::ConsoleRequest::SET_POLICY: {
      std::vector<std::pair<std::string, std::string>> settings;
      for (auto kv : request.getSetPolicy().getSettings()) settings.emplace_back(kv.getKey(), kv.getValue());
      return answerWith(ops_.setPolicy(request.getSetPolicy().getVm(), settings));
    }
    default: break;
  }
  transport::setError(reply.initError(), Error{Code::unimplemented, "unknown console request"});
}

void Console::nodes(wire::ConsoleReply::Builder reply) const {
  std::vector<size_t> listed;
  for (size_t i = 0; i < s_.pool().nodes().size(); ++i)
    if (!s_.pool().nodes()[i].forgotten) listed.push_back(i);
  auto out = reply.initNodes(listed.size());
  for (size_t j = 0; j < listed.size(); ++j) {
    size_t i = listed[j];
    const Node& n = s_.pool().nodes()[i];
    out[j].setName(n.name);
    out[j].setOnline(n.online);
    out[j].setState(n.stateName());
    out[j].setCards(static_cast<uint32_t>(n.cards.size()));
    out[j].setFirstBlock(n.blocks.first);
    out[j].setBlocks(n.blocks.count);
    out[j].setHostCpuMilli(n.host.cpuMilli);
    out[j].setHostMemoryMib(n.host.memoryMib);
    out[j].setHostCpuMilliUsed(n.hostUsed.cpuMilli);
    out[j].setHostMemoryMibUsed(n.hostUsed.memoryMib);
    auto link = s_.links_->byPoolNode().find(i);
    if (link != s_.links_->byPoolNode().end()) {
      out[j].setAddress(link->second->connection->peer());
      out[j].setMsSinceHeartbeat(s_.nowMs() - link->second->lastHeardMs);
      out[j].setContexts(link->second->contexts);
    }
  }
}

void Console::cards(wire::ConsoleReply::Builder reply) const {
  auto out = reply.initCards(s_.pool().cards().size());
  for (size_t i = 0; i < s_.pool().cards().size(); ++i) {
    const Card& c = s_.pool().cards()[i];
    out[i].setNode(s_.pool().nodes()[c.node].name);
    out[i].setIndex(c.spec.index);
    out[i].setKind(transport::toWire(c.spec.kind));
    out[i].setModel(c.spec.model);
    out[i].setTflops(c.spec.tflops);
    out[i].setMemoryBytes(c.spec.memoryBytes);
    out[i].setBackend(c.spec.backend);
    out[i].setFirstBlock(c.blocks.first);
    out[i].setBlocks(c.blocks.count);
    out[i].setOnline(s_.pool().nodes()[c.node].online);
  }
}

void Console::poolMap(wire::ConsoleReply::Builder reply) const {
  std::map<VaccelId, std::string> owners;
  for (auto& [id, s] : s_.sessions_) owners[id] = s_.labelOf(*s);
  struct Run {
    uint32_t first, count;
    wire::PoolRange::State state;
    VaccelId owner;
    size_t card;
  };
  std::vector<Run> runs;
  uint32_t counts[4] = {};  // by Pool::BlockState
  for (size_t ci = 0; ci < s_.pool().cards().size(); ++ci) {
    const Card& c = s_.pool().cards()[ci];
    if (s_.pool().nodes()[c.node].forgotten) continue;
    for (uint32_t b = c.blocks.first; b < c.blocks.end(); ++b) {
      const Pool::BlockState blockState = s_.pool().blockState(b);
      ++counts[static_cast<unsigned>(blockState)];
      auto state = wireBlockState(blockState);
      VaccelId owner = s_.pool().ownerOf(b);
      if (!runs.empty() && runs.back().state == state && runs.back().owner == owner &&
          runs.back().first + runs.back().count == b && s_.pool().cards()[runs.back().card].node == c.node &&
          s_.pool().cards()[runs.back().card].spec.kind == c.spec.kind)
        ++runs.back().count;
      else
        runs.push_back({b, 1, state, owner, ci});
    }
  }
  auto map = reply.initPool();
  map.setBlockTflops(s_.pool().blockTflops());
  map.setTotal(s_.pool().total());
  map.setFree(s_.pool().freeBlocks());
  map.setBlocks(counts[0] + counts[1] + counts[2] + counts[3]);
  map.setUsed(counts[static_cast<unsigned>(Pool::BlockState::used)]);
  map.setDraining(counts[static_cast<unsigned>(Pool::BlockState::draining)]);
  map.setOffline(counts[static_cast<unsigned>(Pool::BlockState::offline)]);
  auto out = map.initRanges(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const Card& c = s_.pool().cards()[runs[i].card];
    out[i].setFirst(runs[i].first);
    out[i].setCount(runs[i].count);
    out[i].setState(runs[i].state);
    out[i].setNode(s_.pool().nodes()[c.node].name);
    out[i].setKind(transport::toWire(c.spec.kind));
    if (runs[i].owner != kNoOwner) {
      auto o = owners.find(runs[i].owner);
      std::string elsewhere = o != owners.end() ? std::string() : s_.state_->holderElsewhere(runs[i].owner);
      out[i].setOwner(o != owners.end()     ? o->second
                      : !elsewhere.empty() ? elsewhere
                                           : "vaccel#" + std::to_string(runs[i].owner));
    }
  }
}

void Console::vms(wire::ConsoleReply::Builder reply) const {
  auto elsewhere = s_.state_->vmsElsewhere();
  auto out = reply.initVms(s_.vms_.size() + elsewhere.size());
  for (size_t i = 0; i < elsewhere.size(); ++i) {  // after this scheduler's own
    auto p = policyElsewhere(elsewhere[i].vm, elsewhere[i].settings);  // as that host published it
    auto e = out[s_.vms_.size() + i];
    e.setName(elsewhere[i].vm);
    e.setHost(elsewhere[i].scheduler);
    e.setState("elsewhere");
    if (!p) {
      e.setProblem("its policy as host " + elsewhere[i].scheduler + " published it does not parse: " + p.error().message);
      continue;
    }
    e.setTflops(p->tflops);
    e.setPriority(p->priority);
    e.setKinds(kindsToString(p->kinds));
    e.setMemoryQuota(p->memoryQuota);
    e.setHostCpuMilli(p->hostCpuMilli);
    e.setHostMemoryMib(p->hostMemoryMib);
  }
  for (size_t i = 0; i < s_.vms_.size(); ++i) {
    const Vm& vm = *s_.vms_[i];
    const VmPolicy& p = vm.policy;
    auto e = out[i];
    e.setName(p.name);
    e.setSource(p.source);
    e.setSocket(p.socket);
    e.setAttach(p.attach == VmPolicy::Attach::connect ? "connect" : "listen");
    e.setTflops(p.tflops);
    e.setPriority(p.priority);
    e.setKinds(kindsToString(p.kinds));
    e.setMemoryQuota(p.memoryQuota);
    e.setHostCpuMilli(p.hostCpuMilli);
    e.setHostMemoryMib(p.hostMemoryMib);
    const char* state = vm.links > 0                              ? "connected"
                        : !vm.active && !vm.problem.empty()       ? "rejected"
                        : !vm.active                              ? "stopped"
                        : p.attach == VmPolicy::Attach::listen    ? "listening"
                                                                  : "waiting";
    e.setState(state);
    e.setProblem(vm.problem);
    e.setBlocksHeld(vm.blocksHeld);
    e.setMemoryUsed(vm.memoryUsed);
    uint64_t ns = vm.kernelNsEnded;
    for (auto& [id, s] : s_.sessions_)
      if (s->vm == &vm) ns += s->kernelNs();
    e.setKernelMs(ns / 1000000);
  }
}

void Console::vaccels(wire::ConsoleReply::Builder reply) const {
  std::vector<const Session*> sessions;
  for (auto& [id, s] : s_.sessions_) sessions.push_back(s.get());
  auto elsewhere = s_.state_->vaccelsElsewhere();
  auto unplaced = s_.state_->unplacedElsewhere();
  auto out = reply.initVaccels(sessions.size() + elsewhere.size() + unplaced.size());
  for (size_t i = 0; i < unplaced.size(); ++i) {  // last: other hosts' vaccels that hold no blocks
    auto e = out[sessions.size() + elsewhere.size() + i];
    const PoolState::Unplaced& u = unplaced[i].vaccel;
    e.setId(u.vaccel);
    e.setVm(u.vm);
    e.setProgram(u.program);
    e.setPriority(u.priority);
    e.setHost(unplaced[i].scheduler);
    e.setState(u.state);
    e.setWhy(u.why);
  }
  for (size_t i = 0; i < elsewhere.size(); ++i) {  // after this scheduler's own
    auto e = out[sessions.size() + i];
    e.setId(elsewhere[i].vaccel);
    e.setVm(elsewhere[i].vm);
    e.setProgram(elsewhere[i].program);
    e.setPriority(priorityOfPoolPriority(elsewhere[i].priority));
    e.setHost(elsewhere[i].scheduler);
    s_.writePlacement(e, elsewhere[i].ranges);
    e.setState("elsewhere");
  }
  for (size_t i = 0; i < sessions.size(); ++i) {
    const Session& s = *sessions[i];
    out[i].setId(s.id);
    out[i].setVm(s.vm->policy.name);
    out[i].setProgram(s.program);
    out[i].setPriority(s.priority);
    s_.writePlacement(out[i], s.blocks);
    out[i].setMemoryUsed(s.memoryUsed);
    out[i].setMemoryQuota(s.vm->policy.memoryQuota);
    out[i].setInstructions(s.instructions);
    out[i].setBytesMoved(s.bytesMoved);
    out[i].setKernelMs(s.kernelNs() / 1e6);
    out[i].setState(!s.unavailable.empty() ? "unavailable" : phaseName(s.phase));
    out[i].setWhy(!s.unavailable.empty() ? s.unavailable : s.phase == Phase::running ? std::string() : s.why);
  }
}

}  // namespace raccel::scheduler
