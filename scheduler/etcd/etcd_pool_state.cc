#include "scheduler/etcd/etcd_pool_state.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

#include "common/limits.h"
#include "common/log.h"
#include "scheduler/admission.h"

namespace raccel::scheduler {
namespace {
// An allocation waits at most this long for etcd (it runs on the scheduler's loop).
constexpr uint32_t kCallTimeoutMs = 1000;
}  // namespace

Result<std::unique_ptr<EtcdPoolState>> EtcdPoolState::open(uv_loop_t* loop, const EtcdSettings& settings,
                                                          const std::string& name, double blockTflops) {
  auto options = etcd::optionsFrom(settings, kCallTimeoutMs);
  if (!options) return fail(options.error());
  auto client = etcd::Client::open(*options);
  if (!client) return fail(client.error());
  std::unique_ptr<EtcdPoolState> state(
      new EtcdPoolState(loop, (*client)->describe() + " " + settings.prefix + " as scheduler '" + name + "'"));
  state->client_ = std::move(*client);
  SharedPoolOptions shared;
  shared.prefix = settings.prefix;
  shared.scheduler = name;
  shared.leaseTtlSeconds = settings.leaseTtlSeconds;
  shared.blockTflops = blockTflops;
  shared.onChange = [async = state->async_] { uv_async_send(async); };
  shared.onLeaseLost = [s = state.get()] { s->wake_.notify_all(); };
  auto pool = SharedPool::open(*state->client_, shared);
  if (!pool) {
    state->stop();
    return fail(pool.error().code, "joining the shared pool at " + state->describe_ + ": " + pool.error().message);
  }
  state->shared_ = std::move(*pool);
  state->sync();
  state->thread_ = std::thread([s = state.get()] { s->run(); });
  uv_async_send(state->async_);  // the drains and policies that stand reach the scheduler
  RLOG_INFO("scheduler") << "joined the shared pool at " << state->describe_;
  return state;
}

EtcdPoolState::EtcdPoolState(uv_loop_t* loop, std::string describe)
    : loop_(loop), describe_(std::move(describe)) {
  async_ = new uv_async_t;
  uv_async_init(loop_, async_, [](uv_async_t* a) {
    auto* self = static_cast<EtcdPoolState*>(a->data);
    if (!self) return;  // stopped
    self->sync();
    self->answerPreemptions();
    self->answerMoves();
    self->answerActions();
    self->answerDrains();
    self->answerPolicies();
    std::vector<std::pair<VaccelId, std::string>> lost;
    {
      std::lock_guard lock(self->mutex_);
      lost.swap(self->lostVaccels_);
    }
    for (auto& [vaccel, why] : lost)
      if (self->lost) self->lost(vaccel, why);
    if (self->changed) self->changed();
  });
  async_->data = this;
}

EtcdPoolState::~EtcdPoolState() { stop(); }

void EtcdPoolState::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (shared_) {
    // Leaving frees every holding of this scheduler at once (releases still queued too).
    if (auto left = shared_->leave(); !left)
      RLOG_WARN("scheduler") << "leaving the shared pool: " << left.error().message << " (its lease expires instead)";
    shared_.reset();
  }
  if (async_) {
    async_->data = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(async_), [](uv_handle_t* h) { delete reinterpret_cast<uv_async_t*>(h); });
    async_ = nullptr;
  }
}

