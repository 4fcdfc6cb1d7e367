// raccel-sandbox: runs one tenant's work on one card, for raccel-netaccel (which starts
// it; see netaccel/sandbox.h). Not meant to be started by hand.
#include <seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
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

// A seccomp filter (allow by default; these denied with EPERM): signals to any process
// but this one (kill(0) and kill(-1) would reach the netaccel's process group), ptrace,
// other processes' memory, and sockets other than local ones.
Status confine() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return fail(Code::internal, "seccomp_init failed");
  const auto self = static_cast<scmp_datum_t>(getpid());
  const uint32_t deny = SCMP_ACT_ERRNO(EPERM);
  int rc = 0;
  auto add = [&](int syscall, unsigned count, const scmp_arg_cmp* args) {
    if (rc == 0) rc = seccomp_rule_add_array(ctx, deny, syscall, count, args);
  };
  scmp_arg_cmp notSelf = SCMP_A0(SCMP_CMP_NE, self);
  add(SCMP_SYS(kill), 1, &notSelf);
  add(SCMP_SYS(tgkill), 1, &notSelf);
  add(SCMP_SYS(rt_sigqueueinfo), 1, &notSelf);
  add(SCMP_SYS(rt_tgsigqueueinfo), 1, &notSelf);
  add(SCMP_SYS(tkill), 0, nullptr);  // takes a bare thread id: glibc signals with tgkill
  add(SCMP_SYS(pidfd_open), 0, nullptr);
  add(SCMP_SYS(pidfd_send_signal), 0, nullptr);
  add(SCMP_SYS(ptrace), 0, nullptr);
  add(SCMP_SYS(process_vm_readv), 0, nullptr);
  add(SCMP_SYS(process_vm_writev), 0, nullptr);
  for (scmp_datum_t family : {AF_INET, AF_INET6, AF_PACKET, AF_NETLINK}) {
    scmp_arg_cmp is = SCMP_A0(SCMP_CMP_EQ, family);
    add(SCMP_SYS(socket), 1, &is);
  }
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) return fail(Code::internal, std::string("cannot install the seccomp filter: ") + std::strerror(-rc));
  return {};
}

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
  setsid();  // out of the netaccel's process group and session
  signal(SIGPIPE, SIG_IGN);
  rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
  unsigned long long device = 0, memory = 0, hostMemory = 0, fd = 3, windowFd = 4;
  if (!number(flags, "device", &device) || !number(flags, "memory", &memory) || !number(flags, "host-memory", &hostMemory) ||
      !number(flags, "fd", &fd) || !number(flags, "window-fd", &windowFd)) {
    std::fprintf(stderr, "raccel-sandbox: --device, --memory, --host-memory, --fd and --window-fd take numbers\n");
    return 2;
  }
#ifndef __SANITIZE_ADDRESS__
  if (hostMemory) {
    rlimit data{hostMemory, hostMemory};
    setrlimit(RLIMIT_DATA, &data);
  }
#endif  // AddressSanitizer maps terabytes of shadow memory as it goes: no data limit there
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
  // From here on it runs guest code: it may signal nothing but itself, trace nothing,
  // read no other process's memory, and open no network socket.
  if (auto s = confine(); !s) {
    std::fprintf(stderr, "raccel-sandbox: %s\n", s.error().message.c_str());
    return 2;
  }
  return netaccel::serveSandbox(static_cast<int>(fd), window, **opened);
}
