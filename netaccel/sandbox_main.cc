// raccel-sandbox: runs one tenant's work on one card, for raccel-netaccel (which starts
// it; see netaccel/sandbox.h). Not meant to be started by hand.
#include <fcntl.h>
#include <linux/landlock.h>
#include <seccomp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/flags.h"
#include "hal/backends.h"
#include "netaccel/kernel_template.h"
#include "netaccel/sandbox.h"

using namespace raccel;

namespace {

// A seccomp filter (allow by default; these denied with EPERM): signals to any process
// but this one (kill(0) and kill(-1) would reach the netaccel's process group), ptrace,
// other processes' memory, and new sockets.
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
  // No new sockets at all: its link to the netaccel is made; a local one could reach the
  // scheduler's console or a VM's socket as this user.
  add(SCMP_SYS(socket), 0, nullptr);
  add(SCMP_SYS(socketpair), 0, nullptr);
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) return fail(Code::internal, std::string("cannot install the seccomp filter: ") + std::strerror(-rc));
  return {};
}

// What every sandbox may read and run: its driver's and compiler's libraries, headers and
// tools (PoCL's clang links kernels with the system linker), the dynamic loader's cache,
// the OpenCL vendor list, and what a runtime asks of its own process and the CPUs. None
// of these hold anyone's data: /etc, /home, /root, /var, /tmp, /srv, /opt, other
// processes' /proc and the node's keys are not on the list, so they cannot be opened.
constexpr const char* kReadable[] = {
    "/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/usr/libexec", "/usr/bin", "/bin", "/usr/include",
    "/usr/share/pocl", "/usr/share/clc", "/usr/local/cuda", "/opt/xilinx/xrt", "/etc/ld.so.cache", "/etc/ld.so.conf",
    "/etc/ld.so.conf.d", "/etc/OpenCL/vendors", "/proc/self", "/proc/thread-self", "/proc/cpuinfo", "/proc/meminfo",
    "/proc/stat", "/proc/driver/nvidia", "/sys/devices/system/cpu", "/sys/devices/system/node",
    "/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"};
// Device nodes of cards (read and write): NVIDIA, DRM render nodes, AMD KFD, Xilinx.
constexpr const char* kCardDevices[] = {"nvidia", "dri", "kfd", "renderD", "xclmgmt", "xfpga", "accel", "dxg"};

// Landlock as an allow-list: the sandbox may open only kReadable, `moreReadable` (the
// operator's sandbox_read), the card device nodes and its own executable, and write only
// its own folder and the card devices. Kernels without Landlock: nothing (said in the log).
std::string landlock(const std::string& workdir, const std::vector<std::string>& moreReadable) {
  long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) return "Landlock is not available in this kernel; the sandbox's files are not confined";
  const uint64_t fileRead = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE;
  const uint64_t fileWrite = LANDLOCK_ACCESS_FS_WRITE_FILE;
  const uint64_t dirOnly = LANDLOCK_ACCESS_FS_READ_DIR | LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
                           LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                           LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK |
                           LANDLOCK_ACCESS_FS_MAKE_SYM | (abi >= 2 ? LANDLOCK_ACCESS_FS_REFER : 0);
  const uint64_t all = fileRead | fileWrite | dirOnly;
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = all;
  int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  if (ruleset < 0) return std::string("landlock_create_ruleset: ") + std::strerror(errno);
  std::string problem;
  auto allow = [&](const std::filesystem::path& path, uint64_t access) {
    int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
    if (fd < 0) return;  // not on this host
    struct stat st {};
    if (::fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) access &= fileRead | fileWrite;  // a file takes file rights only
    landlock_path_beneath_attr rule{access, fd};
    if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) != 0 && problem.empty())
      problem = "landlock_add_rule " + path.string() + ": " + std::strerror(errno);
    ::close(fd);
  };
  const uint64_t readOnly = fileRead | LANDLOCK_ACCESS_FS_READ_DIR;
  for (const char* path : kReadable) allow(path, readOnly);
  for (auto& path : moreReadable) allow(path, readOnly);
  allow("/proc/self/exe", fileRead);  // its own binary (a sanitizer's symbolizer reads it)
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/dev", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (std::any_of(std::begin(kCardDevices), std::end(kCardDevices), [&](const char* p) { return name.rfind(p, 0) == 0; }))
      allow(it->path(), readOnly | fileWrite);
  }
  for (const char* dev : {"/dev/null", "/dev/zero", "/dev/full"}) allow(dev, fileRead | fileWrite);
  allow(workdir, all);
  if (!problem.empty()) {
    ::close(ruleset);
    return problem;
  }
  if (syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
    std::string why = std::string("landlock_restrict_self: ") + std::strerror(errno);
    ::close(ruleset);
    return why;
  }
  ::close(ruleset);
  return {};
}

