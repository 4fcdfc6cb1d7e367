#include "console/console_client.h"

#include <algorithm>
#include <ctime>

#include <cstdio>
#include <sstream>

#include "common/limits.h"
#include "schema/console.capnp.h"
#include "transport/blocking_link.h"
#include "transport/wire_types.h"

namespace raccel::console {
namespace {

const char* kind(wire::CardKind k) { return kindName(transport::fromWire(k)); }

std::string pad(const std::string& s, size_t width) { return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' '); }

// Milli-CPUs as CPUs to one decimal ("0.5").
std::string cpusText(uint64_t milli) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(milli) / 1000);
  return text;
}

// Blocks first..first+count-1 as "first-last", "-" for none.
std::string rangeText(uint64_t first, uint64_t count) {
  return count ? std::to_string(first) + "-" + std::to_string(first + count - 1) : "-";
}

std::string blocksText(capnp::List<wire::BlockRange>::Reader blocks) {
  std::string out;
  for (auto b : blocks) {
    if (!out.empty()) out += ",";
    out += std::to_string(b.getFirst()) + (b.getCount() > 1 ? "-" + std::to_string(b.getFirst() + b.getCount() - 1) : "");
  }
  return out;
}

// raccelctl nodes: each netaccel, its blocks, contexts and host resources.
void nodesTable(wire::ConsoleReply::Reader reply, std::ostringstream& out) {
  auto nodes = reply.getNodes();
  out << pad("NODE", 16) << pad("STATE", 9) << pad("ADDRESS", 22) << pad("CARDS", 6) << pad("BLOCKS", 12)
      << pad("CONTEXTS", 9) << pad("HOST CPU", 16) << pad("HOST MEMORY", 22) << "HEARD\n";
  for (auto n : nodes) {
    std::string range = rangeText(n.getFirstBlock(), n.getBlocks());
    out << pad(n.getName(), 16) << pad(n.getState(), 9) << pad(n.getAddress(), 22)
        << pad(std::to_string(n.getCards()), 6) << pad(range, 12) << pad(std::to_string(n.getContexts()), 9)
        << pad(n.getHostCpuMilli() ? cpusText(n.getHostCpuMilliUsed()) + "/" + cpusText(n.getHostCpuMilli()) : "-", 16)
        << pad(n.getHostMemoryMib() ? formatBytes(n.getHostMemoryMibUsed() << 20) + "/" + formatBytes(n.getHostMemoryMib() << 20)
                                    : "-",
               22)
        << (n.getOnline() ? std::to_string(n.getMsSinceHeartbeat()) + " ms ago" : "-") << "\n";
  }
}

// raccelctl cards: each card of each netaccel.
void cardsTable(wire::ConsoleReply::Reader reply, std::ostringstream& out) {
  auto cards = reply.getCards();
  size_t modelWidth = 18;  // as wide as the longest model (PoCL's run to ~50 characters)
  for (auto c : cards) modelWidth = std::max(modelWidth, std::min<size_t>(c.getModel().size() + 1, 64));
  out << pad("NODE", 16) << pad("CARD", 5) << pad("KIND", 5) << pad("MODEL", modelWidth) << pad("BACKEND", 8)
      << pad("TFLOPS", 8) << pad("MEMORY", 10) << pad("BLOCKS", 10) << "STATE\n";
  for (auto c : cards) {
    std::string range = rangeText(c.getFirstBlock(), c.getBlocks());
    char tf[32];
    std::snprintf(tf, sizeof tf, "%.1f", c.getTflops());
    out << pad(c.getNode(), 16) << pad(std::to_string(c.getIndex()), 5) << pad(kind(c.getKind()), 5)
        << pad(c.getModel(), modelWidth) << pad(c.getBackend(), 8) << pad(tf, 8)
        << pad(formatBytes(c.getMemoryBytes()), 10) << pad(range, 10)
        << (c.getOnline() ? "online" : "offline") << "\n";
  }
}

// raccelctl pool: the pool's ranges of blocks and who holds them.
void poolTable(wire::ConsoleReply::Reader reply, std::ostringstream& out) {
  auto pool = reply.getPool();
  out << "pool: " << poolSummary(pool) << "\n";
  out << pad("BLOCKS", 14) << pad("COUNT", 7) << pad("KIND", 5) << pad("NODE", 16) << pad("STATE", 9) << "OWNER\n";
  for (auto r : pool.getRanges()) {
    out << pad(std::to_string(r.getFirst()) + "-" + std::to_string(r.getFirst() + r.getCount() - 1), 14)
        << pad(std::to_string(r.getCount()), 7) << pad(kind(r.getKind()), 5) << pad(r.getNode(), 16)
        << pad(rangeState(r.getState()), 9) << r.getOwner().cStr() << "\n";
  }
}

