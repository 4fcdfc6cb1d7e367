// Platform, device, context, queue, event and sampler objects of libraccel-opencl, and
// the event machinery every command uses (see icd.h for the model).
#include "vmfrontend/opencl/objects.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace raccel::opencl {

namespace {
_cl_platform_id platform{&kDispatch};
_cl_device_id device{&kDispatch, {}};
bool deviceProbed = false;
std::string deviceProblem;
// The session opened to describe the device; the first context takes it.
std::unique_ptr<client::Session> spare;
}  // namespace

cl_platform_id thePlatform() { return &platform; }
cl_device_id theDevice() { return &device; }

std::recursive_mutex& apiLock() {
  static std::recursive_mutex m;
  return m;
}

void logLine(const std::string& line, bool always) {
  static const bool enabled = std::getenv("RACCEL_OPENCL_LOG") != nullptr;
  if (enabled || always) std::fprintf(stderr, "raccel-opencl: %s\n", line.c_str());
}

cl_ulong nowNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return cl_ulong(t.tv_sec) * 1000000000ull + cl_ulong(t.tv_nsec);
}

cl_int setInfo(const void* value, size_t size, size_t capacity, void* out, size_t* sizeRet) {
  if (out) {
    if (capacity < size) return CL_INVALID_VALUE;
    if (size) std::memcpy(out, value, size);
  }
  if (sizeRet) *sizeRet = size;
  return CL_SUCCESS;
}
cl_int setString(const std::string& s, size_t capacity, void* out, size_t* sizeRet) {
  return setInfo(s.c_str(), s.size() + 1, capacity, out, sizeRet);
}

client::Options sessionOptions(std::string* problem) {
  client::Options o;
  o.socket = "/run/raccel/guestd.sock";
  o.program = program_invocation_short_name ? program_invocation_short_name : "opencl";
  std::map<std::string, std::string> settings;
  const char* file = std::getenv("RACCEL_OPENCL_CONFIG");
  std::ifstream in(file ? file : "/etc/raccel/opencl.conf");
  for (std::string line; std::getline(in, line);) {
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(" \t"));
      s.erase(s.find_last_not_of(" \t\r") + 1);
      return s;
    };
    settings[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  for (auto [env, key] : {std::pair{"RACCEL_TFLOPS", "tflops"}, {"RACCEL_PRIORITY", "priority"}, {"RACCEL_KINDS", "kinds"},
                          {"RACCEL_SOCKET", "socket"}, {"RACCEL_PROGRAM", "program"}, {"RACCEL_WAIT_MS", "wait_ms"},
                          {"RACCEL_TIMEOUT_MS", "timeout_ms"}, {"RACCEL_SPIN_US", "spin_us"}})
    if (const char* v = std::getenv(env)) settings[key] = v;
  auto number = [&](const std::string& key, double lo, double hi, double& out) {
    auto it = settings.find(key);
    if (it == settings.end()) return;
    char* end = nullptr;
    double v = std::strtod(it->second.c_str(), &end);
    if (end == it->second.c_str() || *end != '\0' || !(v >= lo && v <= hi)) {
      if (problem) *problem = key + " = '" + it->second + "' is not a number from " + std::to_string(lo) + " to " + std::to_string(hi);
      return;
    }
    out = v;
  };
  double tflops = 0, priority = 0, waitMs = 0, timeoutMs = o.timeoutMs;
  number("tflops", 0, 1 << 24, tflops);
  number("priority", -1000, 1000, priority);
  number("wait_ms", 0, 86400000, waitMs);
  number("timeout_ms", 100, 86400000, timeoutMs);
  double spinUs = -1;  // (unset: libraccel's default, transport/spin_wait.h)
  number("spin_us", 0, 1000, spinUs);
  o.timeoutMs = static_cast<int>(timeoutMs);
  o.spinMicros = static_cast<int>(spinUs);
  o.tflops = tflops;
  o.priority = static_cast<int>(priority);
  o.admitWaitMs = static_cast<unsigned>(waitMs);
  if (auto it = settings.find("socket"); it != settings.end()) o.socket = it->second;
  if (auto it = settings.find("program"); it != settings.end()) o.program = it->second.substr(0, 128);
  if (auto it = settings.find("kinds"); it != settings.end()) {
    std::string list = it->second;
    for (size_t at = 0; at <= list.size();) {
      size_t end = list.find(',', at);
      if (end == std::string::npos) end = list.size();
      std::string word = list.substr(at, end - at);
      if (!word.empty()) {
        auto kind = parseKind(word);
        if (kind) o.kinds.push_back(*kind);
        else if (problem) *problem = "kinds: unknown card kind '" + word + "' (gpu, npu, fpga, cpu)";
      }
      at = end + 1;
    }
  }
  return o;
}

