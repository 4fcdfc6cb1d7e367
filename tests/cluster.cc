#include "tests/cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "console/console_client.h"
#include "schema/guest.capnp.h"
#include "schema/node.capnp.h"
#include "transport/frame.h"
#include "transport/wire_types.h"
#include "vmfrontend/raccel.h"

extern char** environ;

namespace raccel::testing {
namespace {
// The ports this process was given: the kernel may hand the same ephemeral port to two
// binds in a row once the first is closed (an etcd cluster once got one peer port for two
// members: "duplicate url"), so none is given twice.
std::mutex portsMu;
std::set<int> portsGiven;

// Binds 127.0.0.1:`port` (0: any) and lets go; the port it had, or 0 when taken.
int bindLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return bound;
}

// The first port `pick` offers that binds and was not given before (0 after `attempts`).
int claimPort(const std::function<int()>& pick, int attempts) {
  for (int attempt = 0; attempt < attempts; ++attempt) {
    int port = bindLoopback(pick());
    if (port != 0 && portsGiven.insert(port).second) return port;
  }
  return 0;
}
}  // namespace

int freePort() {
  std::lock_guard lock(portsMu);
  return claimPort([] { return 0; }, 64);
}

int steadyPort() {
  static std::mt19937 rng(std::random_device{}());
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  std::uniform_int_distribution<int> below(10000, std::max(low - 1, 10001));
  {
    std::lock_guard lock(portsMu);
    if (int port = claimPort([&] { return below(rng); }, 1000)) return port;
  }
  return freePort();  // none below the range: an ephemeral one
}

bool waitFor(const std::function<bool()>& ready, int timeoutMs) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ready();
}

std::string binary(const std::string& name) { return std::string(RACCEL_BIN_DIR) + "/" + name; }

Error expectErrorReply(transport::BlockingLink& link, uint64_t seq) {
  for (int i = 0; i < 20; ++i) {
    auto f = link.receive(15000);
    if (!f) return Error{Code::ok, "no reply: " + f.error().message};
    if (f->header.channel == 0) continue;
    transport::MessageIn in(std::move(f->body));
    auto r = in.root<wire::Reply>();
    if (r.which() == wire::Reply::ERROR && r.getError().getSequence() == seq) return transport::errorFrom(r.getError().getError());
    if (r.which() == wire::Reply::WELCOME) return Error{Code::ok, "welcomed"};
  }
  return Error{Code::ok, "no error reply"};
}

std::string certDir() {
  static const std::string dir = [] {
    std::string d = makeTempDir() + "/certs";
    int status = 0;
    std::string out = runCommand("bash " + sourcePath("scripts/raccel-certs.sh") + " all " + sh(d), &status);
    if (status != 0) throw std::runtime_error("cannot make test certificates: " + out);
    return d;
  }();
  return dir;
}

std::vector<std::string> schedulerTlsArgs() {
  std::string d = certDir();
  return {"--tls-ca", d + "/ca.pem", "--tls-cert", d + "/scheduler.pem", "--tls-key", d + "/scheduler.key"};
}

std::vector<std::string> netaccelTlsArgs(const std::string& node) {
  std::string d = certDir();
  if (!std::filesystem::exists(d + "/" + node + ".pem")) {
    int status = 0;
    std::string out = runCommand("bash " + sourcePath("scripts/raccel-certs.sh") + " node " + sh(d) + " " + sh(node), &status);
    if (status != 0) throw std::runtime_error("cannot issue a certificate for " + node + ": " + out);
  }
  return {"--tls-ca", d + "/ca.pem", "--tls-cert", d + "/" + node + ".pem", "--tls-key", d + "/" + node + ".key"};
}

Process::Process(const std::string& name, std::vector<std::string> args, const std::string& logPath) : log_(logPath) {
  std::string path = name.find('/') == std::string::npos ? binary(name) : name;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path.c_str()));
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  if (posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), environ) != 0)
    throw std::runtime_error("cannot start " + path);
  posix_spawn_file_actions_destroy(&actions);
}

Process::Process(Process&& other) noexcept : pid_(other.pid_), log_(std::move(other.log_)) { other.pid_ = -1; }

Process::~Process() {
  if (pid_ > 0 && running()) {
    kill(SIGTERM);
    if (wait(3000) == -1) {
      kill(SIGKILL);
      wait(3000);
    }
  }
}