void EtcdPoolState::rejoin() {
  if (auto joined = shared_->rejoin(); !joined) {
    RLOG_WARN("scheduler") << "shared pool: joining again after the lease lapsed: " << joined.error().message << " (tried again)";
    return;
  }
  std::map<VaccelId, Owned> owned;
  {
    std::lock_guard lock(mutex_);
    owned = owned_;
    requestsLapsed_ = true;  // this scheduler's preemption requests ended with the lease
  }
  republish_ = true;  // its VM and unplaced records too
  size_t kept = 0;
  for (auto& [vaccel, o] : owned) {
    Status claimed = shared_->claim(vaccel, o.vm, o.ranges, o.priority, o.host);
    if (claimed) {
      ++kept;
      continue;
    }
    std::lock_guard lock(mutex_);
    if (!owned_.count(vaccel)) continue;  // released meanwhile
    owned_.erase(vaccel);
    lostVaccels_.push_back({vaccel, "its blocks were freed while this scheduler was cut off from etcd, and " +
                                        claimed.error().message});
  }
  RLOG_INFO("scheduler") << "shared pool: " << kept << " of " << owned.size() << " vaccel(s) kept their blocks after the lease lapsed";
  if (async_) uv_async_send(async_);
}

Error EtcdPoolState::etcdLost() const {
  return Error{Code::unavailable, "the shared pool's etcd cannot be reached (" + describe_ +
                                      "); new placements wait for it, running vaccels go on"};
}

void EtcdPoolState::sync() {
  if (!shared_) return;
  auto [pool, revision, foreign, preemptions, usage, moves, actions, vms, unplaced, drains, policies] = shared_->poolCopy();
  (void)revision;
  std::map<std::string, std::string> draining;
  for (auto& d : drains) draining[d.node] = d.by;
  for (auto it = drainIntents_.begin(); it != drainIntents_.end();) {
    if (draining.count(it->first) == static_cast<size_t>(it->second)) {
      it = drainIntents_.erase(it);  // the view has it now
      continue;
    }
    if (it->second) draining[it->first] = shared_->name();
    else draining.erase(it->first);
    ++it;
  }
  draining_ = std::move(draining);
  policies_ = std::move(policies);
  vmsElsewhere_.clear();
  for (auto& v : vms)
    if (v.scheduler != shared_->name()) vmsElsewhere_.push_back(std::move(v));
  unplacedElsewhere_.clear();
  for (auto& u : unplaced)
    if (u.scheduler != shared_->name()) unplacedElsewhere_.push_back(std::move(u));
  for (size_t i = 0; i < pool.nodes().size(); ++i) {
    const std::string& name = pool.nodes()[i].name;
    if (!linked_.count(name)) pool.removeNode(i);  // placed on by the schedulers linked to it
    else if (draining_.count(name)) pool.setDraining(i, true);
  }
  foreign_ = std::move(foreign);
  actionsAsked_.clear();
  for (auto& a : actions)
    if (a.scheduler == shared_->name()) actionsAsked_.push_back(std::move(a));
  movesAsked_.clear();
  std::set<std::pair<std::string, uint64_t>> standing;
  for (auto& m : moves) {
    if (m.by == shared_->name()) standing.insert({m.scheduler, m.vaccel});
    if (m.scheduler == shared_->name()) movesAsked_.push_back(std::move(m));
  }
  std::erase_if(movesAskedOfOthers_, [&](const auto& key) { return !standing.count(key); });
  campaignIfLeaderless();
  usageElsewhere_.clear();
  for (auto& u : usage)
    if (u.scheduler != shared_->name()) usageElsewhere_.push_back(std::move(u));
  against_.clear();
  for (auto& p : preemptions)
    if (p.victimScheduler == shared_->name()) against_.push_back(std::move(p));
  {
    std::lock_guard lock(mutex_);
    for (VaccelId v : releasing_) pool.release(v);
  }
  mirror_ = std::move(pool);
}

