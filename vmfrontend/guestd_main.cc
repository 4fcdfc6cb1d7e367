// raccel-guestd: runs in the guest; owns the virtio-serial port and multiplexes the
// guest's programs onto it.
#include <dirent.h>

#include <cstdio>
#include <fstream>

#include "common/flags.h"
#include "common/log.h"
#include "transport/signals.h"
#include "vmfrontend/guestd.h"

using namespace raccel;

namespace {
// The port named `name`, found through /sys/class/virtio-ports/*/name (no udev needed).
std::string findPort(const std::string& name) {
  const char* root = "/sys/class/virtio-ports";
  DIR* dir = opendir(root);
  if (!dir) return "";
  std::string found;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(std::string(root) + "/" + e->d_name + "/name");
    std::string n;
    if (std::getline(in, n) && n == name) {
      found = std::string("/dev/") + e->d_name;
      break;
    }
  }
  closedir(dir);
  return found;
}
}  // namespace

int main(int argc, char** argv) {
  Flags flags("raccel-guestd", "Owns the VM's raccel virtio-serial port and multiplexes local programs onto it.");
  flags.value("port", "PATH", "the port: a character device, or a unix socket standing for it "
                              "(default: the virtio port named org.raccel.vaccel.0)");
  flags.value("listen", "PATH", "where programs connect (default /run/raccel/guestd.sock)");
  flags.value("replay-bytes", "BYTES", "per program, unacknowledged bytes kept to resend after a scheduler restart "
                                      "before guestd fences for it (default 64MiB)");
  flags.value("log-level", "LEVEL", "debug, info, warn or error (default info)");
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  guestd::GuestdConfig config;
  config.listen = flags.get("listen", config.listen);
  config.port = flags.get("port", "");
  if (flags.has("replay-bytes")) {
    auto bytes = parseBytes(flags.get("replay-bytes"));
    if (!bytes || *bytes == 0) {
      std::fprintf(stderr, "raccel-guestd: --replay-bytes wants a positive size such as 64MiB\n");
      return 2;
    }
    config.replayBytes = static_cast<size_t>(*bytes);
  }
  if (config.port.empty()) config.port = findPort("org.raccel.vaccel.0");
  if (config.port.empty()) {
    std::fprintf(stderr, "raccel-guestd: no --port given and no virtio port named org.raccel.vaccel.0 in "
                         "/sys/class/virtio-ports (is virtio_console loaded and the channel in the VM's definition?)\n");
    return 2;
  }
  uv_loop_t* loop = uv_default_loop();
  guestd::Guestd daemon(loop, config);
  if (auto s = daemon.start(); !s) {
    std::fprintf(stderr, "raccel-guestd: %s\n", s.error().message.c_str());
    return 2;
  }
  transport::runUntilSignalled(loop, [&] { daemon.stop(); });
  return 0;
}