// In a shared pool the tables list other schedulers' rows too: then a HOST column,
// first, names each row's scheduler ("(here)" for this one's). Whether there is one; its
// heading written if so.
template <class Rows>
bool hostColumn(Rows rows, std::ostringstream& out) {
  bool hosts = false;
  for (auto r : rows) hosts = hosts || r.getHost().size() > 0;
  if (hosts) out << pad("HOST", 12);
  return hosts;
}
template <class Row>
std::string hostCell(Row row) {
  return pad(row.getHost().size() ? row.getHost().cStr() : "(here)", 12);
}

// raccelctl vaccels: each virtual accelerator, its blocks, cards and use.
void vaccelsTable(wire::ConsoleReply::Reader reply, std::ostringstream& out) {
  auto vaccels = reply.getVaccels();
  const bool hosts = hostColumn(vaccels, out);
  out << pad("ID", 5) << pad("VM", 12) << pad("PROGRAM", 16) << pad("PRIO", 5) << pad("BLOCKS", 14) << pad("CARDS", 30)
      << pad("MEMORY", 12) << pad("INSTR", 9) << pad("MOVED", 10) << pad("KERNEL", 11) << "STATE\n";
  for (auto v : vaccels) {
    std::string cards;
    for (auto c : v.getCards())
      cards += (cards.empty() ? "" : ",") + std::string(c.getNode().cStr()) + "/" + std::to_string(c.getIndex()) + ":" +
               kind(c.getKind()) + "x" + std::to_string(c.getBlocks());
    if (hosts) out << hostCell(v);
    out << pad(std::to_string(v.getId()), 5) << pad(v.getVm(), 12) << pad(v.getProgram(), 16)
        << pad(std::to_string(v.getPriority()), 5) << pad(blocksText(v.getBlocks()), 14) << pad(cards, 30)
        << pad(formatBytes(v.getMemoryUsed()), 12) << pad(std::to_string(v.getInstructions()), 9)
        << pad(formatBytes(v.getBytesMoved()), 10)
        << pad(std::to_string(static_cast<uint64_t>(v.getKernelMs())) + " ms", 11) << v.getState().cStr() << "\n";
  }
}

// raccelctl vms: each VM, its policy and where it is attached.
void vmsTable(wire::ConsoleReply::Reader reply, std::ostringstream& out) {
  auto vms = reply.getVms();
  const bool hosts = hostColumn(vms, out);
  out << pad("VM", 14) << pad("STATE", 11) << pad("TFLOPS", 8) << pad("PRIO", 5) << pad("KINDS", 18)
      << pad("QUOTA", 10) << pad("HOST CPU", 9) << pad("HOST MEM", 10) << pad("BLOCKS", 7) << pad("SOURCE", 26) << "SOCKET\n";
  for (auto v : vms) {
    std::ostringstream tflops;
    tflops << v.getTflops();
    if (hosts) out << hostCell(v);
    out << pad(v.getName(), 14) << pad(v.getState(), 11) << pad(tflops.str(), 8)
        << pad(std::to_string(v.getPriority()), 5) << pad(v.getKinds(), 18) << pad(formatBytes(v.getMemoryQuota()), 10)
        << pad(v.getHostCpuMilli() ? cpusText(v.getHostCpuMilli()) : "-", 9)
        << pad(v.getHostMemoryMib() ? formatBytes(v.getHostMemoryMib() << 20) : "-", 10)
        << pad(std::to_string(v.getBlocksHeld()), 7) << pad(v.getSource(), 26) << v.getSocket().cStr() << " ("
        << v.getAttach().cStr() << ")\n";
    if (v.getProblem().size() > 0) out << "  " << v.getName().cStr() << ": " << v.getProblem().cStr() << "\n";
  }
}

std::string render(Query query, wire::ConsoleReply::Reader reply, bool json) {
  if (json) return dump(replyJson(reply)) + "\n";
  std::ostringstream out;
  switch (query) {
    case Query::nodes: nodesTable(reply, out); break;
    case Query::cards: cardsTable(reply, out); break;
    case Query::pool: poolTable(reply, out); break;
    case Query::vaccels: vaccelsTable(reply, out); break;
    case Query::vms: vmsTable(reply, out); break;
  }
  return out.str();
}

}  // namespace