bool number(const Flags& flags, const char* name, unsigned long long* out) {
  if (!flags.has(name)) return true;
  const std::string text = flags.get(name);
  char* end = nullptr;
  *out = std::strtoull(text.c_str(), &end, 10);
  return !text.empty() && end && !*end;
}
void declareFlags(Flags& flags) {
  flags.value("backend", "NAME", "the card's backend (opencl, cuda, xrt)");
  flags.value("device", "N", "the device's index within its backend");
  flags.value("kind", "KIND", "the card's kind as the netaccel serves it");
  flags.value("model", "NAME", "the card's model as the netaccel serves it");
  flags.value("tflops", "T", "the card's TFLOPS (skips calibration)");
  flags.value("memory", "BYTES", "the card's memory as the netaccel serves it");
  flags.boolean("no-images", "offer no images even where the device has them (the card's images = false)");
  flags.value("host-memory", "BYTES", "data-segment limit (RLIMIT_DATA) for this process");
  flags.value("workdir", "DIR", "the folder this sandbox works in");
  flags.value("fd", "N", "the socket to the netaccel (default 3)");
  flags.value("window-fd", "N", "the shared-memory window, a memfd (default 4)");
  flags.value("probe-read", "PATH", "confine this process as for a tenant, try to read PATH, say what happened, exit "
                                    "(3 when something was denied): a check of a deployment, no device opened", true);
  flags.value("probe-write", "PATH", "the same for creating or writing PATH", true);
  flags.value("kernel-template", "DIR", "copy this kernel template into its compiler cache before it opens the "
                                        "card (netaccel/kernel_template.h)");
  flags.boolean("precompile", "build the card's kernel template instead of serving a tenant: compile raccel's "
                              "tensor kernels into --workdir's cache, confined as a tenant's sandbox, and mark it "
                              "complete (a file 'complete'); the netaccel moves it into place "
                              "(netaccel/kernel_template.h). With --probe-read/--probe-write: probe as confined "
                              "for the build, after opening the card");
  flags.value("read", "PATH", "a path this sandbox may read besides its driver's and compiler's files (the "
                             "operator's sandbox_read)", true);
}

// Nothing it runs may gain privileges or dump core; out of the netaccel's process group
// and session. (A tenant's sandbox and the template's builder both.)
void detach() {
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  setsid();
  signal(SIGPIPE, SIG_IGN);
  rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
}

// A tenant's sandbox: detached, and it may not outlive the netaccel (false: the netaccel
// is gone already). SIGPWR notes that the card went away.
bool harden() {
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() == 1) return false;  // the netaccel is already gone
  detach();
  // SIGPWR: the card went away under this sandbox, as after a driver reset (an
  // operator's rehearsal of one; its tenant is rebuilt from its lineage elsewhere). Not
  // SIGUSR1 or SIGUSR2: LLVM, inside PoCL, takes those for its own handlers.
  struct sigaction reset {};
  reset.sa_handler = [](int) { netaccel::noteCardReset(); };
  reset.sa_flags = SA_RESTART;
  sigemptyset(&reset.sa_mask);
  sigaction(SIGPWR, &reset, nullptr);
  return true;
}

// Caches and temporary files of the device's compiler stay in the sandbox's own folder:
// a cache shared between tenants would let one plant the binary another runs.
void keepCompilerFilesIn(const std::string& workdir) {
  setenv("POCL_CACHE_DIR", (workdir + "/pocl-cache").c_str(), 1);
  setenv("CUDA_CACHE_PATH", (workdir + "/cuda-cache").c_str(), 1);
  setenv("TMPDIR", workdir.c_str(), 1);
}