Result<std::unique_ptr<client::Session>> openSession() {
  if (spare) return std::move(spare);
  std::string problem;
  auto options = sessionOptions(&problem);
  if (!problem.empty()) return fail(Code::invalidArgument, "raccel OpenCL settings: " + problem);
  return client::Session::open(options);
}

bool probeDevice() {
  if (deviceProbed) return deviceProblem.empty();
  deviceProbed = true;
  auto s = openSession();
  if (!s) {
    deviceProblem = s.error().message;
    logLine("no device: " + deviceProblem, true);
    return false;
  }
  device.vaccel = (*s)->vaccel();
  spare = std::move(*s);
  return true;
}

// The card that runs OpenCL C for this vaccel (the first that does), else the primary.
const client::CardInfo* openclCard() {
  for (auto& c : device.vaccel.cards)
    if (c.runs(ProgramKind::openclC)) return &c;
  return device.vaccel.cards.empty() ? nullptr : &device.vaccel.cards.front();
}

// The extensions raccel carries (their kernels need nothing of the ICD but the card's
// compiler): offered where every card that runs OpenCL C for this vaccel lists them.
// Command-buffer extensions need objects raccel does not carry, and are not. Images are
// what every such card takes (common/images.h commonLimits).
const OpenclFeatures& openclFeatures() {
  static const OpenclFeatures features = [] {
    static const char* const carried[] = {
        "cl_khr_byte_addressable_store",       "cl_khr_global_int32_base_atomics", "cl_khr_global_int32_extended_atomics",
        "cl_khr_local_int32_base_atomics",     "cl_khr_local_int32_extended_atomics", "cl_khr_int64_base_atomics",
        "cl_khr_int64_extended_atomics",       "cl_khr_fp64",                      "cl_khr_3d_image_writes"};
    OpenclFeatures f;
    std::vector<const client::CardInfo*> cards;
    for (auto& c : device.vaccel.cards)
      if (c.runs(ProgramKind::openclC)) cards.push_back(&c);
    auto lists = [](const client::CardInfo& c, const std::string& name) {
      std::string padded = " " + c.openclExtensions + " ";
      return padded.find(" " + name + " ") != std::string::npos;
    };
    std::vector<const ImageLimits*> images;
    for (auto* c : cards) images.push_back(&c->images);
    f.images = commonLimits(images);
    if (!cards.empty() && !f.images.supported())
      logLine("no images (CL_DEVICE_IMAGE_SUPPORT is false): a card of this vaccel has none, or none in a format all share");
    for (const char* name : carried) {
      if (std::string(name) == "cl_khr_3d_image_writes" && !f.images.supported()) continue;
      // fp64 also needs a double-precision config from the card.
      bool fp64 = std::string(name) == "cl_khr_fp64";
      auto lacking = std::find_if(cards.begin(), cards.end(),
                                  [&](const client::CardInfo* c) { return !lists(*c, name) || (fp64 && !c->doubleFpConfig); });
      if (cards.empty() || lacking != cards.end()) {
        if (fp64 && lacking != cards.end())
          logLine("no cl_khr_fp64 (double precision): card " + (*lacking)->node + "/" + std::to_string((*lacking)->index) +
                      " (" + (*lacking)->model + ") of this vaccel has none", true);
        continue;
      }
      if (!f.extensions.empty()) f.extensions += ' ';
      f.extensions += name;
      if (fp64) {  // what every card does
        f.doubleFp = ~cl_device_fp_config(0);
        for (auto* c : cards) f.doubleFp &= c->doubleFpConfig;
      }
    }
    return f;
  }();
  return features;
}