Result<Query> parseQuery(const std::string& word) {
  if (word == "nodes") return Query::nodes;
  if (word == "cards") return Query::cards;
  if (word == "pool") return Query::pool;
  if (word == "vaccels") return Query::vaccels;
  if (word == "vms") return Query::vms;
  return fail(Code::invalidArgument, "unknown command '" + limits::clip(word, 64) + "' (the commands: " + kCommandList + ")");
}

namespace {
Status connectConsole(transport::BlockingLink& link, const std::string& socket) {
  if (auto c = link.connectUnix(socket); !c)
    return fail(Code::unavailable, c.error().message + " (is raccel-scheduler running, and may you read its console socket?)");
  return {};
}

// Decodes one reply: an error reply is the returned error; otherwise `use` reads it.
Status readReply(transport::Body body, const std::function<void(wire::ConsoleReply::Reader)>& use) {
  Status status;
  auto decoded = transport::decodeGuard([&] {
    transport::MessageIn in(std::move(body));
    auto reply = in.root<wire::ConsoleReply>();
    if (reply.which() == wire::ConsoleReply::ERROR) {
      status = fail(transport::errorFrom(reply.getError()));
      return;
    }
    use(reply);
  });
  if (!decoded) return fail(decoded.error());
  return status;
}
}  // namespace

Result<std::string> run(const std::string& socket, Query query, bool json, int timeoutMs) {
  transport::BlockingLink link;
  if (auto c = connectConsole(link, socket); !c) return fail(c.error());
  capnp::MallocMessageBuilder m;
  auto request = m.initRoot<wire::ConsoleRequest>();
  switch (query) {
    case Query::nodes: request.setNodes(); break;
    case Query::cards: request.setCards(); break;
    case Query::pool: request.setPool(); break;
    case Query::vaccels: request.setVaccels(); break;
    case Query::vms: request.setVms(); break;
  }
  if (auto s = link.sendNow(0, 1, m); !s) return fail(s.error());
  auto frame = link.receive(timeoutMs);
  if (!frame) return fail(frame.error());
  std::string text;
  if (auto r = readReply(std::move(frame->body), [&](wire::ConsoleReply::Reader reply) { text = render(query, reply, json); }); !r)
    return fail(r.error());
  return text;
}

Result<std::string> act(const std::string& socket, const std::vector<std::string>& words, const ActionOptions& options,
                        bool json, int timeoutMs) {
  capnp::MallocMessageBuilder m;
  if (auto built = buildAction(words, options, m.initRoot<wire::ConsoleRequest>()); !built) return fail(built.error());
  transport::BlockingLink link;
  if (auto c = connectConsole(link, socket); !c) return fail(c.error());
  if (auto s = link.sendNow(0, 1, m); !s) return fail(s.error());
  auto frame = link.receive(timeoutMs);
  if (!frame) return fail(frame.error());
  std::string text;
  if (auto r = readReply(std::move(frame->body), [&](wire::ConsoleReply::Reader reply) {
        if (reply.which() == wire::ConsoleReply::DONE) text = json ? dump(replyJson(reply)) : std::string(reply.getDone());
      });
      !r)
    return fail(r.error());
  return text + "\n";
}

Status follow(const std::string& socket, bool json, unsigned count, const std::function<void(const std::string&)>& print,
              bool recentOnly) {
  transport::BlockingLink link;
  if (auto c = connectConsole(link, socket); !c) return c;
  capnp::MallocMessageBuilder m;
  m.initRoot<wire::ConsoleRequest>().setEvents();
  if (auto s = link.sendNow(0, 1, m); !s) return s;
  for (unsigned printed = 0; count == 0 || printed < count;) {
    auto frame = link.receive(-1);
    if (!frame) return fail(frame.error());
    std::string line;
    bool isEvent = false, recentEnd = false;
    auto r = readReply(std::move(frame->body), [&](wire::ConsoleReply::Reader reply) {
      recentEnd = reply.which() == wire::ConsoleReply::DONE;
      if (reply.which() != wire::ConsoleReply::EVENT) return;
      isEvent = true;
      auto e = reply.getEvent();
      if (json) {
        line = dump(eventJson(e));
      } else {
        std::time_t secs = static_cast<std::time_t>(e.getUnixMs() / 1000);
        char when[32];
        std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&secs));
        line = std::string(when) + "." + std::to_string(1000 + e.getUnixMs() % 1000).substr(1) + "  " +
               pad(e.getKind(), 13) + pad(e.getSubject(), 24) + e.getDetail().cStr();
      }
    });
    if (!r) return r;
    if (recentEnd) {
      if (recentOnly) return {};
      continue;
    }
    if (!isEvent) return fail(Code::internal, "the scheduler answered events with something else");
    print(line);
    ++printed;
  }
  return {};
}

}  // namespace raccel::console