void EtcdPoolState::reportUsage(const std::string& vm, double used, double now, uint32_t blocks) {
  // Published when its holding changes, and every 10 s while it holds blocks (the others
  // count a holding on at its last rate; with none, the decay they apply is exact).
  constexpr uint64_t kRepublishMs = 10000;
  const uint64_t nowMs = uv_now(loop_);
  // A VM name that cannot be one segment of a key ('/') is not published (said once).
  if (!limits::checkKeyName("vm", vm)) {
    if (published_.emplace(vm, Published{UINT32_MAX, 0}).second)
      RLOG_WARN("scheduler") << "shared pool: VM '" << limits::clip(vm, 64) << "' has a '/' in its name: its usage is "
                             << "not shared with the other hosts";
    return;
  }
  auto it = published_.find(vm);
  const bool changed = it == published_.end() ? (blocks > 0 || used > 0) : it->second.blocks != blocks;
  const bool stale = blocks > 0 && it != published_.end() && nowMs >= it->second.atMs + kRepublishMs;
  if (!changed && !stale) return;
  published_[vm] = {blocks, nowMs};
  bool queued;
  {
    std::lock_guard lock(mutex_);
    queued = !unpublished_.empty();
    unpublished_[vm] = SharedUsage{shared_->name(), vm, used, now, blocks};
  }
  if (!queued) post({[this] { return publishUsage(); }, "recording tenant usage"});
}

Status EtcdPoolState::publishUsage() {
  // Until none waits: a record reported while this job runs has no job of its own.
  for (;;) {
    std::map<std::string, SharedUsage> batch;
    {
      std::lock_guard lock(mutex_);
      if (unpublished_.empty()) return {};
      batch = unpublished_;
    }
    for (auto& [vm, u] : batch) {
      if (auto ok = shared_->publishUsage(u); !ok) return ok;  // the job is tried again, with what is newest then
      std::lock_guard lock(mutex_);
      auto it = unpublished_.find(vm);
      if (it != unpublished_.end() && it->second.at == u.at && it->second.used == u.used) unpublished_.erase(it);
    }
  }
}

double EtcdPoolState::usageElsewhere(const std::string& vm, double now) const {
  double sum = 0;
  for (const SharedUsage& u : usageElsewhere_) {
    if (u.vm != vm) continue;
    const double since = std::max(0.0, now - u.at);  // what it held since, at the rate it held then
    sum += u.used * std::exp2(-since / TenantUsage::kHalfLifeSeconds) + u.blocks * since;
  }
  return sum;
}

void EtcdPoolState::answerPreemptions() {
  std::set<VaccelId> named;
  for (const SharedPreemption& p : against_) {
    named.insert(p.victim);
    if (yielded_.count(p.victim)) continue;
    int victimPriority;
    {
      std::lock_guard lock(mutex_);
      auto it = owned_.find(p.victim);
      if (it == owned_.end()) continue;  // not placed here (or released already)
      victimPriority = it->second.priority;
    }
    const std::string key = SharedPool::preemptionKey(p);
    if (p.priority <= victimPriority) {
      // Its plan read an older priority, or it is wrong: the victim stays.
      if (refusedRequests_.size() >= SharedPool::kMaxRecords) refusedRequests_.clear();
      if (refusedRequests_.insert(key + "@" + std::to_string(p.priority)).second)
        RLOG_WARN("scheduler") << "shared pool: refused " << limits::clip(key, 160) << ": its priority " << p.priority
                               << " is not above vaccel " << p.victim << "'s " << victimPriority;
      continue;
    }
    const std::string why = "preempted by scheduler " + p.by + "'s vaccel " + std::to_string(p.forVaccel) + " of " + p.vm +
                            " (pool priority " + std::to_string(p.priority) + ")";
    if (preempted && preempted(p.victim, why)) yielded_.insert(p.victim);
  }
  // A victim no request names any more is no longer promised to anyone.
  std::erase_if(yielded_, [&](VaccelId v) { return !named.count(v); });
}

std::string EtcdPoolState::heldBack(int priority) const {
  for (const SharedPreemption& p : against_)
    if (yielded_.count(p.victim) && priority < p.priority)
      return "held back: scheduler " + p.by + " preempted vaccel " + std::to_string(p.victim) + " here for its vaccel " +
             std::to_string(p.forVaccel) + " of " + p.vm + " (pool priority " + std::to_string(p.priority) +
             "), and the blocks it freed are promised to that until it is placed";
  return {};
}