// The card as the netaccel serves it: its kind, model, TFLOPS, memory (0: the device's
// own) and whether it offers images, from the flags.
hal::DeviceOverrides cardOverrides(const Flags& flags, unsigned long long memory) {
  hal::DeviceOverrides overrides;
  if (flags.has("kind"))
    if (auto k = parseKind(flags.get("kind")); k) overrides.kind = *k;
  if (flags.has("model")) overrides.model = flags.get("model");
  if (flags.has("tflops")) overrides.tflops = std::atof(flags.get("tflops").c_str());
  if (memory) overrides.memoryBytes = memory;
  overrides.noImages = flags.has("no-images");
  return overrides;
}

// --probe-read, --probe-write: confined as for a tenant, can it read (write) these paths?
// Says so for each, and ends the process: 3 when one was denied.
[[noreturn]] void probe(const Flags& flags) {
  int denied = 0;
  for (auto [flag, mode] : {std::pair{"probe-read", O_RDONLY}, std::pair{"probe-write", O_WRONLY | O_CREAT}})
    for (auto& path : flags.getAll(flag)) {
      int f = ::open(path.c_str(), mode | O_CLOEXEC, 0600);
      std::printf("%s %s: %s\n", mode == O_RDONLY ? "read" : "write", path.c_str(), f >= 0 ? "allowed" : std::strerror(errno));
      if (f >= 0) ::close(f);
      else ++denied;
    }
  std::fflush(stdout);
  _exit(denied ? 3 : 0);
}

// From the moment it runs code the netaccel did not write (a tenant's, or a compiler's
// on it): it may signal nothing but itself, trace nothing, read no other process's
// memory, open no socket, read nothing but its driver's files, write only its folder.
Status confineAll(const Flags& flags, const std::string& workdir) {
  if (std::string why = landlock(workdir, flags.getAll("read")); !why.empty())
    std::fprintf(stderr, "raccel-sandbox: %s\n", why.c_str());
  return confine();
}

// --precompile: the card's kernel template (netaccel/kernel_template.h), built in its
// --workdir. It runs none of a tenant's code, only raccel's own kernels on empty input,
// and is confined as a tenant's sandbox is all the same (the compiler and the driver
// are large): it writes its folder only, and marks its cache complete there (a file
// `complete`, made last); the netaccel moves the cache into place. It outlives the
// netaccel that started it (no PDEATHSIG), whose life may be shorter than a build. At
// low priority: it shares the machine with tenants' work.
int precompile(const Flags& flags, unsigned long long device, const std::string& workdir) {
  detach();
  errno = 0;  // (nice may return -1 as the new niceness: only errno tells a failure)
  if (nice(10) == -1 && errno != 0) std::perror("raccel-sandbox: nice");
  hal::DeviceOverrides overrides = cardOverrides(flags, 0);
  overrides.noImages = true;
  auto opened = hal::openDevice(flags.get("backend"), static_cast<unsigned>(device), overrides);
  Result<unsigned> launched = opened ? Result<unsigned>(0u) : Result<unsigned>(fail(opened.error()));
  if (launched)
    if (auto s = confineAll(flags, workdir); !s) launched = fail(s.error());
  if (launched && (flags.has("probe-read") || flags.has("probe-write"))) probe(flags);
  if (launched) launched = (*opened)->precompile();
  if (launched && !(std::ofstream("complete.part") << *launched << "\n"))
    launched = fail(Code::internal, "cannot write " + workdir + "/complete.part");
  if (launched && std::rename("complete.part", "complete") != 0)
    launched = fail(Code::internal, "cannot mark the cache complete: " + std::string(std::strerror(errno)));
  if (!launched) {
    std::fprintf(stderr, "raccel-sandbox: precompile: %s\n", launched.error().message.c_str());
    return 1;
  }
  std::printf("raccel-sandbox: %u kernel launches compiled into %s/pocl-cache\n", *launched, workdir.c_str());
  return 0;
}