cl_int clCode(Code code) {
  switch (code) {
    case Code::resourceExhausted: return CL_MEM_OBJECT_ALLOCATION_FAILURE;
    case Code::invalidArgument: return CL_INVALID_VALUE;
    default: return CL_OUT_OF_RESOURCES;
  }
}

// ---------------------------------------------------------------------------------
// Events

cl_event newEvent(cl_context ctx, cl_command_queue queue, cl_command_type type) {
  auto* e = make<_cl_event>();
  e->context = ctx;
  e->queue = queue;
  e->type = type;
  e->queued = nowNs();
  ctx->refs++;
  if (queue) queue->refs++;
  return e;
}

void retain(cl_event e) { e->refs++; }

void release(cl_event e) {
  if (--e->refs > 0) return;
  cl_context ctx = e->context;
  cl_command_queue q = e->queue;
  bury(e);
  if (q) releaseQueue(q);
  releaseContext(ctx);
}

static void fire(cl_event e, int which, cl_int status) {
  auto callbacks = std::move(e->callbacks[which]);
  e->callbacks[which].clear();
  for (auto& [fn, data] : callbacks) fn(e, status, data);
}

void complete(cl_event e, cl_int status) {
  if (e->status <= CL_COMPLETE) return;
  cl_ulong t = nowNs();
  if (!e->submitted) e->submitted = t;
  if (!e->started) e->started = t;
  if (!e->ended) e->ended = t;
  e->status = status;
  retain(e);  // callbacks may release it
  fire(e, 2, status < 0 ? status : CL_SUBMITTED);
  fire(e, 1, status < 0 ? status : CL_RUNNING);
  fire(e, 0, status);
  e->context->changed.notify_all();
  release(e);
}

// A command's instructions were sent: it completes when a fence answers after them.
static void track(cl_event e, uint64_t first, uint64_t last) {
  e->firstSeq = first;
  e->lastSeq = last;
  e->status = CL_SUBMITTED;
  e->submitted = e->started = nowNs();
  retain(e);
  e->context->inFlight.emplace(last, e);
}

cl_int takeUnreported(cl_context ctx) {
  return std::exchange(ctx->unreported, CL_SUCCESS);
}

// A kernel command's START and END: its device time by the card's own clock, ending
// when its completion was seen here (or right after its submission, if that was
// later): END - START is what the card measured, not the transport's round trips.
static void stampKernelTime(cl_context ctx, cl_event e) {
  if (!ctx->session || (e->type != CL_COMMAND_NDRANGE_KERNEL && e->type != CL_COMMAND_TASK)) return;
  auto ns = ctx->session->takeKernelNs(e->lastSeq);
  if (!ns) return;
  cl_ulong now = nowNs();
  e->started = std::max<cl_ulong>(e->submitted, now > *ns ? now - *ns : 0);
  e->ended = e->started + *ns;
}

// Completes every tracked event the last fence covers.
void settle(cl_context ctx) {
  uint64_t done = ctx->session ? ctx->session->completedThrough() : UINT64_MAX;
  while (!ctx->inFlight.empty() && ctx->inFlight.begin()->first <= done) {
    cl_event e = ctx->inFlight.begin()->second;
    ctx->inFlight.erase(ctx->inFlight.begin());
    stampKernelTime(ctx, e);
    complete(e, CL_COMPLETE);
    release(e);
  }
  while (!ctx->anonymous.empty() && ctx->anonymous.front().second <= done) ctx->anonymous.pop_front();
}

