// A real raccel deployment for cross-process tests: a scheduler, netaccels and
// optionally raccel-guestd, each a child process with its log in a temporary folder.
// Used from the test's main thread.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "transport/blocking_link.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {

// A program's session on `socket` (a VM's port or raccel-guestd's socket) asking for
// `tflops`, named `program`; hello waits up to `admitWaitMs` for blocks, and every
// reply up to 30 s.
Result<std::unique_ptr<client::Session>> openSession(const std::string& socket, double tflops, const std::string& program,
                                                     unsigned admitWaitMs = 0);
// Runs a gemm (m x k) * (k x n) through `s` and compares it with a reference computed
// here; returns the largest error, or a negative number with the failure in *why.
double checkedGemm(client::Session& s, uint32_t m, uint32_t n, uint32_t k, unsigned seed, std::string* why);

std::string binary(const std::string& name);
// A loopback TCP port that was free a moment ago, and not one this process was given before.
int freePort();
// The same, chosen below the kernel's ephemeral range: a server that gives its port up and
// takes it again (a restarted etcd member) finds it still free, since neither another
// test's freePort() nor an outgoing connection's local end can take it meanwhile (one
// did: "bind: address already in use" when a killed member came back).
int steadyPort();
// Polls `ready` every 20 ms until it holds (true) or `timeoutMs` has passed (false).
bool waitFor(const std::function<bool()>& ready, int timeoutMs);
// A fresh temporary folder for a test's sockets and logs, removed when the process ends
// (kept where RACCEL_KEEP_TEST_DIRS is set).
std::string makeTempDir();
// Whether a unix socket is listening, not only bound (the file appears at bind(),
// connections are taken from listen()).
bool acceptsConnections(const std::string& socket);
// A whole file ("" when it cannot be read).
std::string readFile(const std::string& path);
// A netaccel's registration as a raw frame on the control channel: `name`, one CPU card
// of `tflops` and 1 GiB, made-up kept contexts counting down from `keptContext` (none
// when 0), the host's resources. What a stranger or a rogue node sends in tests.
std::vector<std::byte> registration(const std::string& name, double tflops, uint32_t keptContext = 0, uint32_t keptCount = 1,
                                    uint64_t hostCpuMilli = 0, uint64_t hostMemoryMib = 0);

// Runs a shell command; its output, stdout and stderr together, and its exit status in
// *status (-1 when it did not exit normally).
std::string runCommand(const std::string& command, int* status = nullptr);
// `text` as one word of a shell command line (single-quoted): paths may hold spaces.
std::string sh(const std::string& text);
// The source tree's `path` (e.g. "scripts/raccel-certs.sh"), quoted for a shell.
std::string sourcePath(const std::string& path);

// The test guest (vm-images/): the folder build.sh wrote, and the script that boots it.
std::string guestImage();
std::string guestBootScript();
// Why a guest cannot be booted here (no image, or no QEMU), or "".
std::string vmUnavailable();

// The pool CA and the scheduler's certificate for this test process (made once with
// scripts/raccel-certs.sh in a temporary folder); a node certificate is issued per name
// on first use. Flags for each daemon, and the files themselves.
std::string certDir();
std::vector<std::string> schedulerTlsArgs();
std::vector<std::string> netaccelTlsArgs(const std::string& node);

// The next error reply to instruction `seq` on a raw link (other frames skipped); code
// ok with "welcomed" when a welcome comes first, or "no reply: ..." when none comes.
Error expectErrorReply(transport::BlockingLink& link, uint64_t seq);

class Process {
 public:
  // `name` is a program of the build (bin/NAME), or a path when it has a '/'.
  Process(const std::string& name, std::vector<std::string> args, const std::string& logPath);
  ~Process();
  Process(Process&& other) noexcept;
  Process& operator=(Process&&) = delete;
  void kill(int signal);
  bool running();
  // Waits for exit (up to timeoutMs); returns the exit status or -1.
  int wait(int timeoutMs);
  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  std::string log_;
};