void EtcdPoolState::preemptElsewhere(VaccelId forWhom, const std::string& vm, int priority,
                                     const std::vector<VaccelId>& victims) {
  {
    std::lock_guard lock(mutex_);
    if (requestsLapsed_) requested_.clear();  // they ended with the lease: made again below
    requestsLapsed_ = false;
  }
  std::vector<SharedPreemption> want;
  for (VaccelId v : victims) {
    auto it = foreign_.find(v);
    if (it == foreign_.end()) continue;
    want.push_back({it->second.scheduler, it->second.vaccel, shared_->name(), forWhom, priority, vm});
  }
  auto same = [](const SharedPreemption& a, const SharedPreemption& b) {
    return SharedPool::preemptionKey(a) == SharedPool::preemptionKey(b) && a.priority == b.priority;
  };
  auto has = [&](const std::vector<SharedPreemption>& list, const SharedPreemption& p) {
    return std::any_of(list.begin(), list.end(), [&](const SharedPreemption& q) { return same(p, q); });
  };
  std::vector<SharedPreemption>& had = requested_[forWhom];
  for (const SharedPreemption& p : had)
    if (!has(want, p))
      post({[this, p] { return shared_->withdrawPreemption(p); }, "taking back " + SharedPool::preemptionKey(p)});
  for (const SharedPreemption& p : want)
    if (!has(had, p)) {
      RLOG_INFO("scheduler") << "shared pool: asking scheduler " << p.victimScheduler << " to suspend its vaccel " << p.victim
                             << " for vaccel " << forWhom << " (pool priority " << priority << ")";
      post({[this, p] { return shared_->requestPreemption(p); }, "recording " + SharedPool::preemptionKey(p)});
    }
  had = std::move(want);
  if (had.empty()) requested_.erase(forWhom);
}

std::string EtcdPoolState::holderElsewhere(VaccelId owner) const {
  auto it = foreign_.find(owner);
  if (it == foreign_.end()) return {};
  const SharedHolding& h = it->second;
  return h.scheduler + "/" + h.vm + "#" + std::to_string(h.vaccel);
}

std::vector<PoolState::Elsewhere> EtcdPoolState::vaccelsElsewhere() const {
  std::vector<Elsewhere> out;
  for (auto& [id, h] : foreign_) out.push_back({h.scheduler, h.vaccel, h.vm, h.priority, h.ranges, h.program});
  std::sort(out.begin(), out.end(), [](const Elsewhere& a, const Elsewhere& b) {
    return std::tie(a.scheduler, a.vaccel) < std::tie(b.scheduler, b.vaccel);
  });
  return out;
}

Result<size_t> EtcdPoolState::addNode(const std::string& name, const std::vector<CardSpec>& cards, HostVector host) {
  sync();
  const size_t index = mirror_.nodeIndex(name);
  if (index == SIZE_MAX)
    return fail(Code::unavailable, "netaccel '" + name + "' is not registered in the shared pool at " + describe_ +
                                       ": give it etcd = the same endpoints (and etcd_prefix), then it joins here");
  // Its record in etcd must describe the cards it brings (else a new layout needs a new name).
  Pool trial = mirror_;
  auto same = trial.addNode(name, cards, host);
  if (!same) return fail(same.error());
  linked_.insert(name);
  sync();
  if (!mirror_.nodes()[index].online)
    return fail(Code::unavailable, "netaccel '" + name + "' is offline in the shared pool at " + describe_ +
                                       " (its etcd lease lapsed); it joins here when it is online there again");
  return index;
}

std::vector<VaccelId> EtcdPoolState::removeNode(size_t node) {
  std::vector<VaccelId> mine;
  if (node >= mirror_.nodes().size()) return mine;
  for (VaccelId v : mirror_.removeNode(node))
    if (v < SharedPool::kForeignIds) mine.push_back(v);
  linked_.erase(mirror_.nodes()[node].name);
  sync();
  return mine;
}

