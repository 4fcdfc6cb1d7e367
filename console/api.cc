#include "console/api.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/limits.h"
#include "transport/wire_types.h"

namespace raccel::console {
namespace {

const char* kind(wire::CardKind k) { return kindName(transport::fromWire(k)); }

// A whole number prints as one (8, not 8.0): JSON has one number type.
Json number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<int64_t>(v);
  return v;
}

Json text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

}  // namespace

const char* rangeState(wire::PoolRange::State s) {
  switch (s) {
    case wire::PoolRange::State::FREE: return "free";
    case wire::PoolRange::State::USED: return "used";
    case wire::PoolRange::State::DRAINING: return "draining";
    case wire::PoolRange::State::OFFLINE: return "offline";
  }
  return "offline";
}

std::string poolSummary(wire::PoolMap::Reader pool) {
  std::ostringstream tflops;
  tflops << pool.getBlockTflops();
  return std::to_string(pool.getBlocks()) + " blocks of " + tflops.str() + " TFLOPS: " + std::to_string(pool.getFree()) +
         " free, " + std::to_string(pool.getUsed()) + " used, " + std::to_string(pool.getDraining()) + " draining, " +
         std::to_string(pool.getOffline()) + " offline";
}

Json eventJson(wire::Event::Reader e) {
  return Json{{"unixMs", e.getUnixMs()}, {"kind", text(e.getKind())}, {"subject", text(e.getSubject())},
              {"detail", text(e.getDetail())}};
}

Json errorJson(const Error& error) { return Json{{"error", {{"code", codeName(error.code)}, {"message", error.message}}}}; }

Json replyJson(wire::ConsoleReply::Reader reply) {
  switch (reply.which()) {
    case wire::ConsoleReply::ERROR: return errorJson(transport::errorFrom(reply.getError()));
    case wire::ConsoleReply::DONE: return Json{{"done", text(reply.getDone())}};
    case wire::ConsoleReply::EVENT: return eventJson(reply.getEvent());
    case wire::ConsoleReply::NODES: {
      Json list = Json::array();
      for (auto n : reply.getNodes())
        list.push_back({{"name", text(n.getName())}, {"address", text(n.getAddress())}, {"online", n.getOnline()},
                        {"cards", n.getCards()}, {"firstBlock", n.getFirstBlock()}, {"blocks", n.getBlocks()},
                        {"msSinceHeartbeat", n.getMsSinceHeartbeat()}, {"contexts", n.getContexts()},
                        {"hostCpuMilli", n.getHostCpuMilli()}, {"hostMemoryMib", n.getHostMemoryMib()},
                        {"hostCpuMilliUsed", n.getHostCpuMilliUsed()}, {"hostMemoryMibUsed", n.getHostMemoryMibUsed()},
                        {"state", text(n.getState())}});
      return Json{{"nodes", list}};
    }
    case wire::ConsoleReply::CARDS: {
      Json list = Json::array();
      for (auto c : reply.getCards())
        list.push_back({{"node", text(c.getNode())}, {"index", c.getIndex()}, {"kind", kind(c.getKind())},
                        {"model", text(c.getModel())}, {"backend", text(c.getBackend())}, {"tflops", number(c.getTflops())},
                        {"memoryBytes", c.getMemoryBytes()}, {"firstBlock", c.getFirstBlock()}, {"blocks", c.getBlocks()},
                        {"online", c.getOnline()}});
      return Json{{"cards", list}};
    }
    case wire::ConsoleReply::POOL: {
      auto pool = reply.getPool();
      Json ranges = Json::array();
      for (auto r : pool.getRanges())
        ranges.push_back({{"first", r.getFirst()}, {"last", r.getFirst() + r.getCount() - 1}, {"count", r.getCount()},
                          {"state", rangeState(r.getState())}, {"owner", text(r.getOwner())}, {"node", text(r.getNode())},
                          {"kind", kind(r.getKind())}});
      return Json{{"blockTflops", number(pool.getBlockTflops())}, {"total", pool.getTotal()}, {"free", pool.getFree()},
                  {"blocks", pool.getBlocks()}, {"used", pool.getUsed()}, {"draining", pool.getDraining()},
                  {"offline", pool.getOffline()}, {"summary", poolSummary(pool)}, {"ranges", ranges}};
    }
    case wire::ConsoleReply::VACCELS: {
      Json list = Json::array();
      for (auto v : reply.getVaccels()) {
        Json blocks = Json::array(), cards = Json::array();
        for (auto b : v.getBlocks()) blocks.push_back({{"first", b.getFirst()}, {"count", b.getCount()}});
        for (auto c : v.getCards())
          cards.push_back({{"node", text(c.getNode())}, {"index", c.getIndex()}, {"kind", kind(c.getKind())}, {"blocks", c.getBlocks()}});
        list.push_back({{"id", v.getId()}, {"vm", text(v.getVm())}, {"program", text(v.getProgram())},
                        {"priority", v.getPriority()}, {"blocks", blocks}, {"cards", cards},
                        {"memoryUsed", v.getMemoryUsed()}, {"memoryQuota", v.getMemoryQuota()},
                        {"instructions", v.getInstructions()}, {"bytesMoved", v.getBytesMoved()},
                        {"kernelMs", number(v.getKernelMs())}, {"state", text(v.getState())}, {"host", text(v.getHost())},
                        {"why", text(v.getWhy())}});
      }
      return Json{{"vaccels", list}};
    }
    case wire::ConsoleReply::VMS: {
      Json list = Json::array();
      for (auto v : reply.getVms())
        list.push_back({{"name", text(v.getName())}, {"source", text(v.getSource())}, {"socket", text(v.getSocket())},
                        {"attach", text(v.getAttach())}, {"tflops", number(v.getTflops())}, {"priority", v.getPriority()},
                        {"kinds", text(v.getKinds())}, {"memoryQuota", v.getMemoryQuota()}, {"state", text(v.getState())},
                        {"problem", text(v.getProblem())}, {"blocksHeld", v.getBlocksHeld()},
                        {"memoryUsed", v.getMemoryUsed()}, {"kernelMs", v.getKernelMs()},
                        {"hostCpuMilli", v.getHostCpuMilli()}, {"hostMemoryMib", v.getHostMemoryMib()},
                        {"host", text(v.getHost())}});
      return Json{{"vms", list}};
    }
  }
  return errorJson(Error{Code::internal, "a reply this console does not know"});
}