// A tensor op over `n` elements (shape {n}) of the given operands, the output first.
inline client::TensorOp vectorOp(client::TensorFn fn, uint64_t n, std::vector<client::TensorOperand> operands, float alpha = 1,
                                 float beta = 0) {
  client::TensorOp o;
  o.fn = fn;
  o.shape = {n};
  o.operands = std::move(operands);
  o.alpha = alpha, o.beta = beta;
  return o;
}

// n floats uniform in [-1, 1), the same for the same seed.
inline std::vector<float> randomFloats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct VmSpec {
  std::string name = "vm1";
  double tflops = 16;
  int priority = 0;
  std::string kinds;  // "gpu|cpu"; empty = all
  std::string memoryQuota = "1GiB";
  std::string attach;  // "connect": the scheduler connects to the socket (QEMU binds it)
  std::string socket;  // default: DIR/NAME.sock
  std::string more;    // further KEY=VALUE settings, comma-separated (e.g. "host_cpu=2")
};

class Cluster {
 public:
  // `schedulerArgs` are added to raccel-scheduler's command line (e.g. --block-tflops).
  // Node links are mutual TLS (certDir()) unless they include --insecure.
  // With --etcd among them it has no state directory (a shared pool's scheduler keeps none).
  explicit Cluster(std::vector<VmSpec> vms = {VmSpec{}}, std::string dir = "", std::vector<std::string> schedulerArgs = {});
  ~Cluster();

  // Starts a netaccel with `cards` (each a --card spec) and waits until the pool has
  // grown by `expectBlocks`.
  // `extraArgs` go on its command line too (e.g. --no-sandbox; --scheduler there replaces
  // this cluster's).
  Process& addNetaccel(const std::string& name, const std::vector<std::string>& cards, unsigned expectBlocks,
                       const std::vector<std::string>& extraArgs = {});
  // Starts raccel-guestd for `vm` and returns its program socket.
  std::string startGuestd(const std::string& vm = "vm1", const std::vector<std::string>& extraArgs = {});

  std::string vmSocket(const std::string& vm = "vm1") const { return dir_ + "/" + vm + ".sock"; }
  std::string consoleSocket() const { return dir_ + "/console.sock"; }
  std::string dir() const { return dir_; }
  int nodePort() const { return port_; }
  // The scheduler's HTTP port (web console, /metrics), and a netaccel's (/metrics).
  int httpPort() const { return httpPort_; }
  int netaccelHttpPort(const std::string& name) const { return netaccelHttp_.at(name); }
  // raccelctl's JSON for a query (nodes, cards, pool, vaccels).
  std::string console(const std::string& query) const;
  unsigned poolTotal() const;
  // Runs the real raccelctl with `args` (and --socket); its output, stdout and stderr
  // together, and its exit status in *status.
  std::string ctl(const std::vector<std::string>& args, int* status = nullptr) const;
  // Polls raccelctl `query` (JSON) until `ok` holds (up to timeoutMs); the last answer.
  std::string waitConsole(const std::string& query, const std::function<bool(const std::string&)>& ok,
                          int timeoutMs = 20000) const;
  Process& scheduler() { return *scheduler_; }
  // kill -9 the scheduler, start it again with the same arguments (its state database in
  // DIR/state), and wait until the netaccels have rejoined (unless told not to).
  void restartScheduler(bool waitForNetaccels = true);
  // Everything the daemons logged, for a failing test's message.
  std::string logs() const;

 private:
  std::string dir_;
  int port_ = 0;
  int httpPort_ = 0;
  std::map<std::string, int> netaccelHttp_;
  unsigned expectedTotal_ = 0;
  bool insecure_ = false;
  std::vector<std::string> schedulerArgs_;
  std::unique_ptr<Process> scheduler_;
  std::deque<Process> processes_;  // netaccels, guestd (a deque: addNetaccel's references stay valid)
  void startScheduler();
};

}  // namespace raccel::testing