// A command sent without an event: only its failure is kept track of.
static void trackAnonymous(cl_context ctx, uint64_t first, uint64_t last) {
  if (!ctx->anonymous.empty() && ctx->anonymous.back().second + 1 == first) ctx->anonymous.back().second = last;
  else ctx->anonymous.emplace_back(first, last);
}

static bool sentAnonymously(cl_context ctx, uint64_t seq) {
  auto it = std::lower_bound(ctx->anonymous.begin(), ctx->anonymous.end(), seq,
                             [](const std::pair<uint64_t, uint64_t>& r, uint64_t s) { return r.second < s; });
  return it != ctx->anonymous.end() && it->first <= seq;
}

// A command's failure on the card, said (log, the context's callback) and kept for the
// next blocking call; returns its OpenCL code.
static cl_int commandFailed(cl_context ctx, const Error& error) {
  logLine("command failed: " + error.message, true);
  if (ctx->notify) ctx->notify(error.message.c_str(), nullptr, 0, ctx->notifyData);
  const cl_int code = error.openclError ? error.openclError : clCode(error.code);
  if (ctx->unreported == CL_SUCCESS) ctx->unreported = code;
  return code;
}

static void failInFlight(cl_context ctx, uint64_t seq, const Error& error) {
  if (seq == ctx->buildSeq) {
    ctx->buildError = error;
    return;
  }
  if (sentAnonymously(ctx, seq)) {
    commandFailed(ctx, error);
    return;
  }
  for (auto it = ctx->inFlight.lower_bound(seq); it != ctx->inFlight.end(); ++it) {
    cl_event e = it->second;
    if (e->firstSeq > seq) continue;
    ctx->inFlight.erase(it);
    complete(e, commandFailed(ctx, error));
    release(e);
    return;
  }
  logLine(error.message);
  if (ctx->notify) ctx->notify(error.message.c_str(), nullptr, 0, ctx->notifyData);
}

void loseSession(cl_context ctx, const std::string& why) {
  if (ctx->lost) return;
  ctx->lost = true;
  logLine("the raccel session is gone: " + why, true);
  if (ctx->notify) ctx->notify(why.c_str(), nullptr, 0, ctx->notifyData);
  while (!ctx->inFlight.empty()) {
    cl_event e = ctx->inFlight.begin()->second;
    ctx->inFlight.erase(ctx->inFlight.begin());
    complete(e, CL_OUT_OF_RESOURCES);
    release(e);
  }
  ctx->anonymous.clear();
}

// One round trip: everything sent so far has completed (or failed) afterwards.
cl_int fence(cl_context ctx) {
  if (ctx->lost) return CL_OUT_OF_RESOURCES;
  uint64_t target = ctx->session->lastSequence() + 1;
  auto s = ctx->session->fence();
  if (ctx->session->completedThrough() < target) {
    loseSession(ctx, s ? std::string("no answer") : s.error().message);
    return CL_OUT_OF_RESOURCES;
  }
  settle(ctx);
  return CL_SUCCESS;
}

// A wait-list event is satisfied once it completed, or (a command's) once it was sent:
// everything sent runs in order in the context's one stream.
static bool satisfied(cl_event e) {
  if (e->status <= CL_COMPLETE) return true;
  return e->queue != nullptr && e->status != CL_QUEUED;
}

static bool anyFailed(const std::vector<cl_event>& waits) {
  for (cl_event e : waits)
    if (e->status < 0) return true;
  return false;
}

struct Held {
  std::vector<cl_event> waits;  // retained
  cl_event event;               // retained
  std::function<cl_int()> run;
};

static void runCommand(cl_context ctx, cl_event e, const std::function<cl_int()>& run) {
  if (ctx->lost) {
    complete(e, CL_OUT_OF_RESOURCES);
    return;
  }
  uint64_t before = ctx->session->lastSequence();
  e->submitted = e->started = nowNs();
  cl_int rc = run();
  uint64_t after = ctx->session->lastSequence();
  if (rc != CL_SUCCESS) complete(e, rc);
  else if (after > before) track(e, before + 1, after);
  else if (e->type == CL_COMMAND_MARKER || e->type == CL_COMMAND_BARRIER) {
    // Nothing of its own: it completes with whatever was sent before it.
    if (before == 0 || before <= ctx->session->completedThrough()) complete(e, CL_COMPLETE);
    else track(e, before + 1, before);
  } else {
    complete(e, CL_COMPLETE);
  }
}