void EtcdPoolState::setDraining(size_t node, bool draining) {
  if (node >= mirror_.nodes().size()) return;
  const std::string name = mirror_.nodes()[node].name;
  drainIntents_[name] = draining;
  // The scheduler that was asked acts on it itself; the others are told (answerDrains).
  if (draining) drainsAnswered_[name] = shared_->name();
  else drainsAnswered_.erase(name);
  post({[this, name, draining] { return shared_->drain(name, !draining); },
        (draining ? "recording the drain of " : "ending the drain of ") + name});
  sync();
}

void EtcdPoolState::answerDrains() {
  std::vector<std::pair<std::string, std::string>> started;
  std::vector<std::string> ended;
  for (auto& [name, by] : draining_)
    if (!drainsAnswered_.count(name)) started.push_back({name, by});
  for (auto& [name, by] : drainsAnswered_)
    if (!draining_.count(name)) ended.push_back(name);
  for (auto& [name, by] : started) {
    drainsAnswered_[name] = by;
    RLOG_INFO("scheduler") << "shared pool: netaccel " << name << " is drained (asked on " << by << ")";
    if (drainAsked) drainAsked(name, true, by);
  }
  for (auto& name : ended) {
    drainsAnswered_.erase(name);
    RLOG_INFO("scheduler") << "shared pool: netaccel " << name << " is no longer drained";
    if (drainAsked) drainAsked(name, false, "");
  }
}

Result<std::map<std::string, std::string>> EtcdPoolState::recordPolicy(const std::string& vm,
                                                                       const std::map<std::string, std::string>& changes) {
  if (!reachable_) return fail(etcdLost());
  auto settings = shared_->setPolicy(vm, changes);
  if (!settings) return settings;
  policiesAnswered_[vm] = *settings;  // the scheduler applies them itself
  return settings;
}

void EtcdPoolState::advertise(const std::string& address) {
  post({[this, address] { return shared_->advertise(address); }, "advertising this scheduler's node port " + address});
}

void EtcdPoolState::answerPolicies() {
  for (const SharedPolicy& p : policies_) {
    auto it = policiesAnswered_.find(p.vm);
    if (it != policiesAnswered_.end() && it->second == p.settings) continue;
    policiesAnswered_[p.vm] = p.settings;
    if (policyAsked) policyAsked(p.vm, p.settings, p.by);
  }
}

void EtcdPoolState::publish(const std::map<std::string, Settings>& vms, const std::vector<Unplaced>& unplaced) {
  // (Nothing published yet equals nothing to publish: the first records go when there are some.)
  if (!republish_.exchange(false) && vms == lastVms_ && unplaced == lastUnplaced_) return;
  lastVms_ = vms;
  lastUnplaced_ = unplaced;
  Records records{vms, {}};
  for (auto& u : unplaced)
    records.second.push_back({shared_->name(), u.vaccel, u.vm, u.priority, u.program, u.state, u.why, u.blocks});
  bool queued;
  {
    std::lock_guard lock(mutex_);
    toPublish_ = std::move(records);
    queued = publishQueued_;
    publishQueued_ = true;
  }
  if (!queued) post({[this] { return publishRecords(); }, "recording this host's VMs and unplaced vaccels"});
}

Status EtcdPoolState::publishRecords() {
  // Until none waits: what is handed over while this job runs has no job of its own.
  for (;;) {
    Records batch;
    {
      std::lock_guard lock(mutex_);
      if (!toPublish_) {
        publishQueued_ = false;
        return {};
      }
      batch = *toPublish_;
    }
    Status ok = shared_->publishVms(batch.first);
    if (ok) ok = shared_->publishUnplaced(batch.second);
    if (!ok) {
      if (ok.error().code != Code::unavailable) {  // given up: the loop hands them over again
        std::lock_guard lock(mutex_);
        publishQueued_ = false;
        republish_ = true;
      }
      return ok;
    }
    std::lock_guard lock(mutex_);
    if (toPublish_ && *toPublish_ == batch) toPublish_.reset();
  }
}

