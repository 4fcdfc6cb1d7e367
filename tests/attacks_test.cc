// The attacks of issue 29, each tried with real processes as an attacker would: a
// stranger's failed handshakes beside healthy node links, a tensor op whose zero-sized
// dimension hid overflowing strides, an op worth hours of a shared card, kernel source
// that includes the host's files, launch fields beyond the card, and a local user
// holding the console's event streams. In each, the daemons keep running, the other
// tenants' results are exact, and the error names what was wrong.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "hal/backends.h"
#include "tests/cluster.h"
#include "tests/raw_http.h"
#include "schema/node.capnp.h"
#include "transport/blocking_link.h"
#include "transport/lane.h"
#include "transport/wire_types.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

using client::Arg;
using client::Session;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::unique_ptr<Session> open(const std::string& socket, double tflops, const std::string& name) {
  client::Options o;
  o.socket = socket;
  o.tflops = tflops;
  o.program = name;
  o.timeoutMs = 60000;
  auto s = Session::open(o);
  EXPECT_TRUE(s) << s.error().message;
  return s ? std::move(*s) : nullptr;
}

// Data a tenant keeps on its card, and the check that it is still exactly there.
struct Kept {
  client::Handle handle = 0;
  std::vector<float> values;
};
Kept keep(Session& s, size_t count, unsigned seed) {
  Kept k{s.alloc(count * 4), randomFloats(count, seed)};
  s.writeFloats(k.handle, k.values);
  EXPECT_TRUE(s.fence());
  return k;
}
bool intact(Session& s, const Kept& k, std::string* why) {
  auto got = s.readFloats(k.handle, k.values.size());
  if (!got) return *why = got.error().message, false;
  if (*got != k.values) return *why = "the values changed", false;
  return true;
}

// ---- 1. One link cannot affect another ----------------------------------------------

// A client that presents a certificate of another CA used to leave OpenSSL's per-thread
// error queue full, and the next read on a healthy node link was taken for a TLS
// failure: that netaccel was dropped and its tenants lost their buffers.
TEST(Attacks, StrangersFailedHandshakesNeverDropAHealthyNetaccel) {
  Cluster cluster({VmSpec{"vm1", 4}, VmSpec{"vm2", 4}});
  cluster.addNetaccel("node0", {"kind=gpu,model=sim,tflops=4,memory=256MiB"}, 4);
  cluster.addNetaccel("node1", {"kind=gpu,model=sim,tflops=4,memory=256MiB"}, 4);
  auto a = open(cluster.vmSocket("vm1"), 4, "a"), b = open(cluster.vmSocket("vm2"), 4, "b");
  ASSERT_TRUE(a && b);
  ASSERT_NE(a->vaccel().cards.front().node, b->vaccel().cards.front().node) << "each tenant on its own netaccel";
  Kept ka = keep(*a, 1 << 14, 1), kb = keep(*b, 1 << 14, 2);

  std::string rogue = cluster.dir() + "/rogue";
  runCommand("bash " + sourcePath("scripts/raccel-certs.sh") + " all " + sh(rogue) + " node9");
  const std::string port = std::to_string(cluster.nodePort());
  // The stranger trusts the scheduler's certificate (the pool CA) and presents its own of
  // another CA: the scheduler's check of it fails (a client that distrusts the scheduler
  // would abort first, and the scheduler's own verification would never run).
  const std::string badCa = "echo | timeout 10 openssl s_client -quiet -connect 127.0.0.1:" + port + " -CAfile " +
                            sh(certDir() + "/ca.pem") + " -cert " + sh(rogue + "/node9.pem") + " -key " + sh(rogue + "/node9.key") +
                            " >/dev/null 2>&1";
  std::string why;
  for (int round = 0; round < 6; ++round) {
    runCommand(badCa);  // another CA's certificate: refused at the handshake
    // The healthy links are read next (before another failure could empty the queue).
    ASSERT_TRUE(intact(*a, ka, &why)) << "round " << round << ": " << why << "\n" << cluster.logs();
    ASSERT_TRUE(intact(*b, kb, &why)) << "round " << round << ": " << why << "\n" << cluster.logs();
    int garbage = rawhttp::connectTo(cluster.nodePort());  // bytes that are no TLS record
    rawhttp::sendAll(garbage, std::string(517, char(0x16 + round)));
    int half = rawhttp::connectTo(cluster.nodePort());  // half a ClientHello, then silence
    rawhttp::sendAll(half, std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11));
    // Both tenants' links are read right after each failure.
    ASSERT_TRUE(intact(*a, ka, &why)) << "round " << round << ": " << why << "\n" << cluster.logs();
    ASSERT_TRUE(intact(*b, kb, &why)) << "round " << round << ": " << why << "\n" << cluster.logs();
    ::close(garbage);
    ::close(half);
  }
  EXPECT_EQ(cluster.poolTotal(), 8u) << cluster.console("nodes");
  std::string log = readFile(cluster.dir() + "/scheduler.log");
  EXPECT_TRUE(contains(log, "TLS handshake with")) << log;  // the strangers were refused...
  EXPECT_FALSE(contains(log, "lost node")) << log;           // ...and no healthy node went with them
  EXPECT_FALSE(std::regex_search(log, std::regex("TLS from [^\n]* failed"))) << log;
  EXPECT_TRUE(cluster.scheduler().running());
}