// Sends held commands whose wait lists are now satisfied, in order, on every queue of
// the context, until none can go (a command on one queue may wait for one on another).
void drainHeld(cl_context ctx) {
  // The queues are kept while their commands run (a command's last release may end
  // one, and with it its entry in the live set).
  std::vector<cl_command_queue> queues;
  for (cl_command_queue q : live<_cl_command_queue>())
    if (q->context == ctx) queues.push_back(q), q->refs++;
  for (bool progress = true; progress;) {
    progress = false;
    for (cl_command_queue q : queues) {
      while (!q->held.empty()) {
        bool ready = true;
        for (cl_event w : q->held.front()->waits) ready = ready && satisfied(w);
        if (!ready) break;
        progress = true;
        auto keep = q->held.front();
        q->held.pop_front();
        if (anyFailed(keep->waits)) complete(keep->event, CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
        else runCommand(ctx, keep->event, keep->run);
        for (cl_event w : keep->waits) release(w);
        release(keep->event);
      }
    }
  }
  for (cl_command_queue q : queues) releaseQueue(q);
  ctx->changed.notify_all();
}

cl_int waitEvent(cl_event e) {
  cl_context ctx = e->context;
  while (e->status > CL_COMPLETE) {
    if (e->status == CL_QUEUED || e->queue == nullptr) {
      // Held behind (or being) a user event: another thread must set it.
      std::unique_lock<std::recursive_mutex> lock(apiLock(), std::adopt_lock);
      ctx->changed.wait(lock);
      lock.release();
    } else if (cl_int rc = fence(ctx); rc != CL_SUCCESS) {
      return rc;
    }
  }
  return e->status < 0 ? CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST : CL_SUCCESS;
}

bool wouldHold(cl_command_queue q, cl_uint nWait, const cl_event* waitList) {
  if (!q->held.empty()) return true;
  for (cl_uint i = 0; i < nWait; ++i)
    if (valid(waitList[i]) && !satisfied(waitList[i])) return true;
  return false;
}

cl_int checkWaitList(cl_context ctx, cl_uint n, const cl_event* list) {
  if ((n == 0) != (list == nullptr)) return CL_INVALID_EVENT_WAIT_LIST;
  for (cl_uint i = 0; i < n; ++i) {
    if (!valid(list[i])) return CL_INVALID_EVENT_WAIT_LIST;
    if (list[i]->context != ctx) return CL_INVALID_CONTEXT;
  }
  return CL_SUCCESS;
}

cl_int enqueue(cl_command_queue q, cl_uint nWait, const cl_event* waitList, cl_event* eventOut, cl_command_type type,
               bool blocking, std::function<cl_int()> run) {
  cl_context ctx = q->context;
  if (cl_int rc = checkWaitList(ctx, nWait, waitList); rc != CL_SUCCESS) return rc;
  if (ctx->lost) return CL_OUT_OF_RESOURCES;
  // Nothing to wait for, nothing waits for it, nobody gets its event: it is sent without
  // one (an event per command was two thirds of this library's time on a run of enqueues).
  if (!eventOut && !blocking && nWait == 0 && q->held.empty()) {
    uint64_t before = ctx->session->lastSequence();
    cl_int rc = run();
    // (A command that failed at once has said so: as with an event, nothing more is kept.)
    if (uint64_t after = ctx->session->lastSequence(); rc == CL_SUCCESS && after > before) trackAnonymous(ctx, before + 1, after);
    return rc;
  }
  cl_event e = newEvent(ctx, q, type);
  std::vector<cl_event> waits(waitList, waitList + nWait);
  bool hold = wouldHold(q, nWait, waitList);
  cl_int rc = CL_SUCCESS;
  if (hold) {
    auto h = std::make_shared<Held>();
    for (cl_event w : waits) retain(w);
    h->waits = waits;
    retain(e);
    h->event = e;
    h->run = std::move(run);
    q->held.push_back(std::move(h));
  } else if (anyFailed(waits)) {
    complete(e, CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
    rc = CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;
  } else {
    runCommand(ctx, e, run);
  }
  if (blocking && rc == CL_SUCCESS) {
    rc = waitEvent(e);
    if (rc == CL_SUCCESS && e->status < 0) rc = e->status;
    if (rc == CL_SUCCESS) rc = takeUnreported(ctx);
  } else if (rc == CL_SUCCESS && !hold && e->status < 0) {
    rc = e->status;  // failed at once (a read that could not be done)
  }
  if (eventOut) *eventOut = e;
  else release(e);
  return rc;
}

// ---------------------------------------------------------------------------------
// Contexts and queues

void releaseContext(cl_context ctx) {
  if (--ctx->refs > 0) return;
  if (ctx->watcher) {
    ctx->watcherStop = true;
    ctx->changed.notify_all();
    auto& m = apiLock();
    m.unlock();
    ctx->watcher->join();
    m.lock();
  }
  bury(ctx);
}

void releaseQueue(cl_command_queue q) {
  if (--q->refs > 0) return;
  cl_context ctx = q->context;
  bury(q);
  releaseContext(ctx);
}

cl_context createContext(const cl_context_properties* props, void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*),
                         void* data, cl_int* err) {
  auto set = [&](cl_int rc) {
    if (err) *err = rc;
    return nullptr;
  };
  std::vector<cl_context_properties> kept;
  for (const cl_context_properties* p = props; p && *p; p += 2) {
    if (p[0] == CL_CONTEXT_PLATFORM) {
      if (reinterpret_cast<cl_platform_id>(p[1]) != thePlatform()) return set(CL_INVALID_PLATFORM);
    } else if (p[0] != CL_CONTEXT_INTEROP_USER_SYNC) {
      return set(CL_INVALID_PROPERTY);
    }
    kept.push_back(p[0]);
    kept.push_back(p[1]);
  }
  if (props) kept.push_back(0);
  if (!probeDevice()) return set(CL_DEVICE_NOT_AVAILABLE);
  auto session = openSession();
  if (!session) {
    logLine("cannot open a raccel session: " + session.error().message, true);
    if (notify) notify(session.error().message.c_str(), nullptr, 0, data);
    return set(session.error().code == Code::resourceExhausted ? CL_OUT_OF_RESOURCES : CL_DEVICE_NOT_AVAILABLE);
  }
  auto* ctx = make<_cl_context>();
  ctx->session = std::move(*session);
  ctx->properties = std::move(kept);
  ctx->notify = notify;
  ctx->notifyData = data;
  ctx->session->onError([ctx](uint64_t seq, const Error& e) { failInFlight(ctx, seq, e); });
  if (err) *err = CL_SUCCESS;
  return ctx;
}

// Completes events that have callbacks, while any are in flight (the program may never
// wait for them itself).
void watchCallbacks(cl_context ctx) {
  if (ctx->watcher) {
    ctx->changed.notify_all();
    return;
  }
  ctx->watcher = std::make_unique<std::thread>([ctx] {
    std::unique_lock<std::recursive_mutex> lock(apiLock());
    for (;;) {
      bool wanted = false;
      for (auto& [seq, e] : ctx->inFlight) wanted = wanted || !e->callbacks[0].empty() || !e->callbacks[1].empty();
      if (ctx->watcherStop) return;
      if (!wanted || ctx->lost) {
        ctx->changed.wait(lock);
        continue;
      }
      ctx->session->flush();
      if (fence(ctx) != CL_SUCCESS) continue;
    }
  });
}

}  // namespace raccel::opencl
