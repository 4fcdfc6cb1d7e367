#include "scheduler/scheduler.h"

#include "scheduler/console/console.h"
#include "scheduler/links/node_links.h"
#include "scheduler/persist/persistence.h"
#include "scheduler/relocate/relocator.h"
#include "scheduler/state.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "common/limits.h"
#include "common/log.h"
#include "schema/console.capnp.h"
#include "schema/frame.capnp.h"
#include "schema/guest.capnp.h"
#include "schema/node.capnp.h"
#include "transport/request_table.h"
#include "transport/wire_types.h"

namespace raccel::scheduler {

using transport::Body;
using transport::Connection;
using transport::ConnectionPtr;
using transport::FrameHeader;
using transport::MessageIn;

namespace {
constexpr uint64_t kTickMs = 200;

bool isKernelTimes(const Body& body) {
  bool yes = false;
  (void)transport::decodeGuard([&] {
    transport::MessageView in(body);
    yes = in.root<wire::Reply>().which() == wire::Reply::KERNEL_TIMES;
  });
  return yes;
}

}  // namespace

Scheduler::Scheduler(uv_loop_t* loop, SchedulerConfig config, std::unique_ptr<PoolState> state)
    : loop_(loop), config_(std::move(config)),
      state_(state ? std::move(state) : std::make_unique<LocalPoolState>(config_.blockTflops)) {
  console_ = std::make_unique<Console>(loop_, config_, *this);
  persistence_ = std::make_unique<Persistence>(config_, *this);
  links_ = std::make_unique<NodeLinks>(loop_, config_, *this);
  relocator_ = std::make_unique<Relocator>(loop_, config_, *this);
  state_->changed = [this] { relocator_->requestPlacement(); };  // another host's decision may free blocks
  state_->lost = [this](VaccelId id, const std::string& why) {
    // Off blocks that are no longer its own: saved to host memory, resumed when blocks free.
    if (Session* s = sessionById(id); s && s->phase == Phase::running) relocator_->suspend(*s, why, false);
  };
  state_->moveAsked = [this](const Pool::Move& mv, const std::string& why) {
    return relocator_->moveIfIdle(mv, config_.defragMaxMoveBytes, why);
  };
  state_->actionAsked = [this](VaccelId id, bool preempt, const std::string& by) -> Status {
    if (!preempt) return relocator_->resumeByOperator(id);
    Session* s = sessionById(id);
    if (!s) return fail(Code::notFound, "no vaccel #" + std::to_string(id));
    relocator_->suspend(*s, "suspended by the operator (asked on host " + by + ")", true);
    return {};
  };
  state_->drainAsked = [this](const std::string& name, bool draining, const std::string& by) {
    size_t index = pool().nodeIndex(name);
    if (index == SIZE_MAX) return;  // a node this pool has no record of yet: its drain waits in the view
    if (!draining) return relocator_->endDrain(name, "ended on host " + (by.empty() ? std::string("another host") : by));
    (void)relocator_->evacuate(index, by);
  };
  state_->policyAsked = [this](const std::string& vm, const PoolState::Settings& settings, const std::string& by) {
    Vm* served = findVm(vm);
    if (!served) {
      policyOverrides_[vm] = settings;  // applied when the VM attaches here
      return;
    }
    auto applied = applyPolicy(*served, settings, "set on host " + by);
    if (!applied) RLOG_ERROR("scheduler") << "vm '" << vm << "': the policy set on host " << by << " does not apply here ("
                                           << applied.error().message << "); keeping its policy";
  };
  state_->preempted = [this](VaccelId id, const std::string& why) {
    Session* s = sessionById(id);
    if (!s) return false;
    if (s->phase == Phase::running) relocator_->suspend(*s, why, false);
    return s->phase == Phase::suspending || s->phase == Phase::suspended;
  };
}

Scheduler::~Scheduler() = default;

void Scheduler::event(const std::string& kind, const std::string& subject, const std::string& detail) {
  console_->event(kind, subject, detail);
}

Status Scheduler::start() {
  if (auto listening = links_->start(); !listening) return listening;
  if (state_->shared()) advertiseNodePort();
  if (auto served = console_->start(); !served) return served;
  if (auto opened = persistence_->open(); !opened) return opened;
  for (auto& policy : config_.vms)
    if (auto attached = addVm(policy); !attached) return attached;

  settledAtMs_ = nowMs() + config_.startupGraceMs;
  relocator_->start();
  ticker_ = new uv_timer_t;
  uv_timer_init(loop_, ticker_);
  ticker_->data = this;
  uv_timer_start(ticker_, [](uv_timer_t* t) { static_cast<Scheduler*>(t->data)->tick(); }, kTickMs, kTickMs);
  RLOG_INFO("scheduler") << "netaccels connect to " << config_.nodeListen.substr(0, config_.nodeListen.rfind(':')) << ":"
                         << nodePort() << "; console on "
                         << config_.console << "; " << config_.blockTflops << " TFLOPS per block";
  return {};
}

int Scheduler::nodePort() const { return links_->port(); }

void Scheduler::advertiseNodePort() {
  std::string address = config_.nodeAdvertise;
  if (address.empty()) {
    auto listen = transport::parseAddress(config_.nodeListen);
    const std::string host = listen ? listen->host : std::string();
    if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") {
      RLOG_WARN("scheduler") << "node_listen " << config_.nodeListen << " names no host that netaccels could reach: "
                             << "netaccels that find the pool's schedulers in etcd (scheduler = etcd) will not find this "
                             << "one; set node_advertise = HOST:PORT";
      return;
    }
    address = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(nodePort());
  }
  RLOG_INFO("scheduler") << "netaccels that find the pool's schedulers in etcd reach this one at " << address;
  state_->advertise(address);
}

