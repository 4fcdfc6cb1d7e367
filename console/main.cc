// raccelctl: the operator's console for a raccel scheduler.
#include <cstdio>
#include <cstdlib>

#include "common/flags.h"
#include "console/console_client.h"

using namespace raccel;

int main(int argc, char** argv) {
  Flags flags("raccelctl", "Shows a raccel scheduler's state.\n\ncommands:\n"
                           "  nodes     netaccels: state, address, block range, last heartbeat\n"
                           "  cards     every card: kind, model, TFLOPS, memory, blocks\n"
                           "  pool      the block map: ranges, kind, node, free/used/offline, owner\n"
                           "  vaccels   virtual accelerators: VM, program, priority, blocks, cards, memory\n"
                           "  vms       VMs: policy (TFLOPS, priority, kinds, quota), where it came from, state\n"
                           "  events    a live stream: admissions, refusals, releases, node joins and losses,\n"
                           "            VMs attached, detached or rejected (the recent ones first)");
  flags.positional("COMMAND");
  flags.value("socket", "PATH", "the scheduler's console socket (default /run/raccel/console.sock)");
  flags.boolean("json", "print one JSON document instead of a table (events: one JSON object per line)");
  flags.value("count", "N", "events: stop after N events (default: follow until interrupted)");
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  if (flags.positionals().size() != 1) {
    std::fprintf(stderr, "raccelctl: give one command: nodes, cards, pool, vaccels, vms or events (see --help)\n");
    return 2;
  }
  const std::string socket = flags.get("socket", "/run/raccel/console.sock");
  if (flags.positionals()[0] == "events") {
    long count = std::atol(flags.get("count", "0").c_str());
    if (count < 0) {
      std::fprintf(stderr, "raccelctl: --count must be >= 0\n");
      return 2;
    }
    auto followed = console::follow(socket, flags.has("json"), static_cast<unsigned>(count), [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
    if (!followed) {
      std::fprintf(stderr, "raccelctl: %s\n", followed.error().message.c_str());
      return 1;
    }
    return 0;
  }
  auto query = console::parseQuery(flags.positionals()[0]);
  if (!query) {
    std::fprintf(stderr, "raccelctl: %s\n", query.error().message.c_str());
    return 2;
  }
  auto text = console::run(socket, *query, flags.has("json"));
  if (!text) {
    std::fprintf(stderr, "raccelctl: %s\n", text.error().message.c_str());
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  return 0;
}