// The card, as the netaccel serves it (its overrides); the first reply says why not.
std::unique_ptr<hal::Device> openCard(const Flags& flags, unsigned long long device, unsigned long long memory, int fd) {
  auto opened = hal::openDevice(flags.get("backend"), static_cast<unsigned>(device), cardOverrides(flags, memory));
  if (!opened) {
    // The first reply says why; the netaccel fails the tenant's instructions with it.
    netaccel::sandbox::Reply r;
    r.code = static_cast<uint32_t>(opened.error().code);
    const std::string said = opened.error().message.substr(0, netaccel::sandbox::kMaxMessage);
    r.payload = said.size();
    (void)netaccel::sandbox::sendReplies(static_cast<int>(fd), std::span(&r, 1), said);
    return nullptr;
  }
  return std::move(*opened);
}
}  // namespace

int main(int argc, char** argv) {
  Flags flags("raccel-sandbox", "Runs one tenant's work on one card for raccel-netaccel, which starts it with a "
                                "socket and a shared-memory window; not meant to be started by hand. SIGPWR "
                                "tells it its card went away (as after a driver reset): its tenant is rebuilt "
                                "elsewhere from its lineage.");
  declareFlags(flags);
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  unsigned long long device = 0, memory = 0, hostMemory = 0, fd = 3, windowFd = 4;
  if (!number(flags, "device", &device) || !number(flags, "memory", &memory) || !number(flags, "host-memory", &hostMemory) ||
      !number(flags, "fd", &fd) || !number(flags, "window-fd", &windowFd)) {
    std::fprintf(stderr, "raccel-sandbox: --device, --memory, --host-memory, --fd and --window-fd take numbers\n");
    return 2;
  }
  if (flags.has("precompile")) {
    if (!flags.has("workdir") || chdir(flags.get("workdir").c_str()) != 0) {
      std::fprintf(stderr, "raccel-sandbox: --precompile needs a --workdir to build in\n");
      return 2;
    }
    keepCompilerFilesIn(flags.get("workdir"));
    const int status = precompile(flags, device, flags.get("workdir"));
    std::fflush(nullptr);
    _exit(status);  // (confined: a leak checker's exit handler could not run)
  }
  if (!harden()) return 1;
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
  std::string workdir = flags.has("workdir") ? flags.get("workdir") : std::filesystem::current_path().string();
  keepCompilerFilesIn(workdir);
  if (flags.has("kernel-template")) netaccel::copyKernelTemplate(flags.get("kernel-template"), workdir + "/pocl-cache");
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  // its /proc closed to other processes of this user
  if (flags.has("probe-read") || flags.has("probe-write")) {
    if (auto s = confineAll(flags, workdir); !s) {
      std::fprintf(stderr, "raccel-sandbox: %s\n", s.error().message.c_str());
      return 2;
    }
    probe(flags);
  }
  void* window = mmap(nullptr, netaccel::sandbox::kMappedBytes, PROT_READ | PROT_WRITE, MAP_SHARED, static_cast<int>(windowFd), 0);
  if (window == MAP_FAILED) {
    std::perror("raccel-sandbox: window");
    return 2;
  }

  auto opened = openCard(flags, device, memory, static_cast<int>(fd));
  if (!opened) return 1;
  if (auto s = confineAll(flags, workdir); !s) {
    std::fprintf(stderr, "raccel-sandbox: %s\n", s.error().message.c_str());
    return 2;
  }
  // Started ahead of its tenant (the warm pool), it builds raccel's own tensor kernels
  // meanwhile: a program's first tensor op then does not wait for their compile (~0.7 s
  // on PoCL here). A failure is the first tensor op's to report, as without this.
  if (auto s = opened->prepare(); !s)
    std::fprintf(stderr, "raccel-sandbox: preparing the card: %s\n", s.error().message.c_str());
  int status = netaccel::serveSandbox(static_cast<int>(fd), window, *opened);
  // Straight out: the driver reclaims the device, the kernel the rest. (Exit handlers,
  // such as a leak checker's, could not run confined: they need ptrace.)
  _exit(status);
}
