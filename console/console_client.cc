#include "console/console_client.h"

#include <ctime>

#include <cstdio>
#include <sstream>

#include "schema/console.capnp.h"
#include "transport/blocking_link.h"
#include "transport/wire_types.h"

namespace raccel::console {
namespace {

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

const char* kind(wire::CardKind k) { return kindName(transport::fromWire(k)); }

std::string pad(const std::string& s, size_t width) { return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' '); }

std::string blocksText(capnp::List<wire::BlockRange>::Reader blocks) {
  std::string out;
  for (auto b : blocks) {
    if (!out.empty()) out += ",";
    out += std::to_string(b.getFirst()) + (b.getCount() > 1 ? "-" + std::to_string(b.getFirst() + b.getCount() - 1) : "");
  }
  return out;
}

std::string render(Query query, wire::ConsoleReply::Reader reply, bool json) {
  std::ostringstream out;
  switch (query) {
    case Query::nodes: {
      auto nodes = reply.getNodes();
      if (json) {
        out << "{\"nodes\":[";
        for (size_t i = 0; i < nodes.size(); ++i) {
          auto n = nodes[i];
          out << (i ? "," : "") << "{\"name\":" << jsonString(n.getName()) << ",\"address\":" << jsonString(n.getAddress())
              << ",\"online\":" << (n.getOnline() ? "true" : "false") << ",\"cards\":" << n.getCards()
              << ",\"firstBlock\":" << n.getFirstBlock() << ",\"blocks\":" << n.getBlocks()
              << ",\"msSinceHeartbeat\":" << n.getMsSinceHeartbeat() << ",\"contexts\":" << n.getContexts() << "}";
        }
        out << "]}\n";
        break;
      }
      out << pad("NODE", 16) << pad("STATE", 9) << pad("ADDRESS", 22) << pad("CARDS", 6) << pad("BLOCKS", 12)
          << pad("CONTEXTS", 9) << "HEARD\n";
      for (auto n : nodes) {
        std::string range = n.getBlocks() ? std::to_string(n.getFirstBlock()) + "-" + std::to_string(n.getFirstBlock() + n.getBlocks() - 1) : "-";
        out << pad(n.getName(), 16) << pad(n.getOnline() ? "online" : "offline", 9) << pad(n.getAddress(), 22)
            << pad(std::to_string(n.getCards()), 6) << pad(range, 12) << pad(std::to_string(n.getContexts()), 9)
            << (n.getOnline() ? std::to_string(n.getMsSinceHeartbeat()) + " ms ago" : "-") << "\n";
      }
      break;
    }
    case Query::cards: {
      auto cards = reply.getCards();
      if (json) {
        out << "{\"cards\":[";
        for (size_t i = 0; i < cards.size(); ++i) {
          auto c = cards[i];
          out << (i ? "," : "") << "{\"node\":" << jsonString(c.getNode()) << ",\"index\":" << c.getIndex()
              << ",\"kind\":\"" << kind(c.getKind()) << "\",\"model\":" << jsonString(c.getModel())
              << ",\"backend\":" << jsonString(c.getBackend()) << ",\"tflops\":" << c.getTflops()
              << ",\"memoryBytes\":" << c.getMemoryBytes() << ",\"firstBlock\":" << c.getFirstBlock()
              << ",\"blocks\":" << c.getBlocks() << ",\"online\":" << (c.getOnline() ? "true" : "false") << "}";
        }
        out << "]}\n";
        break;
      }
      out << pad("NODE", 16) << pad("CARD", 5) << pad("KIND", 5) << pad("MODEL", 18) << pad("BACKEND", 8) << pad("TFLOPS", 8)
          << pad("MEMORY", 10) << pad("BLOCKS", 10) << "STATE\n";
      for (auto c : cards) {
        std::string range = c.getBlocks() ? std::to_string(c.getFirstBlock()) + "-" + std::to_string(c.getFirstBlock() + c.getBlocks() - 1) : "-";
        char tf[32];
        std::snprintf(tf, sizeof tf, "%.1f", c.getTflops());
        out << pad(c.getNode(), 16) << pad(std::to_string(c.getIndex()), 5) << pad(kind(c.getKind()), 5)
            << pad(c.getModel(), 18) << pad(c.getBackend(), 8) << pad(tf, 8)
            << pad(std::to_string(c.getMemoryBytes() >> 20) + " MiB", 10) << pad(range, 10)
            << (c.getOnline() ? "online" : "offline") << "\n";
      }
      break;
    }
    case Query::pool: {
      auto pool = reply.getPool();
      auto state = [](wire::PoolRange::State s) {
        return s == wire::PoolRange::State::FREE ? "free" : s == wire::PoolRange::State::USED ? "used" : "offline";
      };
      if (json) {
        out << "{\"blockTflops\":" << pool.getBlockTflops() << ",\"total\":" << pool.getTotal() << ",\"free\":" << pool.getFree()
            << ",\"ranges\":[";
        auto ranges = pool.getRanges();
        for (size_t i = 0; i < ranges.size(); ++i) {
          auto r = ranges[i];
          out << (i ? "," : "") << "{\"first\":" << r.getFirst() << ",\"last\":" << (r.getFirst() + r.getCount() - 1)
              << ",\"count\":" << r.getCount() << ",\"state\":\"" << state(r.getState()) << "\",\"owner\":" << jsonString(r.getOwner())
              << ",\"node\":" << jsonString(r.getNode()) << ",\"kind\":\"" << kind(r.getKind()) << "\"}";
        }
        out << "]}\n";
        break;
      }
      out << "pool: " << pool.getTotal() << " blocks of " << pool.getBlockTflops() << " TFLOPS, " << pool.getFree() << " free\n";
      out << pad("BLOCKS", 14) << pad("COUNT", 7) << pad("KIND", 5) << pad("NODE", 16) << pad("STATE", 8) << "OWNER\n";
      for (auto r : pool.getRanges()) {
        out << pad(std::to_string(r.getFirst()) + "-" + std::to_string(r.getFirst() + r.getCount() - 1), 14)
            << pad(std::to_string(r.getCount()), 7) << pad(kind(r.getKind()), 5) << pad(r.getNode(), 16)
            << pad(state(r.getState()), 8) << r.getOwner().cStr() << "\n";
      }
      break;
    }
    case Query::vaccels: {
      auto vaccels = reply.getVaccels();
      if (json) {
        out << "{\"vaccels\":[";
        for (size_t i = 0; i < vaccels.size(); ++i) {
          auto v = vaccels[i];
          out << (i ? "," : "") << "{\"id\":" << v.getId() << ",\"vm\":" << jsonString(v.getVm())
              << ",\"program\":" << jsonString(v.getProgram()) << ",\"priority\":" << v.getPriority() << ",\"blocks\":[";
          for (size_t b = 0; b < v.getBlocks().size(); ++b)
            out << (b ? "," : "") << "{\"first\":" << v.getBlocks()[b].getFirst() << ",\"count\":" << v.getBlocks()[b].getCount() << "}";
          out << "],\"cards\":[";
          for (size_t c = 0; c < v.getCards().size(); ++c) {
            auto card = v.getCards()[c];
            out << (c ? "," : "") << "{\"node\":" << jsonString(card.getNode()) << ",\"index\":" << card.getIndex()
                << ",\"kind\":\"" << kind(card.getKind()) << "\",\"blocks\":" << card.getBlocks() << "}";
          }
          out << "],\"memoryUsed\":" << v.getMemoryUsed() << ",\"memoryQuota\":" << v.getMemoryQuota()
              << ",\"instructions\":" << v.getInstructions() << ",\"bytesMoved\":" << v.getBytesMoved()
              << ",\"kernelMs\":" << v.getKernelMs()
              << ",\"state\":" << jsonString(v.getState()) << "}";
        }
        out << "]}\n";
        break;
      }
      out << pad("ID", 5) << pad("VM", 12) << pad("PROGRAM", 16) << pad("PRIO", 5) << pad("BLOCKS", 14) << pad("CARDS", 30)
          << pad("MEMORY", 12) << pad("INSTR", 9) << pad("MOVED", 10) << pad("KERNEL", 11) << "STATE\n";
      for (auto v : vaccels) {
        std::string cards;
        for (auto c : v.getCards())
          cards += (cards.empty() ? "" : ",") + std::string(c.getNode().cStr()) + "/" + std::to_string(c.getIndex()) + ":" +
                   kind(c.getKind()) + "x" + std::to_string(c.getBlocks());
        out << pad(std::to_string(v.getId()), 5) << pad(v.getVm(), 12) << pad(v.getProgram(), 16)
            << pad(std::to_string(v.getPriority()), 5) << pad(blocksText(v.getBlocks()), 14) << pad(cards, 30)
            << pad(std::to_string(v.getMemoryUsed() >> 20) + " MiB", 12) << pad(std::to_string(v.getInstructions()), 9)
            << pad(std::to_string(v.getBytesMoved() >> 10) + " KiB", 10)
            << pad(std::to_string(static_cast<uint64_t>(v.getKernelMs())) + " ms", 11) << v.getState().cStr() << "\n";
      }
      break;
    }
    case Query::vms: {
      auto vms = reply.getVms();
      if (json) {
        out << "{\"vms\":[";
        for (size_t i = 0; i < vms.size(); ++i) {
          auto v = vms[i];
          out << (i ? "," : "") << "{\"name\":" << jsonString(v.getName()) << ",\"source\":" << jsonString(v.getSource())
              << ",\"socket\":" << jsonString(v.getSocket()) << ",\"attach\":" << jsonString(v.getAttach())
              << ",\"tflops\":" << v.getTflops() << ",\"priority\":" << v.getPriority()
              << ",\"kinds\":" << jsonString(v.getKinds()) << ",\"memoryQuota\":" << v.getMemoryQuota()
              << ",\"state\":" << jsonString(v.getState()) << ",\"problem\":" << jsonString(v.getProblem())
              << ",\"blocksHeld\":" << v.getBlocksHeld() << ",\"memoryUsed\":" << v.getMemoryUsed() << "}";
        }
        out << "]}\n";
        break;
      }
      out << pad("VM", 14) << pad("STATE", 11) << pad("TFLOPS", 8) << pad("PRIO", 5) << pad("KINDS", 18)
          << pad("QUOTA", 10) << pad("BLOCKS", 7) << pad("SOURCE", 26) << "SOCKET\n";
      for (auto v : vms) {
        std::ostringstream tflops;
        tflops << v.getTflops();
        out << pad(v.getName(), 14) << pad(v.getState(), 11) << pad(tflops.str(), 8)
            << pad(std::to_string(v.getPriority()), 5) << pad(v.getKinds(), 18)
            << pad(std::to_string(v.getMemoryQuota() >> 20) + " MiB", 10) << pad(std::to_string(v.getBlocksHeld()), 7)
            << pad(v.getSource(), 26) << v.getSocket().cStr() << " (" << v.getAttach().cStr() << ")\n";
        if (v.getProblem().size() > 0) out << "  " << v.getName().cStr() << ": " << v.getProblem().cStr() << "\n";
      }
      break;
    }
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
  return fail(Code::invalidArgument, "unknown command '" + word + "' (use nodes, cards, pool, vaccels or vms)");
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

bool isAction(const std::string& word) {
  return word == "preempt" || word == "resume" || word == "defrag" || word == "drain" || word == "set-policy";
}

Result<std::string> act(const std::string& socket, const std::vector<std::string>& words, const ActionOptions& options,
                        int timeoutMs) {
  capnp::MallocMessageBuilder m;
  auto request = m.initRoot<wire::ConsoleRequest>();
  const std::string& command = words.at(0);
  auto id = [&]() -> Result<uint64_t> {
    if (words.size() != 2) return fail(Code::invalidArgument, command + " takes one vaccel id (see raccelctl vaccels)");
    char* end = nullptr;
    std::string w = words[1][0] == '#' ? words[1].substr(1) : words[1];
    unsigned long long v = std::strtoull(w.c_str(), &end, 10);
    if (w.empty() || *end || v == 0) return fail(Code::invalidArgument, "'" + words[1] + "' is not a vaccel id");
    return v;
  };
  if (command == "preempt" || command == "resume") {
    auto v = id();
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
      return fail(Code::invalidArgument, "set-policy takes a VM name and KEY=VALUE settings (tflops, priority, kinds, memory_quota)");
    auto p = request.initSetPolicy();
    p.setVm(words[1]);
    auto settings = p.initSettings(words.size() - 2);
    for (size_t i = 2; i < words.size(); ++i) {
      auto eq = words[i].find('=');
      if (eq == std::string::npos || eq == 0)
        return fail(Code::invalidArgument, "'" + words[i] + "' is not KEY=VALUE");
      settings[i - 2].setKey(words[i].substr(0, eq));
      settings[i - 2].setValue(words[i].substr(eq + 1));
    }
  } else {
    return fail(Code::invalidArgument, "unknown action '" + command + "'");
  }
  transport::BlockingLink link;
  if (auto c = connectConsole(link, socket); !c) return fail(c.error());
  if (auto s = link.sendNow(0, 1, m); !s) return fail(s.error());
  auto frame = link.receive(timeoutMs);
  if (!frame) return fail(frame.error());
  std::string text;
  if (auto r = readReply(std::move(frame->body), [&](wire::ConsoleReply::Reader reply) {
        if (reply.which() == wire::ConsoleReply::DONE) text = reply.getDone();
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
        line = "{\"unixMs\":" + std::to_string(e.getUnixMs()) + ",\"kind\":" + jsonString(e.getKind()) +
               ",\"subject\":" + jsonString(e.getSubject()) + ",\"detail\":" + jsonString(e.getDetail()) + "}";
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