std::vector<PoolState::VmElsewhere> EtcdPoolState::vmsElsewhere() const {
  std::vector<VmElsewhere> out;
  for (auto& v : vmsElsewhere_) out.push_back({v.scheduler, v.vm, v.settings});
  return out;
}

std::vector<PoolState::UnplacedElsewhere> EtcdPoolState::unplacedElsewhere() const {
  std::vector<UnplacedElsewhere> out;
  for (auto& u : unplacedElsewhere_)
    out.push_back({u.scheduler, {u.vaccel, u.vm, u.priority, u.program, u.state, u.why, u.blocks}});
  return out;
}

Result<std::vector<BlockRange>> EtcdPoolState::allocate(VaccelId owner, const std::string& vm, const Pool::Request& request) {
  if (!reachable_) return fail(etcdLost());
  if (shared_->leaseLost())
    return fail(Code::unavailable, "this scheduler's etcd lease lapsed (" + describe_ + "); it is joining the pool again");
  if (owner >= SharedPool::kForeignIds) return fail(Code::internal, "vaccel id out of range for a shared pool");
  // Released just now and placed again (a drain's move): the release goes first.
  bool pending;
  {
    std::lock_guard lock(mutex_);
    pending = releasing_.count(owner) > 0;
  }
  if (pending) {
    if (auto released = shared_->release(owner); !released) return fail(released.error());
  }
  std::set<std::string> usable;
  for (auto& name : linked_)
    if (!draining_.count(name)) usable.insert(name);
  auto placed = shared_->allocate(owner, vm, request, &usable);
  if (!placed) {
    if (placed.error().code == Code::unavailable && !shared_->watching()) {
      reachable_ = false;
      wake_.notify_all();
    }
    return placed;
  }
  {
    std::lock_guard lock(mutex_);
    owned_[owner] = Owned{vm, *placed, request.priority, request.host};
  }
  preemptElsewhere(owner, vm, 0, {});  // placed: what it asked of others is taken back
  sync();
  if (mirror_.held(owner) != *placed) {  // the watch has not brought it yet
    mirror_.release(owner);
    if (auto ok = mirror_.assign(owner, *placed, request.priority, request.host); !ok)
      RLOG_WARN("scheduler") << "shared pool: vaccel " << owner << "'s blocks are not free in this view yet: " << ok.error().message;
  }
  return placed;
}

Status EtcdPoolState::assign(VaccelId, const std::string&, const std::vector<BlockRange>&, int, HostVector) {
  return fail(Code::unimplemented, "a shared pool does not restore allocations after a restart yet (the holdings end "
                                   "with the scheduler's lease)");
}

void EtcdPoolState::campaignIfLeaderless() {
  if (campaigning_ || !shared_->leader().empty()) return;
  campaigning_ = true;
  post({[this]() -> Status {
          auto led = shared_->campaign();
          campaigning_ = false;  // sought again at the next change of a leaderless view
          return led ? Status{} : Status(fail(led.error()));
        },
        "seeking the pool's leadership"});
}