// A netaccel on the scheduler's host that cheats with its same-host lane (shared memory
// for big frames, transport/lane.h): memfds that could be shrunk under the scheduler, a
// token it was never given, then a descriptor pointing past its lane. Each is refused or
// ends that link alone; the honest netaccel's tenant, whose big frames cross its own
// lane, keeps every byte.
struct RogueNode {
  transport::BlockingLink link;
  std::string lanePath, token;
  explicit RogueNode(int port, const std::string& name) {
    link.adopt(rawhttp::connectTo(port));
    const auto reg = registration(name, 2);
    EXPECT_TRUE(link.sendRaw(reg.data(), reg.size()));
    lanePath = awaitControl(wire::SchedulerMessage::LANE_OFFER, [&](wire::SchedulerMessage::Reader r) {
      token.assign(reinterpret_cast<const char*>(r.getLaneOffer().getToken().begin()), r.getLaneOffer().getToken().size());
      return std::string(r.getLaneOffer().getPath());
    });
  }
  // The first control message of kind `which` (others skipped), through `take`; "" if none came.
  std::string awaitControl(wire::SchedulerMessage::Which which,
                           const std::function<std::string(wire::SchedulerMessage::Reader)>& take = {}) {
    for (int i = 0; i < 50; ++i) {
      auto f = link.receive(5000);
      if (!f) return "";
      if (f->header.channel != transport::kControlChannel) continue;
      transport::MessageIn in(std::move(f->body));
      auto r = in.root<wire::SchedulerMessage>();
      if (r.which() == which) return take ? take(r) : "yes";
    }
    return "";
  }
};

