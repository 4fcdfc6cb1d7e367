// raccelctl: the operator's console for a raccel scheduler.
#include <cstdio>
#include <cstdlib>

#include "common/flags.h"
#include "console/console_client.h"

using namespace raccel;

namespace {

Flags declareFlags() {
  Flags flags("raccelctl", "Shows a raccel scheduler's state.\n\ncommands:\n"
                           "  nodes     netaccels: state, address, block range, last heartbeat\n"
                           "  cards     every card: kind, model, TFLOPS, memory, blocks\n"
                           "  pool      the block map: ranges, kind, node, free/used/offline, owner\n"
                           "  vaccels   virtual accelerators: VM, program, priority, blocks, cards, memory\n"
                           "  vms       VMs: policy (TFLOPS, priority, kinds, quota), where it came from, state\n"
                           "  events    a live stream: admissions, refusals, releases, node joins and losses,\n"
                           "            preemptions, resumptions, migrations, drains, policy changes, VMs\n"
                           "            attached, detached or rejected (the recent ones first, oldest at the top)\n"
                           "actions:\n"
                           "  preempt ID            suspend vaccel ID now (buffers saved to host memory, cards\n"
                           "                        released); it stays suspended until `resume ID`\n"
                           "  resume ID             let vaccel ID resume when its blocks are free\n"
                           "  preempt|resume HOST/ID  the same for another host's vaccel in a pool shared\n"
                           "                        through etcd (asked of the scheduler HOST)\n"
                           "  defrag                compact the pool now: move vaccels (their buffers too) so each\n"
                           "                        holds one range; limited by --max-moves and --max-bytes\n"
                           "  drain NODE            move everything off netaccel NODE (suspending what finds no room)\n"
                           "                        and place nothing new there; --undo ends it\n"
                           "  set-policy VM K=V...  change a VM's tflops, priority, kinds (gpu,cpu), memory_quota,\n"
                           "                        host_cpu or host_memory");
  flags.positional("COMMAND [ARGS]");
  flags.value("socket", "PATH", "the scheduler's console socket (default /run/raccel/console.sock)");
  flags.boolean("json", "print one JSON document instead of a table or sentence (events: one JSON object per line;\n"
                        "actions: {\"done\": ...}; an error: {\"error\": {\"code\", \"message\"}} and exit status 1)");
  flags.value("count", "N", "events: stop after N events (default: follow until interrupted)");
  flags.boolean("recent", "events: print the recent events (up to 256) and stop");
  flags.value("max-moves", "N", "defrag: at most N moves (default: the scheduler's per-minute budget)");
  flags.value("max-bytes", "BYTES", "defrag: move only vaccels with at most this much in buffers (e.g. 256MiB)");
  flags.boolean("undo", "drain: end draining; the node takes new work again");
  return flags;
}

// An error, as a sentence on stderr or (--json) as a document on stdout; returns `status`.
int failed(bool json, const Error& error, int status) {
  if (json) std::printf("%s\n", console::dump(console::errorJson(error)).c_str());
  else std::fprintf(stderr, "raccelctl: %s\n", error.message.c_str());
  return status;
}

// preempt, resume, defrag, drain, set-policy: one request, its answer printed.
int act(const Flags& flags, const std::string& socket, bool json) {
  console::ActionOptions options;
  auto moves = flags.getUnsigned("max-moves", 0, 1u << 20);
  if (!moves) return failed(json, moves.error(), 2);
  auto bytes = parseBytes(flags.get("max-bytes", "0"));
  if (!bytes) return failed(json, Error{Code::invalidArgument, "--max-bytes: " + bytes.error().message}, 2);
  options.maxMoves = static_cast<unsigned>(*moves);
  options.maxMoveBytes = *bytes;
  options.undo = flags.has("undo");
  auto done = console::act(socket, flags.positionals(), options, json);
  if (!done) return failed(json, done.error(), 1);
  std::fputs(done->c_str(), stdout);
  return 0;
}

// events: each printed as it comes, until --count of them (or --recent's are done).
int events(const Flags& flags, const std::string& socket, bool json) {
  auto count = flags.getUnsigned("count", 0, 1u << 30);
  if (!count) return failed(json, count.error(), 2);
  auto followed = console::follow(socket, json, static_cast<unsigned>(*count), [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }, flags.has("recent"));
  return followed ? 0 : failed(json, followed.error(), 1);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = declareFlags();
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  if (flags.positionals().empty()) {
    std::fprintf(stderr, "raccelctl: give a command: %s (see --help)\n", console::kCommandList);
    return 2;
  }
  const bool json = flags.has("json");
  const std::string socket = flags.get("socket", "/run/raccel/console.sock");
  if (console::isAction(flags.positionals()[0])) return act(flags, socket, json);
  if (flags.positionals().size() != 1)
    return failed(json, Error{Code::invalidArgument, flags.positionals()[0] + " takes no arguments"}, 2);
  if (flags.positionals()[0] == "events") return events(flags, socket, json);
  auto query = console::parseQuery(flags.positionals()[0]);
  if (!query) return failed(json, query.error(), 2);
  auto text = console::run(socket, *query, json);
  if (!text) return failed(json, text.error(), 1);
  std::fputs(text->c_str(), stdout);
  return 0;
}