Status EtcdPoolState::applyMove(const Pool::Move& move) {
  const bool asked = std::any_of(movesAsked_.begin(), movesAsked_.end(), [&](const SharedMove& m) {
    return m.vaccel == move.owner && m.from == move.from && m.to == move.to;
  });
  if (!asked && !shared_->leads())
    return fail(Code::unavailable, "moves in the shared pool are planned by its leader (" +
                                       (shared_->leader().empty() ? std::string("none now") : shared_->leader()) + ")");
  if (move.owner >= SharedPool::kForeignIds) {
    // Another scheduler's vaccel: its data is there, so it moves it, asked to.
    auto it = foreign_.find(move.owner);
    if (it == foreign_.end()) return fail(Code::notFound, "no vaccel " + std::to_string(move.owner) + " in the view");
    SharedMove m{it->second.scheduler, it->second.vaccel, shared_->name(), move.from, move.to};
    if (movesAskedOfOthers_.insert({m.scheduler, m.vaccel}).second) {
      RLOG_INFO("scheduler") << "shared pool: asking scheduler " << m.scheduler << " to move its vaccel " << m.vaccel
                             << " to blocks " << m.to.first << "-" << m.to.end() - 1 << " (compaction)";
      post({[this, m] { return shared_->requestMove(m); }, "asking " + m.scheduler + " to move its vaccel " + std::to_string(m.vaccel)});
    }
    return fail(Code::unavailable, "vaccel " + holderElsewhere(move.owner) + " is moved by its own scheduler, which was asked to");
  }
  Owned o;
  {
    std::lock_guard lock(mutex_);
    auto it = owned_.find(move.owner);
    if (it == owned_.end()) return fail(Code::notFound, "vaccel " + std::to_string(move.owner) + " holds no blocks here");
    o = it->second;
  }
  if (o.ranges != move.from) return fail(Code::invalidArgument, "vaccel " + std::to_string(move.owner) + "'s blocks changed since the plan");
  if (auto claimed = shared_->claim(move.owner, o.vm, {move.to}, o.priority, o.host); !claimed) return claimed;
  {
    std::lock_guard lock(mutex_);
    if (auto it = owned_.find(move.owner); it != owned_.end()) it->second.ranges = {move.to};
  }
  sync();
  if (mirror_.held(move.owner) != std::vector<BlockRange>{move.to}) {  // the watch has not brought it yet
    mirror_.release(move.owner);
    if (auto ok = mirror_.assign(move.owner, {move.to}, o.priority, o.host); !ok)
      RLOG_WARN("scheduler") << "shared pool: vaccel " << move.owner << "'s new blocks are not free in this view yet: " << ok.error().message;
  }
  return {};
}

Result<std::string> EtcdPoolState::actElsewhere(const std::string& host, uint64_t id, bool preempt) {
  if (auto ok = limits::checkKeyName("host", host); !ok) return fail(ok.error());
  if (id == 0 || id >= SharedPool::kForeignIds) return fail(Code::invalidArgument, "vaccel ids are 1 to 2^62 - 1");
  if (host == shared_->name())
    return fail(Code::invalidArgument, "vaccel " + std::to_string(id) + " is this host's own: name it by its id alone");
  if (!shared_->alive(host)) return fail(Code::notFound, "no live scheduler '" + host + "' in the shared pool at " + describe_);
  SharedAction a{host, id, shared_->name(), preempt};
  post({[this, a] { return shared_->requestAction(a); }, "asking " + host + " to act on its vaccel " + std::to_string(id)});
  return "asked scheduler " + host + " to " + (preempt ? "preempt" : "resume") + " its vaccel #" + std::to_string(id) +
         " (its log and `raccelctl vaccels` there say what came of it)";
}

void EtcdPoolState::answerActions() {
  std::set<std::string> named;
  for (const SharedAction& a : actionsAsked_) {
    const std::string key = a.by + "/" + std::to_string(a.vaccel) + (a.preempt ? "/preempt" : "/resume");
    named.insert(key);
    if (!actionsAnswered_.insert(key).second) continue;  // its end is on the way
    Status done = actionAsked ? actionAsked(a.vaccel, a.preempt, a.by) : Status(fail(Code::unimplemented, "no scheduler"));
    RLOG_INFO("scheduler") << "shared pool: " << (a.preempt ? "preempt" : "resume") << " of vaccel " << a.vaccel
                           << " asked on " << a.by << ": " << (done ? std::string("done") : done.error().message);
    post({[this, vaccel = a.vaccel] { return shared_->endAction(shared_->name(), vaccel); },
          "ending the action asked of vaccel " + std::to_string(a.vaccel)});
  }
  std::erase_if(actionsAnswered_, [&](const std::string& k) { return !named.count(k); });
}