std::string dump(const Json& json) { return json.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool isAction(const std::string& word) {
  return word == "preempt" || word == "resume" || word == "defrag" || word == "drain" || word == "set-policy";
}

Status buildAction(const std::vector<std::string>& words, const ActionOptions& options, wire::ConsoleRequest::Builder request) {
  if (words.empty()) return fail(Code::invalidArgument, std::string("no action given (the actions: ") + kActionList + ")");
  const std::string& command = words[0];
  auto id = [&](const std::string& word) -> Result<uint64_t> {
    char* end = nullptr;
    std::string w = !word.empty() && word[0] == '#' ? word.substr(1) : word;
    unsigned long long v = std::strtoull(w.c_str(), &end, 10);
    if (w.empty() || *end || v == 0 || w[0] == '-' || w[0] == '+' || w.size() > 19)
      return fail(Code::invalidArgument, "'" + limits::clip(word, 64) + "' is not a vaccel id");
    return v;
  };
  if ((command == "preempt" || command == "resume") && words.size() == 2 && words[1].find('/') != std::string::npos) {
    // HOST/ID: another host's vaccel in a shared pool.
    const size_t slash = words[1].find('/');
    const std::string host = words[1].substr(0, slash);
    auto v = id(words[1].substr(slash + 1));
    if (!v) return fail(v.error());
    if (host.empty()) return fail(Code::invalidArgument, "'" + limits::clip(words[1], 64) + "' names no host (HOST/ID)");
    auto ref = command == "preempt" ? request.initPreemptElsewhere() : request.initResumeElsewhere();
    ref.setHost(host);
    ref.setId(*v);
  } else if (command == "preempt" || command == "resume") {
    if (words.size() != 2) return fail(Code::invalidArgument, command + " takes one vaccel id (see raccelctl vaccels)");
    auto v = id(words[1]);
    if (!v) return fail(v.error());
    if (command == "preempt") request.setPreempt(*v);
    else request.setResume(*v);
  } else if (command == "defrag") {
    if (words.size() != 1) return fail(Code::invalidArgument, "defrag takes no arguments (limits: --max-moves, --max-bytes)");
    auto d = request.initDefrag();
    d.setMaxMoves(options.maxMoves);
    d.setMaxMoveBytes(options.maxMoveBytes);
  } else if (command == "drain") {
    if (words.size() != 2) return fail(Code::invalidArgument, "drain takes one netaccel name (see raccelctl nodes)");
    auto d = request.initDrain();
    d.setNode(words[1]);
    d.setUndo(options.undo);
  } else if (command == "set-policy") {
    if (words.size() < 3)
      return fail(Code::invalidArgument, "set-policy takes a VM name and KEY=VALUE settings (tflops, priority, kinds, memory_quota, host_cpu, host_memory)");
    auto p = request.initSetPolicy();
    p.setVm(words[1]);
    auto settings = p.initSettings(words.size() - 2);
    for (size_t i = 2; i < words.size(); ++i) {
      auto eq = words[i].find('=');
      if (eq == std::string::npos || eq == 0) return fail(Code::invalidArgument, "'" + words[i] + "' is not KEY=VALUE");
      settings[i - 2].setKey(words[i].substr(0, eq));
      settings[i - 2].setValue(words[i].substr(eq + 1));
    }
  } else {
    return fail(Code::invalidArgument,
                "unknown action '" + limits::clip(command, 64) + "' (the actions: " + kActionList + ")");
  }
  return {};
}

}  // namespace raccel::console