TEST(Attacks, ANetaccelThatCheatsWithItsSameHostLaneLosesOnlyItsOwnLane) {
  Cluster cluster({VmSpec{"vm1", 4}}, "", {"--insecure"});
  cluster.addNetaccel("node0", {"kind=gpu,model=sim,tflops=4,memory=256MiB"}, 4);
  auto tenant = open(cluster.vmSocket(), 4, "tenant");
  ASSERT_TRUE(tenant);
  Kept kept = keep(*tenant, 4 << 20, 5);  // 16 MiB: big frames, through node0's lane
  ASSERT_TRUE(waitFor([&] { return contains(readFile(cluster.dir() + "/scheduler.log"), "'node0' shares a same-host lane"); }, 5000))
      << cluster.logs();

  // 1. Memfds it could shrink (no seals), with its own token: refused, its link stays.
  RogueNode unsealed(cluster.nodePort(), "rogue1");
  ASSERT_FALSE(unsealed.lanePath.empty()) << cluster.logs();
  transport::UniqueFd a(::memfd_create("x", MFD_CLOEXEC)), b(::memfd_create("x", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(a.get(), 64 << 20), 0);
  ASSERT_EQ(::ftruncate(b.get(), 64 << 20), 0);
  ASSERT_TRUE(transport::offerLane(unsealed.lanePath, unsealed.token, a, b));
  // 2. A good lane with a token that is no link's.
  RogueNode guesser(cluster.nodePort(), "rogue2");
  ASSERT_TRUE(transport::handOverLane(guesser.lanePath, transport::newLaneToken()));
  std::string log;
  ASSERT_TRUE(waitFor([&] {
    log = readFile(cluster.dir() + "/scheduler.log");
    return contains(log, "'rogue1' handed over a lane that cannot be used") && contains(log, "a token no link was offered");
  }, 5000)) << log;
  EXPECT_TRUE(contains(log, "not sealed against resizing")) << log;

  // 3. A good lane, taken; then a frame "in" it that lies past its end.
  RogueNode liar(cluster.nodePort(), "rogue3");
  auto lane = transport::handOverLane(liar.lanePath, liar.token);
  ASSERT_TRUE(lane) << lane.error().message;
  ASSERT_EQ(liar.awaitControl(wire::SchedulerMessage::LANE_ACCEPTED), "yes") << cluster.logs();
  std::byte frame[transport::kHeaderBytes + transport::kLaneDescriptorBytes];
  transport::encodeHeader({transport::kLaneFrameChannel, transport::kLaneDescriptorBytes, 1}, frame);
  transport::putLe<uint32_t>(frame + transport::kHeaderBytes, 1);
  transport::putLe<uint32_t>(frame + transport::kHeaderBytes + 4, 1 << 20);
  transport::putLe<uint64_t>(frame + transport::kHeaderBytes + 8, lane->up->size() - 4096);
  ASSERT_TRUE(liar.link.sendRaw(frame, sizeof frame));
  ASSERT_TRUE(waitFor([&] {
    log = readFile(cluster.dir() + "/scheduler.log");
    return contains(log, "broke the same-host lane's rules") && contains(log, "'rogue3' lost");
  }, 5000)) << log;
  EXPECT_FALSE(contains(log, "'rogue1' lost")) << "a refused lane ends nothing:\n" << log;

  std::string why;
  EXPECT_TRUE(intact(*tenant, kept, &why)) << why << "\n" << cluster.logs();
  Kept more = keep(*tenant, 4 << 20, 6);
  EXPECT_TRUE(intact(*tenant, more, &why)) << why;
  EXPECT_TRUE(cluster.scheduler().running());
  // The honest netaccel's big frames went through its lane, both ways (16 MiB written
  // and read back twice: 1 MiB frames).
  const std::string metrics = rawhttp::roundTrip(cluster.httpPort(), "GET /metrics HTTP/1.0\r\n\r\n");
  std::smatch to, from;
  ASSERT_TRUE(std::regex_search(metrics, to, std::regex(R"(raccel_node_lane_frames_total\{node="node0",direction="to"\} (\d+))")))
      << metrics;
  ASSERT_TRUE(std::regex_search(metrics, from, std::regex(R"(raccel_node_lane_frames_total\{node="node0",direction="from"\} (\d+))")));
  EXPECT_GE(std::stoul(to[1]), 32u);
  EXPECT_GE(std::stoul(from[1]), 32u);
}

// ---- 2. Checked arithmetic on guest shapes ------------------------------------------

TEST(Attacks, ATensorOpWithAZeroDimensionAndOverflowingStridesCannotHarmTheNetaccel) {
  Cluster cluster({VmSpec{"vm1", 4}, VmSpec{"vm2", 4}});
  Process& node = cluster.addNetaccel("node0", {"kind=gpu,model=sim,tflops=8,memory=256MiB"}, 8);
  auto victim = open(cluster.vmSocket("vm1"), 4, "victim"), attacker = open(cluster.vmSocket("vm2"), 4, "attacker");
  ASSERT_TRUE(victim && attacker);
  Kept kept = keep(*victim, 1 << 12, 3);
  auto buffer = attacker->alloc(64);
  const uint64_t huge = uint64_t{1} << 62;
  client::TensorOp op;
  op.fn = client::TensorFn::add;
  op.shape = {0, uint64_t{1} << 40, 3, 7};
  op.operands = {{buffer, huge, {huge, huge, huge, 3}}, {buffer, ~uint64_t{0}, {huge, ~uint64_t{0}, 5, huge}},
                 {buffer, 1, {1, huge, huge, huge}}};
  attacker->tensor(op);  // a zero in the shape: nothing to run, and nothing computed from the rest
  EXPECT_TRUE(attacker->fence());
  op.shape[0] = 2;  // now every number counts: refused, naming the reach
  attacker->tensor(op);
  auto refused = attacker->fence();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::invalidArgument) << refused.error().message;
  EXPECT_TRUE(contains(refused.error().message, "reaches element")) << refused.error().message;
  std::string why;
  EXPECT_TRUE(intact(*victim, kept, &why)) << why;
  EXPECT_TRUE(node.running()) << cluster.logs();
  attacker->writeFloats(buffer, {1, 2, 3});  // the attacker's session goes on too
  auto back = attacker->readFloats(buffer, 3);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, (std::vector<float>{1, 2, 3}));
}