void Scheduler::stop() {
  stopping_ = true;
  if (ticker_) {
    uv_close(reinterpret_cast<uv_handle_t*>(ticker_), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    ticker_ = nullptr;
  }
  relocator_->stop();
  links_->stop();
  console_->stop();
  for (auto& vm : vms_) {
    vm->listener.reset();
    if (vm->retry) {
      uv_close(reinterpret_cast<uv_handle_t*>(vm->retry), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
      vm->retry = nullptr;
    }
  }
  std::vector<ConnectionPtr> all;
  for (auto& [c, link] : vmLinks_) all.push_back(link->connection);
  for (auto& c : all) c->close();
  state_->stop();  // a shared pool: this scheduler leaves it, its holdings freed at once
}

// ---------------------------------------------------------------------------------
// VMs

Scheduler::Vm* Scheduler::findVm(const std::string& name) {
  for (auto& vm : vms_)
    if (vm->policy.name == name) return vm.get();
  return nullptr;
}

Scheduler::Vm& Scheduler::vmNamed(const std::string& name) {
  if (Vm* known = findVm(name)) return *known;
  vms_.push_back(std::make_unique<Vm>());
  Vm& vm = *vms_.back();
  vm.scheduler = this;
  vm.policy.name = name;
  return vm;
}

Status Scheduler::addVm(VmPolicy policy) {
  // What the operator set with raccelctl set-policy stays over the configured policy.
  if (auto o = policyOverrides_.find(policy.name); o != policyOverrides_.end()) {
    auto changed = withSettings(policy, o->second);
    if (changed) policy = *changed;
    else RLOG_ERROR("scheduler") << "vm '" << policy.name << "': the policy set by raccelctl no longer applies ("
                                 << changed.error().message << "); using the configured one";
  }
  Vm* vm = findVm(policy.name);
  for (auto& other : vms_)
    if (other.get() != vm && other->active && other->policy.socket == policy.socket)
      return fail(Code::invalidArgument, "vm '" + policy.name + "': socket " + policy.socket + " is vm '" +
                                           other->policy.name + "''s");
  if (vm && vm->active && vm->policy == policy) return {};  // told twice (a start event and a scan)
  Vm& target = vm ? *vm : vmNamed(policy.name);
  detachVm(target);
  target.policy = std::move(policy);
  target.problem.clear();
  return attachVm(target);
}

void Scheduler::removeVm(const std::string& name, const std::string& why) {
  Vm* vm = findVm(name);
  if (!vm || !vm->active) return;
  RLOG_INFO("scheduler") << "vm '" << name << "' detached: " << why;
  event("vm-detached", name, why);
  detachVm(*vm);
}

void Scheduler::rejectVm(const std::string& name, const std::string& source, const std::string& why) {
  Vm& vm = vmNamed(name);
  detachVm(vm);
  vm.policy.source = source;
  vm.problem = why;
  RLOG_ERROR("scheduler") << "vm '" << name << "' gets no virtual accelerator: " << why;
  event("vm-rejected", name, why);
}

Status Scheduler::attachVm(Vm& vm) {
  const VmPolicy& p = vm.policy;
  vm.active = true;
  vm.backoffMs = 50;
  RLOG_INFO("scheduler") << "vm '" << p.name << "' (" << p.source << ") on " << p.socket
                         << (p.attach == VmPolicy::Attach::connect ? " (connecting)" : " (listening)") << ": up to "
                         << p.tflops << " TFLOPS, priority " << p.priority << ", kinds " << kindsToString(p.kinds);
  if (p.attach == VmPolicy::Attach::connect) {
    connectVm(vm);
    return {};
  }
  auto address = transport::parseAddress("unix:" + p.socket);
  if (!address) return fail(address.error());
  Vm* raw = &vm;
  auto listener = transport::Listener::listen(loop_, *address, wire::DEFAULT_MAX_FRAME_BYTES,
                                              [this, raw](ConnectionPtr c) { acceptVm(*raw, std::move(c)); });
  if (!listener) {
    vm.active = false;
    vm.problem = listener.error().message;
    return fail(listener.error().code, "vm '" + p.name + "': " + listener.error().message);
  }
  vm.listener = std::move(*listener);
  return {};
}

void Scheduler::detachVm(Vm& vm) {
  vm.active = false;
  ++vm.generation;
  vm.listener.reset();
  if (vm.retry) uv_timer_stop(vm.retry);
  std::vector<ConnectionPtr> links;
  for (auto& [c, link] : vmLinks_)
    if (link->vm == &vm) links.push_back(link->connection);
  for (auto& c : links) c->close();  // ends its sessions: their blocks go back to the pool
}

void Scheduler::connectVm(Vm& vm) {
  if (stopping_ || !vm.active || vm.links > 0) return;
  auto address = transport::parseAddress("unix:" + vm.policy.socket);
  if (!address) {
    vm.problem = address.error().message;
    return;
  }
  Vm* raw = &vm;
  uint64_t generation = vm.generation;
  transport::connect(loop_, *address, wire::DEFAULT_MAX_FRAME_BYTES, [this, raw, generation](Result<ConnectionPtr> r) {
    if (stopping_ || raw->generation != generation || !raw->active) {
      if (r) (*r)->close();
      return;
    }
    if (r) {
      raw->problem.clear();
      raw->backoffMs = 50;
      acceptVm(*raw, *r);
      return;
    }
    if (raw->problem != r.error().message)
      RLOG_INFO("scheduler") << "vm '" << raw->policy.name << "': " << r.error().message << "; retrying";
    raw->problem = r.error().message;
    if (!raw->retry) {
      raw->retry = new uv_timer_t;
      uv_timer_init(loop_, raw->retry);
      raw->retry->data = raw;
    }
    uv_timer_start(raw->retry, [](uv_timer_t* t) {
      auto* vm = static_cast<Vm*>(t->data);
      vm->scheduler->connectVm(*vm);
    }, raw->backoffMs, 0);
    raw->backoffMs = std::min(raw->backoffMs * 2, 1000u);
  });
}

// ---------------------------------------------------------------------------------
// Guest side

void Scheduler::acceptVm(Vm& vm, ConnectionPtr connection) {
  if (vm.links >= config_.maxVmLinks) {
    // Full: the oldest link that never sent a frame makes room; with none, this one goes.
    VmLink* silent = nullptr;
    for (auto& [c, l] : vmLinks_)
      if (l->vm == &vm && !l->spoke && !l->connection->closed() && (!silent || l->acceptedMs < silent->acceptedMs))
        silent = l.get();
    if (++refusedLinks_ % 1000 == 1)
      RLOG_WARN("scheduler") << "vm '" << vm.policy.name << "' has " << vm.links << " links (max_vm_links); "
                             << (silent ? "closing its oldest silent one" : "refusing a new one") << " ("
                             << refusedLinks_ << " so far)";
    if (!silent) {
      connection->close();
      return;
    }
    silent->connection->close();
  }
  auto link = std::make_unique<VmLink>();
  link->vm = &vm;
  link->connection = connection;
  link->acceptedMs = nowMs();
  VmLink* raw = link.get();
  Connection::Callbacks cb;
  cb.onFrame = [this, raw](Connection& c, const FrameHeader& h, Body body) {
    onGuestFrame(*raw, h, std::move(body));
    // What the scheduler answers itself (pongs, refusals, describeVaccel) waits in the
    // guest's own queue: a guest that sends and never reads stops being read, as it
    // does when relayed replies back up.
    c.throttle(c);
  };
  cb.onOversized = [this, raw](Connection&, const FrameHeader& h) { onGuestOversized(*raw, h); };
  cb.onClose = [this, raw](Connection&, bool truncated) {
    if (truncated) RLOG_WARN("scheduler") << "vm '" << raw->vm->policy.name << "' link closed in the middle of a frame";
    vmLinkClosed(*raw);
  };
  connection->setCallbacks(cb);
  vmLinks_[connection.get()] = std::move(link);
  ++vm.links;
  connection->start();
  RLOG_DEBUG("scheduler") << "vm '" << vm.policy.name << "' connected";
  if (vm.links == 1) event("vm-attached", vm.policy.name, vm.policy.socket + " (" + vm.policy.source + ")");
}

void Scheduler::vmLinkClosed(VmLink& link) {
  std::vector<uint32_t> channels;
  for (auto& [ch, s] : link.sessions) channels.push_back(ch);
  for (uint32_t ch : channels) endSession(link, ch);
  if (link.spoke || !channels.empty())
    RLOG_INFO("scheduler") << "vm '" << link.vm->policy.name << "' disconnected; " << channels.size() << " session(s) ended";
  Vm& vm = *link.vm;
  --vm.links;
  vmLinks_.erase(link.connection.get());
  // The VM's side may come back (QEMU restarted, or its guest reopened the port).
  if (vm.active && vm.policy.attach == VmPolicy::Attach::connect) connectVm(vm);
}

void Scheduler::replyError(VmLink& link, uint32_t channel, uint64_t sequence, const Error& error, uint64_t dependency) {
  capnp::MallocMessageBuilder m;
  auto e = m.initRoot<wire::Reply>().initError();
  e.setSequence(sequence);
  e.setDependency(dependency);
  transport::setError(e.initError(), error);
  link.connection->send(channel, sequence, m);
}

void Scheduler::replyError(Session& s, uint64_t sequence, const Error& error, uint64_t dependency) {
  capnp::MallocMessageBuilder m;
  auto e = m.initRoot<wire::Reply>().initError();
  e.setSequence(sequence);
  e.setDependency(dependency);
  transport::setError(e.initError(), error);
  toGuest(s, sequence, transport::encodeBody(m));
}

void Scheduler::toGuest(Session& s, uint64_t sequence, Body body) {
  if (!firstDelivery(s, sequence, body)) return;  // re-sent after a recovery; the guest has it
  if (s.link) s.link->connection->sendBody(s.channel, sequence, std::move(body));
  else s.undelivered.emplace_back(sequence, std::move(body));
}

void Scheduler::closeChannel(VmLink& link, uint32_t channel, const Error& reason) {
  capnp::MallocMessageBuilder m;
  auto closed = m.initRoot<wire::LinkControl>().initChannelClosed();
  closed.setChannel(channel);
  transport::setError(closed.initReason(), reason);
  link.connection->send(transport::kControlChannel, 0, m);
  endSession(link, channel);
}

void Scheduler::onGuestOversized(VmLink& link, const FrameHeader& h) {
  Error e{Code::invalidArgument, "frame of " + std::to_string(h.length) + " bytes exceeds the maximum of " +
                                     std::to_string(link.connection->maxFrameBytes()) +
                                     " bytes; write large data in chunks. This session is closed"};
  RLOG_WARN("scheduler") << "vm '" << link.vm->policy.name << "' channel " << h.channel << ": " << e.message;
  if (h.channel == transport::kControlChannel) return;
  replyError(link, h.channel, h.sequence, e);
  closeChannel(link, h.channel, e);
}

void Scheduler::onGuestFrame(VmLink& link, const FrameHeader& h, Body body) {
  link.spoke = true;
  if (h.channel == transport::kControlChannel) {
    auto status = transport::decodeGuard([&] {
      MessageIn in(std::move(body));
      auto control = in.root<wire::LinkControl>();
      if (control.which() == wire::LinkControl::CHANNEL_CLOSED) endSession(link, control.getChannelClosed().getChannel());
      else if (control.which() == wire::LinkControl::PING) {
        capnp::MallocMessageBuilder m;
        m.initRoot<wire::LinkControl>().setPong();
        link.connection->send(transport::kControlChannel, h.sequence, m);
      }
    });
    if (!status) RLOG_WARN("scheduler") << "vm '" << link.vm->policy.name << "': bad link control: " << status.error().message;
    return;
  }
  auto it = link.sessions.find(h.channel);
  if (it == link.sessions.end()) {
    admit(link, h.channel, h.sequence, std::move(body));
    return;
  }
  Session& s = *it->second;
  if (!s.held.empty()) {
    // What waits goes first, in the guest's order (a wait can end before runHeld is
    // called: a backed-up link drains below the high-water mark before it is told).
    hold(s, h, std::move(body));
    if (!mustHoldNow(s)) runHeld(s);
    return;
  }
  forward(link, s, h, std::move(body));
}

void Scheduler::admit(VmLink& link, uint32_t channel, uint64_t sequence, Body body) {
  Vm& vm = *link.vm;
  Ask ask;
  ask.kinds = vm.policy.kinds;
  ask.priority = vm.policy.priority;
  ask.maxFrame = wire::DEFAULT_MAX_FRAME_BYTES;
  Status ok = fail(Code::internal, "no hello");
  bool resumed = false;
  auto decoded = transport::decodeGuard([&] {
    MessageIn in(std::move(body));
    auto instruction = in.root<wire::Instruction>();
    if (instruction.which() != wire::Instruction::HELLO) {
      ok = fail(Code::invalidArgument, "no session on this channel: the first instruction must be hello");
      return;
    }
    auto hello = instruction.getHello();
    if (hello.hasResume() && hello.getResume().getVaccel() != 0) {
      resumeSession(link, channel, sequence, hello.getResume());
      resumed = true;
      return;
    }
    ok = readHello(vm, hello, ask);
  });
  if (!decoded) ok = fail(decoded.error());
  if (resumed) return;
  // While the pool settles after start, "never" may only mean "not yet": such a request
  // waits (below) and is refused, naming why, only if it still cannot be held then.
  const bool settling = this->settling();
  if (ok && !settling) ok = couldEverHold(ask.blocks, ask.kinds, vm);
  if (ok) {
    uint32_t vmMax = pool().blocksFor(vm.policy.tflops);
    if (vm.blocksClaimed + ask.blocks > vmMax)
      ok = fail(Code::resourceExhausted, "vm '" + vm.policy.name + "' may hold " + std::to_string(vmMax) +
                                             " blocks in all; its programs hold " + std::to_string(vm.blocksClaimed) +
                                             " and this one asked for " + std::to_string(ask.blocks));
  }
  if (!ok) {
    refuseHello(link, channel, sequence, vm.policy.name + "/" + (ask.program.empty() ? "?" : ask.program), ok.error());
    return;
  }
  awaitPlacement(link, channel, sequence, ask, settling);
}

Status Scheduler::readHello(const Vm& vm, wire::Hello::Reader hello, Ask& ask) const {
  auto refuse = [](Code code, std::string message) -> Status { return fail(code, std::move(message)); };
  if (hello.getVersionMajor() != wire::PROTOCOL_MAJOR)
    return refuse(Code::invalidArgument, "protocol version " + std::to_string(hello.getVersionMajor()) + "." +
                                             std::to_string(hello.getVersionMinor()) +
                                             " is not supported; this scheduler speaks " +
                                             std::to_string(wire::PROTOCOL_MAJOR) + "." + std::to_string(wire::PROTOCOL_MINOR));
  if (hello.getProgram().size() > limits::kMaxNameBytes)
    return refuse(Code::invalidArgument, "hello program name is " + std::to_string(hello.getProgram().size()) +
                                             " bytes; at most " + std::to_string(limits::kMaxNameBytes));
  ask.program = hello.getProgram();
  double most = double(limits::kMaxPoolBlocks) * pool().blockTflops();
  if (auto ok = limits::checkRange("hello tflops", hello.getTflops(), 0.0, most); !ok)
    return refuse(Code::invalidArgument, ok.error().message + "; 0 asks for one block");
  ask.blocks = pool().blocksFor(hello.getTflops());
  if (hello.getKinds().size() > 0) {
    KindMask asked = 0;
    for (auto k : hello.getKinds()) {
      if (!transport::validKind(k)) return refuse(Code::invalidArgument, "unknown card kind in hello");
      asked |= maskOf(transport::fromWire(k));
    }
    ask.kinds &= asked;
    if (ask.kinds == 0)
      return refuse(Code::permissionDenied, "none of the card kinds asked for (" + kindsToString(asked) +
                                                ") is allowed for vm '" + vm.policy.name +
                                                "' (allowed: " + kindsToString(vm.policy.kinds) + ")");
  }
  if (auto ok = limits::checkRange("hello priority", static_cast<long long>(hello.getPriority()), limits::kMinPriority, limits::kMaxPriority); !ok)
    return refuse(Code::invalidArgument, ok.error().message);
  ask.asked = hello.getPriority();
  ask.priority = std::min(ask.asked, vm.policy.priority);
  ask.waitMs = hello.getAdmitWaitMs();
  ask.noWait = hello.getNoWait();
  if (hello.getMaxFrameBytes()) ask.maxFrame = std::min(ask.maxFrame, hello.getMaxFrameBytes());
  return {};
}

// Placed by the next placement pass (at once when it fits; after preempting lower
// priorities; or after waiting up to waitMs); the welcome answers the hello then.
void Scheduler::awaitPlacement(VmLink& link, uint32_t channel, uint64_t sequence, const Ask& ask, bool settling) {
  Vm& vm = *link.vm;
  VaccelId id = nextVaccel_++;
  auto session = makeSession(id);
  Session& s = *session;
  s.token = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^ (id * 0x9e3779b97f4a7c15ull);
  s.vm = &vm;
  s.link = &link;
  s.channel = channel;
  s.program = ask.program;
  s.priority = ask.priority;
  s.askedPriority = ask.asked;
  s.want = ask.blocks;
  s.kinds = ask.kinds;
  s.host = HostVector{vm.policy.hostCpuMilli, vm.policy.hostMemoryMib};
  s.noWait = ask.noWait;
  s.phase = Phase::waiting;
  s.helloSequence = sequence;
  s.helloNs = uv_hrtime();
  s.service.waitingSince = relocator_->policyNow();
  s.maxFrame = ask.maxFrame;
  startLineage(s);
  s.waitDeadlineMs = ask.waitMs ? nowMs() + ask.waitMs : 0;
  s.ownWaitDeadlineMs = s.waitDeadlineMs;
  if (settling && s.waitDeadlineMs < settledAtMs_) s.waitDeadlineMs = settledAtMs_, s.settlingWait = true;
  vm.blocksClaimed += ask.blocks;
  link.sessions[channel] = &s;
  state_->nameProgram(id, s.program);  // shown with its holding on the other hosts
  sessions_[id] = std::move(session);
  relocator_->requestPlacement();
}

std::unique_ptr<Scheduler::Session> Scheduler::makeSession(VaccelId id) {
  // Its reads and fences that time out answer its guest (whichever link it has then).
  auto s = std::make_unique<Session>([this, id](const uint64_t& seq, const Status& st) {
    if (Session* s = sessionById(id)) {
      s->forgetRead(seq);
      replyError(*s, seq, st.error());
    }
  });
  s->id = id;
  return s;
}

Status Scheduler::couldEverHold(uint32_t blocks, KindMask kinds, const Vm& vm) const {
  if (auto s = pool().shortfall(blocks, kinds); s && s->never)
    return fail(Code::resourceExhausted, s->why + " (accepted: " + kindsToString(kinds) + ")");
  const HostVector host{vm.policy.hostCpuMilli, vm.policy.hostMemoryMib};
  if (!host.empty() && !pool().hostCouldHold(host))
    return fail(Code::resourceExhausted, "can never run here: vm '" + vm.policy.name + "' needs " + Pool::describeHost(host) +
                                             " of a node's host for each vaccel, and no node has that much");
  return {};
}

void Scheduler::refuseHello(VmLink& link, uint32_t channel, uint64_t sequence, const std::string& subject,
                            const Error& error) {
  RLOG_INFO("scheduler") << subject << " refused: " << error.message;
  event("refused", subject, error.message);
  replyError(link, channel, sequence, error);
}

void Scheduler::sendPoison(Session& s, uint64_t handle, uint64_t sequence, const Error& error, bool remember) {
  if (remember) {
    s.failed[handle] = {sequence, error};
    persistence_->vaccel(s);
  }
  if (s.members.empty() || !s.primary().node) return;
  capnp::MallocMessageBuilder m;
  auto p = m.initRoot<wire::SchedulerMessage>().initPoison();
  p.setContext(s.primary().context);
  p.setHandle(handle);
  p.setSequence(sequence);
  transport::setError(p.initError(), error);
  s.primary().node->connection->send(transport::kControlChannel, 0, m);
}

void Scheduler::forward(VmLink& link, Session& s, const FrameHeader& h, Body body) {
  const VaccelId id = s.id;
  forwardNow(link, s, h, std::move(body));
  // The lineage's log at its cap: a checkpoint (forwarding may have ended the session).
  if (Session* still = sessionById(id)) maybeCheckpoint(*still);
}

void Scheduler::forwardNow(VmLink& link, Session& s, const FrameHeader& h, Body body) {
  bool off = s.phase == Phase::suspending || s.phase == Phase::suspended;
  if (off && s.noWait && s.unavailable.empty()) {
    refuseWhileSuspended(s, h, body);
    return;
  }
  if (mustHoldNow(s)) {
    hold(s, h, std::move(body));
    return;
  }
  if (!s.lineage.replayLeft) ++s.instructions;  // (a replayed one was counted when it came)
  bool drop = false;
  auto decoded = transport::decodeGuard([&] {
    transport::MessageView in(body);
    drop = screen(s, h, body, in.root<wire::Instruction>());
  });
  if (!decoded) {
    Error e{Code::invalidArgument, decoded.error().message + "; this session is closed"};
    replyError(s, h.sequence, e);
    closeChannel(link, s.channel, e);
    return;
  }
  if (drop) return;
  // Forward the bytes unchanged under the primary context's channel.
  NodeLink& node = *s.primary().node;
  s.lastForwarded = h.sequence;
  node.connection->sendBody(s.primary().context, h.sequence, std::move(body));
  node.connection->throttle(*link.connection);
}

bool Scheduler::screen(Session& s, const FrameHeader& h, Body& body, wire::Instruction::Reader instruction) {
  auto which = instruction.which();
  if (which == wire::Instruction::DESCRIBE_VACCEL) {  // (the scheduler's to answer: never logged nor forwarded)
    describeVaccel(s, h.sequence);
    return true;
  }
  logFrame(s, h, body, instruction);
  if (!s.unavailable.empty()) {
    replyError(s, h.sequence, Error{Code::unavailable, s.unavailable});
    return true;
  }
  if (h.sequence >= kSchedulerSequences) {
    replyError(s, h.sequence,
               Error{Code::invalidArgument, "sequence numbers from 2^63 up are reserved for the scheduler"});
    return true;
  }
  // Programs are kept, to be reloaded wherever the vaccel is restored.
  if (which == wire::Instruction::LOAD_PROGRAM) {
    auto load = instruction.getLoadProgram();
    auto kept = std::make_shared<capnp::MallocMessageBuilder>();
    kept->setRoot(instruction);
    s.programs[load.getHandle()] = std::move(kept);
    s.failed.erase(load.getHandle());
    s.unconfirmedAllocs[h.sequence] = load.getHandle();
    persistence_->vaccel(s);
  } else if (which == wire::Instruction::FREE && s.programs.erase(instruction.getFree().getHandle())) {
    persistence_->vaccel(s);
  }
  // Instructions that another card of the vaccel runs, or that change buffers with
  // copies on other cards.
  if (routeElsewhere(s, h.sequence, instruction)) {
    return true;
  }
  switch (which) {
    case wire::Instruction::HELLO:
      replyError(s, h.sequence, Error{Code::invalidArgument, "this session has already said hello"});
      return true;
    case wire::Instruction::ALLOC:
      return !countAlloc(s, h.sequence, instruction.getAlloc());
    case wire::Instruction::FREE: {
      auto it = s.buffers.find(instruction.getFree().getHandle());
      if (it != s.buffers.end()) {
        s.memoryUsed -= it->second;
        s.vm->memoryUsed -= it->second;
        s.buffers.erase(it);
      }
      s.failed.erase(instruction.getFree().getHandle());  // the netaccel forgets it too
      return false;
    }
    case wire::Instruction::READ:
      s.asked(h.sequence, nowMs() + config_.requestTimeoutMs, instruction.getRead().getLength());
      return false;
    case wire::Instruction::FENCE:
    case wire::Instruction::DESCRIBE_PROGRAM:
      s.asked(h.sequence, nowMs() + config_.requestTimeoutMs, 0);
      return false;
    default:
      return false;  // everything else (and unknown instructions) is the card's to judge
  }
}

bool Scheduler::countAlloc(Session& s, uint64_t sequence, wire::Alloc::Reader a) {
  Vm& vm = *s.vm;
  if (a.getHandle() >= kSchedulerHandles || s.programHome.count(a.getHandle())) {
    Error e{Code::invalidArgument, a.getHandle() >= kSchedulerHandles
                                       ? "handles from 2^63 up are reserved for the scheduler"
                                       : "handle " + std::to_string(a.getHandle()) + " is already in use in this session"};
    replyError(s, sequence, e);
    sendPoison(s, a.getHandle(), sequence, e);
    return false;
  }
  if (a.getSize() > 0 && a.getHandle() != 0 && !s.buffers.count(a.getHandle())) {
    if (a.getSize() > vm.policy.memoryQuota - std::min<uint64_t>(vm.memoryUsed, vm.policy.memoryQuota)) {
      Error e{Code::resourceExhausted, "allocating " + std::to_string(a.getSize()) + " bytes would exceed vm '" +
                                           vm.policy.name + "''s memory quota (" + std::to_string(vm.memoryUsed) +
                                           " of " + std::to_string(vm.policy.memoryQuota) + " bytes in use)"};
      replyError(s, sequence, e);
      sendPoison(s, a.getHandle(), sequence, e);
      return false;
    }
    s.buffers[a.getHandle()] = a.getSize();
    s.failed.erase(a.getHandle());
    s.unconfirmedAllocs[sequence] = a.getHandle();
    s.memoryUsed += a.getSize();
    vm.memoryUsed += a.getSize();
  }
  return true;
}

void Scheduler::endSession(VmLink& link, uint32_t channel) {
  auto it = link.sessions.find(channel);
  if (it != link.sessions.end()) endSession(*it->second);
}

void Scheduler::endSession(Session& s) {
  closeMembers(s);
  if (s.link && s.heldBytes) s.link->connection->resumeReading();
  if (s.phase == Phase::suspending) relocator_->suspensionEnded();
  bool placed = !s.blocks.empty();
  state_->preemptElsewhere(s.id, s.vm->policy.name, s.rank(), {});  // what it asked of other hosts
  state_->nameProgram(s.id, "");
  if (placed) {
    state_->release(s.id);
    holdBlocks(*s.vm, -static_cast<int64_t>(s.want));
  }
  s.vm->blocksClaimed -= s.want;
  s.vm->memoryUsed -= s.memoryUsed;
  s.vm->kernelNsEnded += s.kernelNs();
  s.vm->instructionsEnded += s.instructions;
  s.vm->bytesMovedEnded += s.bytesMoved;
  if (!s.refused) {
    std::string released = (placed ? std::to_string(s.want) + " block(s) released" : std::string("ended while ") + phaseName(s.phase)) +
                           " after " + std::to_string(s.instructions) + " instruction(s)";
    RLOG_INFO("scheduler") << "session " << labelOf(s) << " ended; " << released;
    event("released", labelOf(s), released);
  }
  // A scheduler that is stopping keeps its vaccels in the state database: they are
  // restored when it starts again.
  if (!stopping_) {
    persistence_->forget(s);
    persistence_->usage(*s.vm);
  }
  if (s.link) s.link->sessions.erase(s.channel);
  sessions_.erase(s.id);  // s is gone from here on
  if (placed && config_.defragOnRelease && !stopping_) relocator_->compact(0, 0, "after a release");
  relocator_->requestPlacement();
}

// ---------------------------------------------------------------------------------
// What the netaccels bring (links/node_links.h has checked it)

uint64_t Scheduler::contextKey(size_t card, uint32_t context) const { return NodeLinks::key(pool().cards()[card].node, context); }

void Scheduler::bindContext(const Member& m, Session& s) { links_->bind(pool().cards()[m.card].node, m.context, s); }

void Scheduler::unbindContext(const Member& m) { links_->unbind(pool().cards()[m.card].node, m.context); }

Result<size_t> Scheduler::nodeJoined(const std::string& name, const std::vector<CardSpec>& cards, HostVector host,
                                     wire::Register::Reader reg) {
  auto index = state_->addNode(name, cards, host);
  if (!index) return index;
  persistence_->node(*index, reg);
  return index;
}

void Scheduler::nodeReady(NodeLink& node, const std::string& joined, capnp::List<wire::HeldContext>::Reader held) {
  event("node-joined", node.name, joined);
  settledAtMs_ = std::min(settledAtMs_, nowMs());  // the pool has heard from a netaccel
  adoptContexts(node, held);
  relocator_->requestPlacement();
}

Status Scheduler::cardReply(Session& s, size_t member, NodeLink& node, const FrameHeader& h, Body body) {
  if (h.sequence >= kSchedulerSequences) {
    // A fence of the scheduler's collected the card's times of the kernels run so far:
    // on the primary those are the guest's, and go to it (never to the fence's handler,
    // which waits for the fence's own answer).
    if (isKernelTimes(body)) {
      if (member == 0) toGuest(s, h.sequence, std::move(body));
      return {};
    }
    onRemoteReply(s, h.sequence, body);
    return {};
  }
  if (member != 0) return {};  // guests' instructions go to the primary only
  bool relay = true;
  auto decoded = transport::decodeGuard([&] {
    transport::MessageView in(body);
    auto reply = in.root<wire::Reply>();
    switch (reply.which()) {
      case wire::Reply::DATA:
        s.answered(h.sequence, reply.getData().getData().size(), reply.getData().getLast());
        break;
      case wire::Reply::PROGRAM:
        s.answered(h.sequence, 0, true);
        break;
      case wire::Reply::FENCED:
        s.answered(h.sequence, 0, true);
        // (raccel-guestd's own fences number from 2^62: they say nothing about order here.)
        if (h.sequence < kGuestdSequences)
          s.unconfirmedAllocs.erase(s.unconfirmedAllocs.begin(), s.unconfirmedAllocs.lower_bound(h.sequence));
        break;
      case wire::Reply::KERNEL_TIMES:
        break;
      case wire::Reply::ERROR: {
        s.answered(h.sequence, 0, true);
        // A refused buffer or program: the VM stops paying for it, and the failure is
        // kept for restores elsewhere.
        const Error error = transport::errorFrom(reply.getError().getError());
        if (auto freed = refuseAlloc(s, h.sequence, error)) {
          s.vm->memoryUsed -= std::min(s.vm->memoryUsed, *freed);
          // (before a checkpoint's mark too, so its record says as the session's does)
          if (s.lineage.underWay) refuseAlloc(*s.lineage.underWay, h.sequence, error);
          persistence_->vaccel(s);
        }
        break;
      }
      default:
        // A welcome or a vaccel's description is the scheduler's to give, never a card's.
        relay = false;
        break;
    }
  });
  if (!decoded) return fail(Code::invalidArgument, "a malformed reply: " + decoded.error().message);
  if (!relay) return fail(Code::permissionDenied, "a reply that only the scheduler may make");
  VmLink* link = s.link;
  toGuest(s, h.sequence, std::move(body));
  // A guest that does not read its answers holds back its own sessions, never the node
  // link that other tenants' answers come by.
  if (link) awaitDrain(*link);
  if (!s.held.empty() && !s.mustHold()) runHeld(s);  // (what waited for answers owed; may end s)
  return {};
}

void Scheduler::contextTime(NodeLink& node, Session* s, uint32_t context, uint64_t kernelNs) {
  if (!s) return creditClosed(NodeLinks::key(static_cast<size_t>(node.poolIndex), context), kernelNs);
  for (auto& m : s->members)
    if (m.context == context && m.node == &node) m.kernelNs = kernelNs;
}

void Scheduler::cardFault(NodeLink& node, wire::CardFault::Reader f) {
  // A tenant's sandbox on that card died or faulted: the operator hears which programs
  // lost their buffers there (each also got the error on its instruction).
  std::string message = limits::clip(f.getMessage().cStr());
  std::string subject = node.name + " card " + std::to_string(f.getCard());
  std::string who;
  for (auto ctx : f.getContexts()) {
    Session* found = links_->sessionOf(static_cast<size_t>(node.poolIndex), ctx);
    if (!found) continue;
    Session& s = *found;
    if (who.size() < 256) who += (who.empty() ? "" : ", ") + labelOf(s);
    // Not its work's doing: rebuilt from its lineage, as after a lost netaccel (the
    // errors that follow find its contexts closed); as often as Lineage allows.
    std::string lostWhy = message;
    if (f.getCause() == wire::FaultCause::NOT_ITS_OWN && s.lineage.canRebuild() && !s.lineage.recovering) {
      if (s.lineage.countSandboxLoss(uv_hrtime())) {
        recoverLost(s, "its sandbox on " + subject + " ended, not by its own work (" + message + ")");
        continue;
      }
      const std::string why = "not rebuilt: its sandboxes ended " + std::to_string(s.lineage.sandboxLosses) +
                              " times in 10 minutes, not by its own work as they said";
      lostWhy += "; " + why;
      if (who.size() < 256) who += " (" + why + ")";
    }
    for (size_t i = 0; i < s.members.size(); ++i) {
      if (s.members[i].node != &node || s.members[i].context != ctx) continue;
      if (i == 0) {
        // Its buffers were there: gone, and no longer the VM's memory. Their handles
        // keep saying why (sequence 0: no instruction of the guest's failed), also
        // wherever the vaccel is restored.
        for (auto& [handle, bytes] : s.buffers) {
          s.failed[handle] = {0, Error{Code::internal, "buffer " + std::to_string(handle) + " was lost: " + lostWhy}};
          s.vm->memoryUsed -= std::min(s.vm->memoryUsed, bytes);
        }
        s.buffers.clear();
        s.unconfirmedAllocs.clear();
        s.memoryUsed = 0;
        persistence_->vaccel(s);
      }
      // The copies of its buffers that card held are gone too.
      for (auto r = s.replicas.begin(); r != s.replicas.end();)
        r = std::get<0>(r->first) == i ? s.replicas.erase(r) : std::next(r);
    }
  }
  std::string detail = (who.empty() ? std::string() : who + ": ") + message;
  RLOG_WARN("scheduler") << "fault on " << subject << ": " << limits::clip(detail);
  event("card-fault", subject, detail);
}

void Scheduler::nodeLost(NodeLink& node, const std::string& reason) {
  RLOG_WARN("scheduler") << "netaccel '" << node.name << "' lost: " << reason;
  event("node-lost", node.name, reason);
  if (node.poolIndex >= 0) state_->removeNode(static_cast<size_t>(node.poolIndex));
  Error gone{Code::unavailable, "netaccel '" + node.name + "' holding this virtual accelerator's card was lost (" + reason +
                                    "); its buffers are gone"};
  for (auto& [id, s] : sessions_) {
    bool hit = false;
    for (auto& m : s->members)
      if (m.node == &node) {
        m.node = nullptr;
        unbindContext(m);
        hit = true;
      }
    if (!hit) continue;
    const bool onCards = s->phase == Phase::running || s->phase == Phase::suspending || s->phase == Phase::moving ||
                         s->phase == Phase::resuming;
    if (s->lineage.canRebuild() && onCards && s->unavailable.empty() && !stopping_) {
      recoverLost(*s, "netaccel '" + node.name + "' was lost (" + reason + ")");
      continue;
    }
    s->unavailable = gone.message + (!s->vm->policy.failover ? " (failover is off for vm '" + s->vm->policy.name + "')"
                                     : s->lineage.unprotected ? " (its first checkpoint after the scheduler restarted was not finished)"
                                                              : "");
    s->pending.failAll(gone);
    abandonJob(*s);
  }
}

// ---------------------------------------------------------------------------------
// Console


// ---------------------------------------------------------------------------------

void Scheduler::publishToOtherHosts() {
  std::map<std::string, PoolState::Settings> vms;
  for (auto& vm : vms_)
    if (vm->active) vms[vm->policy.name] = policySettings(vm->policy);
  std::vector<PoolState::Unplaced> unplaced;
  for (auto& [id, s] : sessions_)
    if (s->phase == Phase::waiting || s->phase == Phase::suspended)
      unplaced.push_back({id, s->vm->policy.name, s->priority, s->program, phaseName(s->phase), s->why, s->want});
  state_->publish(vms, unplaced);
}

void Scheduler::tick() {
  uint64_t now = nowMs();
  // This loop itself stalled (a long step of its own, or the host starved it): the
  // netaccels' silence meanwhile was ours (NodeLinks::check).
  const bool stalled = lastTickMs_ && now - lastTickMs_ > config_.heartbeatTimeoutMs / 2;
  if (stalled)
    RLOG_WARN("scheduler") << "this scheduler's loop stalled for " << now - lastTickMs_
                           << " ms; the netaccels' heartbeat clocks start again";
  lastTickMs_ = now;
  // Time alone changes admission: a demoted vaccel may now be preempted; a waiting or
  // suspended one may have passed the starvation guard or be due for promotion.
  const double policyTime = relocator_->policyNow();
  bool due = relocator_->accrueService(policyTime);
  for (Session* s : allSessions())
    if ((s->phase == Phase::waiting || s->phase == Phase::suspended) && s->service.nextWaitingChange(lastTickPolicy_) <= policyTime)
      due = true;
  lastTickPolicy_ = policyTime;
  if (due) relocator_->requestPlacement();
  for (auto& vm : vms_) state_->reportUsage(vm->policy.name, vm->usage.used(policyTime), policyTime, vm->usage.blocks());
  if (state_->shared()) publishToOtherHosts();
  links_->check(now, stalled);
  forgetOfflineNodes(now);
  // Closed contexts whose final report never came (the node went away): forgotten.
  std::erase_if(closedContexts_, [&](auto& c) { return now - c.second.closedMs > 4ull * config_.heartbeatTimeoutMs; });
  std::vector<Session*> late;
  std::vector<VaccelId> owedLess;  // answers given up on: what waited for them goes on
  for (Session* s : allSessions()) {
    if (s->phase == Phase::running &&
        s->pending.expire(now, "no reply from the card within " + std::to_string(config_.requestTimeoutMs) + " ms") &&
        !s->held.empty())
      owedLess.push_back(s->id);
    if (s->phase == Phase::waiting && s->waitDeadlineMs && now >= s->waitDeadlineMs) late.push_back(s);
  }
  for (Session* s : late) {
    // No netaccel joined within startup_grace_ms: what admission would have said at once.
    auto ever = s->settlingWait ? couldEverHold(s->want, s->kinds, *s->vm) : Status{};
    relocator_->refuseWaiting(*s, ever ? Error{Code::resourceExhausted, "waited for blocks until its deadline: " + s->why} : ever.error());
  }
  for (VaccelId id : owedLess)
    if (Session* s = sessionById(id); s && !s->mustHold()) runHeld(*s);
  expireDetached();
}

void Scheduler::forgetOfflineNodes(uint64_t now) {
  if (config_.forgetOfflineMs == 0) return;
  auto& offline = links_->offlineSince();
  for (auto it = offline.begin(); it != offline.end();) {
    size_t index = it->first;
    bool held = false;  // a suspended or recovering vaccel still counts on it
    for (auto& [id, s] : sessions_)
      for (auto& m : s->members) held = held || pool().cards()[m.card].node == index;
    if (now - it->second < config_.forgetOfflineMs || held) {
      ++it;
      continue;
    }
    std::string name = pool().nodes()[index].name;
    it = offline.erase(it);
    if (!state_->forgetNode(index)) continue;
    persistence_->dropNode(name);
    RLOG_INFO("scheduler") << "netaccel '" << name << "' forgotten after " << config_.forgetOfflineMs << " ms offline";
    event("node-forgotten", name, "offline for " + std::to_string(config_.forgetOfflineMs) + " ms with nothing on it");
    relocator_->requestPlacement();  // what waited for it may now be refused
  }
}

void Scheduler::refuseWhileSuspended(Session& s, const FrameHeader& h, const Body& body) {
  Error e{Code::unavailable, "vaccel #" + std::to_string(s.id) + " is suspended (" + s.why +
                                 "); it resumes when blocks free, and this session asked not to wait"};
  transport::decodeGuard([&] {
    transport::MessageView in(body);
    if (auto created = transport::handleCreatedBy(in.root<wire::Instruction>())) s.failed[*created] = {h.sequence, e};
  });
  replyError(s, h.sequence, e);
}

Result<std::string> Scheduler::setPolicy(const std::string& name, const std::vector<std::pair<std::string, std::string>>& settings) {
  if (settings.empty())
    return fail(Code::invalidArgument, std::string("set-policy needs at least one KEY=VALUE (") + kPolicySettingKeys + ")");
  std::map<std::string, std::string> changes(settings.begin(), settings.end());
  Vm* vm = findVm(name);
  // A VM another host of a shared pool serves: its settings are recorded for that host.
  std::string hosts;
  for (auto& v : state_->vmsElsewhere())
    if (v.vm == name) hosts += (hosts.empty() ? "" : ", ") + v.scheduler;
  if (!vm && hosts.empty())
    return fail(Code::notFound, "no vm named '" + name + "'" + (state_->shared() ? " here or on any host of the shared pool" : ""));
  auto parsed = vm ? withSettings(vm->policy, changes) : policyElsewhere(name, changes);
  if (!parsed) return fail(parsed.error().code, "set-policy " + name + ": " + parsed.error().message);
  auto recorded = state_->recordPolicy(name, changes);
  if (!recorded) return fail(recorded.error().code, "set-policy " + name + ": " + recorded.error().message);
  if (!vm) {
    policyOverrides_[name] = *recorded;
    event("policy", name, "recorded in the shared pool for host(s) " + hosts);
    return "vm '" + name + "' is served by host(s) " + hosts + ": its policy there is set (running programs keep their " +
           "blocks; new ones get the new policy)";
  }
  auto applied = applyPolicy(*vm, *recorded, "set by raccelctl");
  if (!applied) return fail(applied.error().code, "set-policy " + name + ": " + applied.error().message);
  return "vm '" + name + "': " + *applied + " (running programs keep their blocks; new ones get the new policy)" +
         (hosts.empty() ? "" : "; also on host(s) " + hosts);
}

Result<std::string> Scheduler::applyPolicy(Vm& vm, const std::map<std::string, std::string>& settings, const std::string& origin) {
  const std::string& name = vm.policy.name;
  auto parsed = withSettings(vm.policy, settings);
  if (!parsed) return fail(parsed.error());
  vm.policy = *parsed;
  // Kept (and persisted) over the VM's configured policy, across restarts and libvirt rescans.
  for (auto& [key, value] : settings) policyOverrides_[name][key] = value;
  persistence_->policy(name, policyOverrides_[name]);
  // Its programs' priorities are capped anew (as asked at hello, under the new cap).
  for (Session* s : allSessions()) {
    if (s->vm != &vm) continue;
    s->priority = std::min(s->askedPriority, vm.policy.priority);
    state_->setPriority(s->id, s->rank());
    persistence_->vaccel(*s);
  }
  std::string detail = "tflops " + std::to_string(vm.policy.tflops) + ", priority " + std::to_string(vm.policy.priority) +
                       ", kinds " + kindsToString(vm.policy.kinds) + ", memory_quota " + std::to_string(vm.policy.memoryQuota);
  if (vm.policy.hostCpuMilli || vm.policy.hostMemoryMib)
    detail += ", host " + pool().describeHost({vm.policy.hostCpuMilli, vm.policy.hostMemoryMib}) + " a vaccel";
  RLOG_INFO("scheduler") << "vm '" << name << "' policy " << origin << ": " << detail;
  event("policy", name, detail + " (" + origin + ")");
  relocator_->requestPlacement();
  return detail;
}

}  // namespace raccel::scheduler