void Process::kill(int signal) {
  if (pid_ > 0) ::kill(pid_, signal);
}

bool Process::running() {
  if (pid_ <= 0) return false;
  int status;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int Process::wait(int timeoutMs) {
  if (pid_ <= 0) return -1;
  int status = 0;
  bool done = waitFor([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeoutMs);
  if (!done) return -1;
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string guestImage() { return std::string(RACCEL_BIN_DIR) + "/../vm"; }
std::string guestBootScript() { return std::string(RACCEL_SOURCE_DIR) + "/vm-images/boot.sh"; }

std::string vmUnavailable() {
  const std::string image = guestImage();
  if (std::filesystem::exists(image + "/MISSING")) {
    std::string why = readFile(image + "/MISSING");
    while (!why.empty() && why.back() == '\n') why.pop_back();
    return "no guest image: " + why;
  }
  if (!std::filesystem::exists(image + "/initramfs.cpio.gz")) return "no guest image in " + image;
  if (std::system("command -v qemu-system-x86_64 >/dev/null 2>&1") != 0)
    return "qemu-system-x86_64 not found (apt-get install qemu-system-x86)";
  return "";
}

bool acceptsConnections(const std::string& socket) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket.c_str());
  bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

namespace {
// The folders makeTempDir made, removed when the test process ends (a test that fails
// still ends here); RACCEL_KEEP_TEST_DIRS keeps them for a post-mortem.
struct TempDirs {
  std::mutex mutex;
  std::vector<std::string> made;
  ~TempDirs() {
    if (std::getenv("RACCEL_KEEP_TEST_DIRS")) return;
    std::error_code ignored;
    for (auto& d : made) std::filesystem::remove_all(d, ignored);
  }
};
TempDirs& tempDirs() {
  static TempDirs dirs;
  return dirs;
}
}  // namespace

std::string makeTempDir() {
  TempDirs& dirs = tempDirs();  // made before the first folder, so it is destroyed after its users
  char tmpl[] = "/tmp/raccel-it-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error(std::string("cannot make a folder in /tmp: ") + std::strerror(errno));
  std::lock_guard<std::mutex> lock(dirs.mutex);
  dirs.made.push_back(tmpl);
  return tmpl;
}

Cluster::Cluster(std::vector<VmSpec> vms, std::string dir, std::vector<std::string> schedulerArgs)
    : dir_(dir.empty() ? makeTempDir() : std::move(dir)) {
  port_ = freePort();
  httpPort_ = freePort();
  schedulerArgs_ = {"--node-listen", "127.0.0.1:" + std::to_string(port_), "--console", consoleSocket(),
                    "--http-listen", "127.0.0.1:" + std::to_string(httpPort_),
                    "--heartbeat-timeout-ms", "2000"};
  if (std::find(schedulerArgs.begin(), schedulerArgs.end(), "--etcd") == schedulerArgs.end()) {
    schedulerArgs_.push_back("--state-dir");
    schedulerArgs_.push_back(dir_ + "/state");
  }
  // Mutual TLS on the node links, as deployed; "--insecure" among schedulerArgs: plain TCP.
  insecure_ = std::find(schedulerArgs.begin(), schedulerArgs.end(), "--insecure") != schedulerArgs.end();
  if (!insecure_)
    for (auto& a : schedulerTlsArgs()) schedulerArgs_.push_back(a);
  for (auto& vm : vms) {
    std::string spec = "name=" + vm.name + ",socket=" + (vm.socket.empty() ? vmSocket(vm.name) : vm.socket) +
                       ",tflops=" + std::to_string(vm.tflops) + ",priority=" + std::to_string(vm.priority) +
                       ",memory_quota=" + vm.memoryQuota;
    if (!vm.kinds.empty()) spec += ",kinds=" + vm.kinds;
    if (!vm.attach.empty()) spec += ",attach=" + vm.attach;
    if (!vm.more.empty()) spec += "," + vm.more;
    schedulerArgs_.push_back("--vm");
    schedulerArgs_.push_back(spec);
  }
  schedulerArgs_.insert(schedulerArgs_.end(), schedulerArgs.begin(), schedulerArgs.end());
  startScheduler();
}

void Cluster::startScheduler() {
  // freePort() only says a port was free a moment ago: another test may take the HTTP
  // port meanwhile (a restart frees it for a while). Then the scheduler gets another one
  // (the node port stays: netaccels reconnect to it).
  for (int attempt = 0;; ++attempt) {
    std::filesystem::remove(consoleSocket());
    scheduler_ = std::make_unique<Process>("raccel-scheduler", schedulerArgs_, dir_ + "/scheduler.log");
    if (waitFor([&] { return std::filesystem::exists(consoleSocket()) || !scheduler_->running(); }, 10000) &&
        std::filesystem::exists(consoleSocket()))
      return;
    const std::string log = readFile(dir_ + "/scheduler.log");
    if (attempt >= 3 || log.find("cannot serve HTTP") == std::string::npos || log.find("in use") == std::string::npos)
      throw std::runtime_error("scheduler did not start:\n" + logs());
    httpPort_ = freePort();
    auto flag = std::find(schedulerArgs_.begin(), schedulerArgs_.end(), "--http-listen");
    if (flag == schedulerArgs_.end() || flag + 1 == schedulerArgs_.end())
      throw std::runtime_error("scheduler did not start:\n" + logs());
    *(flag + 1) = "127.0.0.1:" + std::to_string(httpPort_);
  }
}

void Cluster::restartScheduler(bool waitForNetaccels) {
  scheduler_->kill(SIGKILL);
  scheduler_->wait(5000);
  startScheduler();
  if (waitForNetaccels && !waitFor([&] { return poolTotal() == expectedTotal_; }, 15000))
    throw std::runtime_error("netaccels did not rejoin the restarted scheduler:\n" + logs());
}

Cluster::~Cluster() {
  // Netaccels and guestd first, the scheduler last.
  while (!processes_.empty()) processes_.pop_back();
  scheduler_.reset();
  std::error_code ec;
  if (!std::getenv("RACCEL_KEEP_TEST_DIRS")) std::filesystem::remove_all(dir_, ec);
}

Process& Cluster::addNetaccel(const std::string& name, const std::vector<std::string>& cards, unsigned expectBlocks,
                              const std::vector<std::string>& extraArgs) {
  // Only the cards a test names: no discovery of this machine's devices.
  std::vector<std::string> args = {"--name", name, "--discover", "none"};
  if (std::find(extraArgs.begin(), extraArgs.end(), "--scheduler") == extraArgs.end()) {
    args.push_back("--scheduler");
    args.push_back("127.0.0.1:" + std::to_string(port_));
  }
  if (insecure_) args.push_back("--insecure");
  else
    for (auto& a : netaccelTlsArgs(name)) args.push_back(a);
  for (auto& c : cards) {
    args.push_back("--card");
    args.push_back(c);
  }
  if (std::find(extraArgs.begin(), extraArgs.end(), "--http-listen") == extraArgs.end()) {
    netaccelHttp_[name] = freePort();
    args.push_back("--http-listen");
    args.push_back("127.0.0.1:" + std::to_string(netaccelHttp_[name]));
  }
  args.insert(args.end(), extraArgs.begin(), extraArgs.end());
  processes_.emplace_back("raccel-netaccel", args, dir_ + "/netaccel-" + name + ".log");
  expectedTotal_ += expectBlocks;
  if (!waitFor([&] { return poolTotal() == expectedTotal_; }, 10000))
    throw std::runtime_error("netaccel " + name + " did not join:\n" + logs());
  return processes_.back();
}

std::string Cluster::startGuestd(const std::string& vm, const std::vector<std::string>& extraArgs) {
  std::string socket = dir_ + "/guestd-" + vm + ".sock";
  std::vector<std::string> args{"--port", vmSocket(vm), "--listen", socket};
  args.insert(args.end(), extraArgs.begin(), extraArgs.end());
  processes_.emplace_back("raccel-guestd", args, dir_ + "/guestd-" + vm + ".log");
  if (!waitFor([&] { return acceptsConnections(socket); }, 10000)) throw std::runtime_error("guestd did not start:\n" + logs());
  return socket;
}

std::string Cluster::console(const std::string& query) const {
  auto q = console::parseQuery(query);
  auto text = console::run(consoleSocket(), *q, true, 5000);
  return text ? *text : "";
}

std::string Cluster::ctl(const std::vector<std::string>& args, int* status) const {
  std::string command = sh(binary("raccelctl")) + " --socket " + sh(consoleSocket());
  for (auto& a : args) command += " " + sh(a);
  return runCommand(command, status);
}

std::string sh(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string sourcePath(const std::string& path) { return sh(std::string(RACCEL_SOURCE_DIR) + "/" + path); }

std::string runCommand(const std::string& command, int* status) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) {
    if (status) *status = -1;
    return "popen failed";
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  if (status) *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

std::string Cluster::waitConsole(const std::string& query, const std::function<bool(const std::string&)>& ok,
                                 int timeoutMs) const {
  std::string last;
  for (int waited = 0; waited <= timeoutMs; waited += 20) {
    last = console(query);
    if (ok(last)) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return last;
}

unsigned Cluster::poolTotal() const {
  std::smatch m;
  std::string json = console("pool");
  static const std::regex total("\"total\":([0-9]+)");
  if (!std::regex_search(json, m, total)) return 0;
  return static_cast<unsigned>(std::stoul(m[1]));
}

std::string Cluster::logs() const {
  std::ostringstream out;
  for (auto& entry : std::filesystem::directory_iterator(dir_)) {
    if (entry.path().extension() != ".log") continue;
    std::ifstream in(entry.path());
    out << "---- " << entry.path().filename().string() << "\n" << in.rdbuf();
  }
  return out.str();
}


Result<std::unique_ptr<client::Session>> openSession(const std::string& socket, double tflops, const std::string& program,
                                                     unsigned admitWaitMs) {
  client::Options o;
  o.socket = socket;
  o.tflops = tflops;
  o.program = program;
  o.timeoutMs = 30000;
  o.admitWaitMs = admitWaitMs;
  return client::Session::open(o);
}

double checkedGemm(client::Session& s, uint32_t m, uint32_t n, uint32_t k, unsigned seed, std::string* why) {
  auto a = randomFloats(size_t{m} * k, seed), b = randomFloats(size_t{k} * n, seed + 1000);
  auto ha = s.alloc(a.size() * 4), hb = s.alloc(b.size() * 4), hc = s.alloc(size_t{m} * n * 4);
  s.writeFloats(ha, a);
  s.writeFloats(hb, b);
  s.fill(hc, 0, size_t{m} * n * 4, 0);
  s.gemm(m, n, k, 2.0f, ha, hb, 0.0f, hc);
  auto c = s.readFloats(hc, size_t{m} * n);
  if (!c) {
    *why = c.error().toString();
    return -1;
  }
  double maxErr = 0;
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t j = 0; j < n; ++j) {
      double ref = 0;
      for (uint32_t p = 0; p < k; ++p) ref += double(a[size_t{i} * k + p]) * b[size_t{p} * n + j];
      maxErr = std::max(maxErr, std::abs(2 * ref - (*c)[size_t{i} * n + j]));
    }
  s.free(ha);
  s.free(hb);
  s.free(hc);
  if (auto f = s.fence(); !f) {
    *why = f.error().toString();
    return -1;
  }
  return maxErr;
}

std::vector<std::byte> registration(const std::string& name, double tflops, uint32_t keptContext,
                                    uint32_t keptCount, uint64_t hostCpuMilli, uint64_t hostMemoryMib) {
  capnp::MallocMessageBuilder m;
  auto reg = m.initRoot<wire::NodeMessage>().initRegister();
  reg.setVersionMajor(wire::PROTOCOL_MAJOR);
  reg.setName(name);
  reg.setHostCpuMilli(hostCpuMilli);
  reg.setHostMemoryMib(hostMemoryMib);
  auto card = reg.initCards(1)[0];
  card.setKind(wire::CardKind::CPU);
  card.setTflops(tflops);
  card.setMemoryBytes(1 << 30);
  card.setModel("forged");
  card.setBackend("cpu");
  if (keptContext) {
    auto held = reg.initContexts(keptCount);
    for (uint32_t i = 0; i < keptCount; ++i) {
      held[i].setContext(keptContext - i);
      held[i].setCard(0);
    }
  }
  std::vector<std::byte> out;
  transport::appendFrame(out, transport::kControlChannel, 0, m);
  return out;
}

}  // namespace raccel::testing