// ---- 3. Bounded work ----------------------------------------------------------------

// A card of 0.004 TFLOPS (4 blocks of 0.001): an hour of it is 1.44e13 operations, a fill
// of that many elements through a stride-0 view of one float. Slices of 0.25 ms of the
// card's rating (a million elements: a few ms of real work, tens under the sanitizers),
// so that the window holds hundreds of slices and the share is measured, not the
// granularity.
class BoundedWork : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster = std::make_unique<Cluster>(std::vector<VmSpec>{VmSpec{"big", 0.004}, VmSpec{"hog", 0.004}}, "",
                                        std::vector<std::string>{"--block-tflops", "0.001"});
    node = &cluster->addNetaccel("node0", {"kind=gpu,tflops=0.004,memory=256MiB,threads=1"}, 4,
                                 {"--max-op-seconds", "7200", "--slice-ms", "0.25"});
  }
  // Queues `count` fills, each worth `seconds` of the card, on a buffer of `s`.
  static void queueFills(Session& s, client::Handle buffer, int count, double seconds) {
    client::TensorOp fill;
    fill.fn = client::TensorFn::fill;
    fill.alpha = 1.5f;
    fill.shape = {uint64_t(seconds * 0.004e12)};
    fill.operands = {{buffer, 0, {0}}};
    for (int i = 0; i < count; ++i) s.tensor(fill);
    ASSERT_TRUE(s.flush());
  }
  static double kernelMs(const std::string& json, const std::string& program) {
    auto at = json.find("\"program\":\"" + program + "\"");
    auto k = json.find("\"kernelMs\":", at);
    return at == std::string::npos || k == std::string::npos ? -1.0 : std::atof(json.c_str() + k + 11);
  }
  std::unique_ptr<Cluster> cluster;
  Process* node = nullptr;
};

TEST_F(BoundedWork, AnOpWorthMoreThanMaxOpSecondsIsRefusedNamingTheCeiling) {
  auto s = open(cluster->vmSocket("hog"), 0.001, "hog");
  ASSERT_TRUE(s);
  auto one = s->alloc(4);
  client::TensorOp fill;  // 2^48 elements through a stride-0 view of a 4-byte buffer
  fill.fn = client::TensorFn::fill;
  fill.shape = {uint64_t{1} << 48};
  fill.operands = {{one, 0, {0}}};
  s->tensor(fill);
  auto refused = s->fence();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, Code::resourceExhausted) << refused.error().message;
  EXPECT_TRUE(contains(refused.error().message, "max_op_seconds")) << refused.error().message;
  EXPECT_TRUE(contains(refused.error().message, "over the 7200 s one op may take")) << refused.error().message;
  s->writeFloats(one, {7});
  auto back = s->readFloats(one, 1);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ((*back)[0], 7.0f);
}

TEST_F(BoundedWork, HourLongOpsShareTheirCardByBlocksAndStopWithTheirSession) {
  auto big = open(cluster->vmSocket("big"), 0.003, "big");
  auto hog = open(cluster->vmSocket("hog"), 0.001, "hog");
  ASSERT_TRUE(big && hog);
  auto bigBuffer = big->alloc(4), hogBuffer = hog->alloc(4);
  ASSERT_TRUE(big->fence() && hog->fence());
  queueFills(*hog, hogBuffer, 3, 3600);  // three hours of the whole card
  queueFills(*big, bigBuffer, 2, 3600);
  // Both keep the card busy from here on: its own account of their kernel time. A slice
  // is charged as long as it took, so on a busy machine one stretched by the card's
  // thread losing its core shows as a lump that the other tenant is paid back for only
  // after it: near a window's end that skews the window's ratio by up to the lump. The
  // window grows (from the same start, up to three times) until the ratio holds: the
  // edge's share shrinks with the window, a share that is not fair does not.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::string first = cluster->console("vaccels"), last;
  double ratio = 0;
  for (int window = 1; window <= 3 && std::fabs(ratio - 3.0) > 0.15; ++window) {
    std::this_thread::sleep_for(std::chrono::milliseconds(6000));
    last = cluster->console("vaccels");
    const double dBig = kernelMs(last, "big") - kernelMs(first, "big");
    const double dHog = kernelMs(last, "hog") - kernelMs(first, "hog");
    ASSERT_GT(dHog, 0) << first << last;
    ratio = dBig / dHog;
    std::cout << "device time big:hog over " << 6 * window << " s = " << dBig << " : " << dHog << " ms = " << ratio
              << " (target 3 within 5%)\n";
  }
  RecordProperty("device_time_ratio", std::to_string(ratio));
  EXPECT_NEAR(ratio, 3.0, 0.15) << first << "\n" << last;

  // The hog's session ends: its queued fills and the one running are cancelled between
  // two slices (the close does not wait behind them), and the card is big's alone.
  hog.reset();
  std::string log;
  const std::regex cancelled("card 0: context [0-9]+ closed; cancelled [0-9]+ queued instruction\\(s\\) and the op of "
                             "instruction #[0-9]+ after slice [0-9]+ of 14400000");
  for (int i = 0; i < 400 && !std::regex_search(log, cancelled); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = readFile(node->log());
  }
  EXPECT_TRUE(std::regex_search(log, cancelled)) << log;
  // big's small op, sent now, runs after its own running slice, not after hours of the hog's.
  std::string vaccels = cluster->waitConsole("vaccels", [](auto& j) { return !contains(j, "\"program\":\"hog\""); });
  EXPECT_FALSE(contains(vaccels, "\"program\":\"hog\"")) << vaccels;
  EXPECT_TRUE(node->running()) << cluster->logs();
}