void EtcdPoolState::answerMoves() {
  std::set<std::string> named;
  for (const SharedMove& m : movesAsked_) {
    const std::string key = m.by + "/" + std::to_string(m.vaccel) + "@" + std::to_string(m.to.first);
    named.insert(key);
    if (!movesAnswered_.insert(key).second) continue;  // its end is on the way
    std::string refused;
    if (m.by != shared_->leader()) refused = "scheduler " + m.by + " does not lead the pool";
    bool moved = refused.empty() && moveAsked && moveAsked({m.vaccel, m.from, m.to}, "compaction planned by the pool's leader, " + m.by);
    if (!moved)
      RLOG_INFO("scheduler") << "shared pool: vaccel " << m.vaccel << " not moved as " << m.by << " asked: "
                             << (refused.empty() ? "it is busy, too big to move now, or its blocks changed" : refused);
    post({[this, vaccel = m.vaccel] { return shared_->endMove(shared_->name(), vaccel); },
          "ending the move request of vaccel " + std::to_string(m.vaccel)});
  }
  std::erase_if(movesAnswered_, [&](const std::string& k) { return !named.count(k); });
}

void EtcdPoolState::release(VaccelId owner) {
  mirror_.release(owner);
  preemptElsewhere(owner, "", 0, {});
  // owned_ is the record of this scheduler's holdings (the view may lag behind etcd).
  {
    std::lock_guard lock(mutex_);
    if (!owned_.erase(owner)) return;
    releasing_.insert(owner);
  }
  post({[this, owner] { return shared_->release(owner); }, "releasing vaccel " + std::to_string(owner), owner});
}

void EtcdPoolState::setPriority(VaccelId owner, int priority) {
  {
    std::lock_guard lock(mutex_);
    auto it = owned_.find(owner);
    if (it == owned_.end()) return;
    it->second.priority = priority;
  }
  mirror_.setPriority(owner, priority);
  post({[this, owner, priority] { return shared_->setPriority(owner, priority); },
        "recording vaccel " + std::to_string(owner) + "'s priority"});
}

void EtcdPoolState::post(Job job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_all();
}

void EtcdPoolState::run() {
  std::unique_lock lock(mutex_);
  unsigned backoffMs = 0;
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(backoffMs ? backoffMs : 1000),
                   [&] { return stopping_ || (backoffMs == 0 && (!jobs_.empty() || !reachable_ || shared_->leaseLost())); });
    if (stopping_) break;
    lock.unlock();
    if (shared_->leaseLost()) rejoin();
    // etcd lost: the view is read again (and watched) before anything else is tried.
    bool ok = shared_->watching() || shared_->refresh();
    if (ok != reachable_.load()) {
      if (ok) RLOG_INFO("scheduler") << "the shared pool's etcd is back (" << describe_ << ")";
      else RLOG_WARN("scheduler") << etcdLost().message;
      reachable_ = ok;
    }
    lock.lock();
    while (ok && !jobs_.empty() && !stopping_) {
      Job job = jobs_.front();
      lock.unlock();
      Status done = job.commit();
      lock.lock();
      // A passing loss of etcd: tried again. Anything else would fail the same way every
      // time and hold up every job behind it: given up, and said so.
      if (!done && done.error().code == Code::unavailable) {
        RLOG_WARN("scheduler") << "shared pool: " << job.what << ": " << done.error().message << " (tried again)";
        ok = false;
        break;
      }
      if (!done) RLOG_ERROR("scheduler") << "shared pool: " << job.what << ": " << done.error().message << " (given up)";
      jobs_.pop_front();
      if (job.released != kNoOwner) releasing_.erase(job.released);
    }
    backoffMs = ok ? 0 : std::min(backoffMs * 2 + 100, 2000u);
    if (!ok) reachable_ = shared_->watching();
  }
}

}  // namespace raccel::scheduler
