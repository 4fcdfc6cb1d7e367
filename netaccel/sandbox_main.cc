// raccel-sandbox: runs one tenant's work on one card, for raccel-netaccel (which starts
// it; see netaccel/sandbox.h). Not meant to be started by hand.
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>

#include "common/flags.h"
#include "hal/backends.h"
#include "netaccel/sandbox.h"

using namespace raccel;

namespace {
bool number(const Flags& flags, const char* name, unsigned long long* out) {
  if (!flags.has(name)) return true;
  char* end = nullptr;
  *out = std::strtoull(flags.get(name).c_str(), &end, 10);
  return end && !*end;
}
}  // namespace

int main(int argc, char** argv) {
  Flags flags("raccel-sandbox", "Runs one tenant's work on one card for raccel-netaccel, which starts it with a "
                                "socket and a shared-memory window; not meant to be started by hand.");
  flags.value("backend", "NAME", "the card's backend (opencl, cuda, xrt)");
  flags.value("device", "N", "the device's index within its backend");
  flags.value("kind", "KIND", "the card's kind as the netaccel serves it");
  flags.value("model", "NAME", "the card's model as the netaccel serves it");
  flags.value("tflops", "T", "the card's TFLOPS (skips calibration)");
  flags.value("memory", "BYTES", "the card's memory as the netaccel serves it");
  flags.value("host-memory", "BYTES", "data-segment limit (RLIMIT_DATA) for this process");
  flags.value("workdir", "DIR", "the folder this sandbox works in");
  flags.value("fd", "N", "the socket to the netaccel (default 3)");
  flags.value("window-fd", "N", "the shared-memory window, a memfd (default 4)");
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;

  // Nothing it runs may gain privileges, dump core, or outlive the netaccel.
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() == 1) return 1;  // the netaccel is already gone
  signal(SIGPIPE, SIG_IGN);
  rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
  unsigned long long device = 0, memory = 0, hostMemory = 0, fd = 3, windowFd = 4;
  if (!number(flags, "device", &device) || !number(flags, "memory", &memory) || !number(flags, "host-memory", &hostMemory) ||
      !number(flags, "fd", &fd) || !number(flags, "window-fd", &windowFd)) {
    std::fprintf(stderr, "raccel-sandbox: --device, --memory, --host-memory, --fd and --window-fd take numbers\n");
    return 2;
  }
  if (hostMemory) {
    rlimit data{hostMemory, hostMemory};
    setrlimit(RLIMIT_DATA, &data);
  }
  if (flags.has("workdir") && chdir(flags.get("workdir").c_str()) != 0) {
    std::perror("raccel-sandbox: workdir");
    return 2;
  }
  void* window = mmap(nullptr, netaccel::sandbox::kWindowBytes, PROT_READ | PROT_WRITE, MAP_SHARED, static_cast<int>(windowFd), 0);
  if (window == MAP_FAILED) {
    std::perror("raccel-sandbox: window");
    return 2;
  }

  hal::DeviceOverrides overrides;
  if (flags.has("kind"))
    if (auto k = parseKind(flags.get("kind")); k) overrides.kind = *k;
  if (flags.has("model")) overrides.model = flags.get("model");
  if (flags.has("tflops")) overrides.tflops = std::atof(flags.get("tflops").c_str());
  if (memory) overrides.memoryBytes = memory;
  auto opened = hal::openDevice(flags.get("backend"), static_cast<unsigned>(device), overrides);
  if (!opened) {
    // The first reply says why; the netaccel fails the tenant's instructions with it.
    netaccel::sandbox::Reply r;
    r.code = static_cast<uint32_t>(opened.error().code);
    r.payload = std::min<size_t>(opened.error().message.size(), netaccel::sandbox::kMaxMessage);
    std::memcpy(window, opened.error().message.data(), r.payload);
    (void)!write(static_cast<int>(fd), &r, sizeof r);
    return 1;
  }
  return netaccel::serveSandbox(static_cast<int>(fd), window, **opened);
}