// ---- 4, 5: OpenCL source and launches on a sandboxed PoCL card ----------------------

class SandboxedOpencl : public ::testing::Test {
 protected:
  void SetUp() override {
    auto report = hal::discover("opencl");
    if (report.devices.empty()) GTEST_SKIP() << "no OpenCL device: " << report.note;
    cluster = std::make_unique<Cluster>(std::vector<VmSpec>{VmSpec{"vm1", 4}, VmSpec{"vm2", 4}});
    node = &cluster->addNetaccel("node0", {"backend=opencl,kind=gpu,tflops=8,memory=512MiB"}, 8);
  }
  // The working folder of the sandbox serving `vm` (from the netaccel's log and /proc).
  std::string sandboxDir(const std::string& vm) {
    std::regex line("card 0: tenant '" + vm + "' is served by sandbox process ([0-9]+)");
    std::smatch m;
    std::string log = readFile(node->log());
    if (!std::regex_search(log, m, line)) return "";
    std::error_code ec;
    return std::filesystem::read_symlink("/proc/" + m[1].str() + "/cwd", ec).string();
  }
  std::unique_ptr<Cluster> cluster;
  Process* node = nullptr;
};

const std::string kScale =
    "__kernel void scale(__global float* x, float s) { size_t i = get_global_id(0); x[i] = x[i] * s; }\n";

TEST_F(SandboxedOpencl, KernelSourceCannotIncludeTheHostsFiles) {
  // Another tenant compiles first: its compiler cache is in its sandbox's folder.
  auto other = open(cluster->vmSocket("vm2"), 4, "other");
  ASSERT_TRUE(other);
  auto otherProgram = other->loadProgram(ProgramKind::openclC, "scale", std::as_bytes(std::span(kScale)));
  ASSERT_TRUE(other->describeProgram(otherProgram)) << cluster->logs();
  std::string otherCache;
  for (auto it = std::filesystem::recursive_directory_iterator(sandboxDir("vm2"), std::filesystem::directory_options::skip_permission_denied);
       it != std::filesystem::recursive_directory_iterator(); ++it)
    if (it->is_regular_file()) otherCache = it->path().string();
  ASSERT_FALSE(otherCache.empty()) << "no file in the other tenant's sandbox folder";
  const std::string nodeKey = certDir() + "/node0.key";

  auto s = open(cluster->vmSocket("vm1"), 4, "prober");
  ASSERT_TRUE(s);
  Kept kept = keep(*s, 256, 4);
  for (const std::string& path : {std::string("/etc/passwd"), nodeKey, otherCache}) {
    const std::string source = "#include \"" + path + "\"\n" + kScale;
    s->loadProgram(ProgramKind::openclC, "probe", std::as_bytes(std::span(source)));
    auto built = s->fence();  // the failed build is the load's error, with the compiler's log
    ASSERT_FALSE(built) << path << " was included";
    const std::string& log = built.error().message;
    std::cout << "#include \"" << path << "\": " << log.substr(0, 400) << "\n";
    // The compiler could not open it: nothing of it was parsed, so no diagnostic reports on
    // its lines (an opened file shows as "error: PATH:1:1: ..." even without its text).
    EXPECT_TRUE(contains(log, "cannot open file '" + path + "'")) << log;
    EXPECT_FALSE(contains(log, path + ":1:")) << log;
    EXPECT_FALSE(contains(log, "root:")) << log;
    EXPECT_FALSE(contains(log, "PRIVATE KEY")) << log;
  }
  // The tenant's session and sandbox carry on, and so does the other tenant.
  std::string why;
  EXPECT_TRUE(intact(*s, kept, &why)) << why;
  auto p = s->loadProgram(ProgramKind::openclC, "scale", std::as_bytes(std::span(kScale)));
  EXPECT_TRUE(s->describeProgram(p)) << cluster->logs();
  EXPECT_TRUE(other->fence());
}

TEST_F(SandboxedOpencl, LaunchFieldsBeyondTheCardAreClearErrorsAndTheSandboxLives) {
  auto s = open(cluster->vmSocket("vm1"), 4, "launcher");
  ASSERT_TRUE(s);
  Kept kept = keep(*s, 64, 5);
  const std::string source = "__kernel void k(__global float* x, __local float* scratch) { scratch[0] = x[0]; }\n";
  auto p = s->loadProgram(ProgramKind::openclC, "k", std::as_bytes(std::span(source)));
  ASSERT_TRUE(s->describeProgram(p));
  const std::string sandboxBefore = sandboxDir("vm1");
  struct Case {
    std::vector<uint64_t> global, local;
    std::vector<Arg> args;
    std::string says;
  };
  std::vector<Case> cases = {
      {{64}, {64}, {Arg::buffer(kept.handle), Arg::local(0xFFFFFFFFu)}, "bytes of local (shared) memory asked; this card has"},
      {{64}, {1u << 20}, {Arg::buffer(kept.handle), Arg::local(64)}, "work-groups (blocks) of 1048576 items; this card runs at most"},
      {{64}, {64}, {Arg::subBuffer(kept.handle, 256), Arg::local(64)}, "is past the end of a 256-byte buffer"},
  };
  for (auto& c : cases) {
    s->launchRange(p, "k", c.global, c.local, {}, c.args);
    auto e = s->fence();
    ASSERT_FALSE(e) << c.says;
    EXPECT_EQ(e.error().code, Code::invalidArgument) << e.error().message;
    EXPECT_TRUE(contains(e.error().message, c.says)) << e.error().message;
  }
  std::string why;
  EXPECT_TRUE(intact(*s, kept, &why)) << why;  // no sandbox was lost on the way
  EXPECT_EQ(sandboxDir("vm1"), sandboxBefore);
  EXPECT_FALSE(contains(readFile(node->log()), "are lost")) << readFile(node->log());
}

// ---- 6. Console fairness ------------------------------------------------------------

TEST(Attacks, HeldEventStreamsNeverLockOutTheConsole) {
  Cluster cluster;
  cluster.addNetaccel("node0", {"kind=gpu,model=sim,tflops=4,memory=256MiB"}, 4);
  // A local user opens as many event streams as the server lets it, and holds them.
  std::vector<int> streams;
  int refused = 0;
  for (int i = 0; i < 24; ++i) {
    int fd = rawhttp::connectTo(cluster.httpPort());
    ASSERT_GE(fd, 0);
    rawhttp::sendAll(fd, "GET /api/events HTTP/1.1\r\nHost: t\r\n\r\n");
    std::string head = rawhttp::receive(fd, 3000, "\r\n\r\n");
    if (contains(head, "200 OK")) {
      streams.push_back(fd);
    } else {
      EXPECT_TRUE(contains(head, "429") || contains(head, "503")) << head;
      ++refused;
      ::close(fd);
    }
  }
  EXPECT_LE(streams.size(), 4u);
  EXPECT_GT(refused, 0);
  // Everything else still answers, from the same address.
  for (const char* path : {"/api/nodes", "/api/vaccels", "/metrics", "/"}) {
    for (int i = 0; i < 3; ++i) {
      int fd = rawhttp::connectTo(cluster.httpPort());
      ASSERT_GE(fd, 0);
      rawhttp::sendAll(fd, std::string("GET ") + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
      std::string reply = rawhttp::receive(fd, 5000);
      EXPECT_TRUE(contains(reply, "200 OK")) << path << ": " << reply.substr(0, 200);
      ::close(fd);
    }
  }
  for (int fd : streams) ::close(fd);
}

}  // namespace
}  // namespace raccel::testing
