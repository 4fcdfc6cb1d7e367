// The trust boundaries, tried as an attacker would, with real processes: guests that
// send what decodes badly or numbers out of range, strangers on the node port with no
// certificate or another node's, registrations with absurd cards and forged contexts,
// and floods of idle connections. In every case the daemon keeps running, the other
// tenant's results are exact, and the error names what was wrong.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <thread>

#include <capnp/any.h>

#include "schema/guest.capnp.h"
#include "schema/node.capnp.h"
#include "tests/cluster.h"
#include "transport/blocking_link.h"
#include "transport/wire_types.h"
#include "vmfrontend/raccel.h"

namespace raccel::testing {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::unique_ptr<client::Session> open(const std::string& socket, double tflops, const std::string& name,
                                      unsigned admitWaitMs = 0) {
  auto s = openSession(socket, tflops, name, admitWaitMs);
  EXPECT_TRUE(s) << s.error().message;
  return s ? std::move(*s) : nullptr;
}

// A buffer of `count` random floats written through `s` and fenced: what a victim keeps.
struct Stored {
  client::Handle handle = 0;
  std::vector<float> values;
};
Stored store(client::Session& s, size_t count, unsigned seed) {
  Stored out{0, randomFloats(count, seed)};
  out.handle = s.alloc(out.values.size() * 4);
  s.writeFloats(out.handle, out.values);
  EXPECT_TRUE(s.fence());
  return out;
}

// Writes `values` to a new buffer of `s`, reads them back, and says whether they match.
bool roundTrip(client::Session& s, unsigned seed) {
  auto values = randomFloats(4096, seed);
  auto h = s.alloc(values.size() * 4);
  s.writeFloats(h, values);
  auto back = s.readFloats(h, values.size());
  s.free(h);
  return back && *back == values;
}

// A hello on `channel` with the fields a test sets.
void sendHello(transport::BlockingLink& link, uint32_t channel, double tflops, int priority, const std::string& program,
               unsigned admitWaitMs = 0) {
  capnp::MallocMessageBuilder m;
  auto h = m.initRoot<wire::Instruction>().initHello();
  h.setVersionMajor(wire::PROTOCOL_MAJOR);
  h.setTflops(tflops);
  h.setPriority(priority);
  h.setProgram(program);
  h.setAdmitWaitMs(admitWaitMs);
  ASSERT_TRUE(link.sendNow(channel, 1, m));
}

// Speaks to the node port over mutual TLS with `node`'s certificate, sends `frame` and
// waits `ms`: a stranger's client (Debian's openssl s_client), not our netaccel.
std::string tlsSend(const Cluster& cluster, const std::string& node, const std::vector<std::byte>& frame, int ms = 1500) {
  auto args = netaccelTlsArgs(node);
  std::string file = cluster.dir() + "/frame-" + node + ".bin";
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(frame.data()), frame.size());
  return runCommand("(cat " + sh(file) + "; sleep " + std::to_string(ms / 1000.0) +
                    ") | timeout 10 openssl s_client -quiet -no_ign_eof -connect 127.0.0.1:" + std::to_string(cluster.nodePort()) +
                    " -CAfile " + sh(args[1]) + " -cert " + sh(args[3]) + " -key " + sh(args[5]) + " >/dev/null");
}

long rssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

class Trust : public ::testing::Test {
 protected:
  void SetUp() override {
    VmSpec vm;
    vm.tflops = 8;
    cluster = std::make_unique<Cluster>(std::vector<VmSpec>{vm});
    nodePid = cluster->addNetaccel("node0", {"kind=gpu,model=sim,tflops=4,memory=512MiB"}, 4).pid();
    guestd = cluster->startGuestd();
  }
  void TearDown() override {
    EXPECT_TRUE(cluster->scheduler().running()) << "the scheduler died:\n" << cluster->logs();
    if (HasFailure()) std::cerr << cluster->logs();
  }
  // `e` is invalidArgument naming `words`; then a new program of `tflops` runs exactly.
  void expectRefusedAndOthersRun(const Error& e, const std::string& words, double tflops, unsigned seed) {
    EXPECT_EQ(e.code, Code::invalidArgument) << e.message;
    EXPECT_TRUE(contains(e.message, words)) << e.message;
    auto after = open(guestd, tflops, "after");
    ASSERT_TRUE(after);
    EXPECT_TRUE(roundTrip(*after, seed));
  }
  std::unique_ptr<Cluster> cluster;
  pid_t nodePid = 0;
  std::string guestd;
};

TEST_F(Trust, ANetaccelWithoutAPoolCertificateIsRefusedAtTheHandshakeAndGetsNoGuestData) {
  // A certificate of another CA, and plain TCP: neither completes the handshake.
  std::string rogue = cluster->dir() + "/rogue";
  runCommand("bash " + sourcePath("scripts/raccel-certs.sh") + " all " + sh(rogue) + " node9");
  std::string port = "127.0.0.1:" + std::to_string(cluster->nodePort());
  Process other("raccel-netaccel",
                {"--scheduler", port, "--discover", "none", "--card", "kind=gpu,tflops=64,memory=1GiB", "--http-listen", "off", "--tls-ca",
                 rogue + "/ca.pem", "--tls-cert", rogue + "/node9.pem", "--tls-key", rogue + "/node9.key"},
                cluster->dir() + "/rogue.log");
  Process plain("raccel-netaccel",
                {"--name", "plain", "--scheduler", port, "--discover", "none", "--card", "kind=gpu,tflops=64", "--insecure",
                 "--http-listen", "off"},
                cluster->dir() + "/plain.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(cluster->poolTotal(), 4u) << cluster->console("nodes");
  std::string log = readFile(cluster->dir() + "/scheduler.log");
  EXPECT_TRUE(contains(log, "TLS handshake with")) << log;
  EXPECT_FALSE(contains(readFile(other.log()), "registered with the scheduler")) << readFile(other.log());
  EXPECT_FALSE(contains(readFile(plain.log()), "registered with the scheduler")) << readFile(plain.log());
  // A program too large for node0 alone is never placed on them: it is refused.
  transport::BlockingLink raw;
  ASSERT_TRUE(raw.connectUnix(guestd));
  sendHello(raw, 1, 8, 0, "big");
  Error e = expectErrorReply(raw, 1);
  EXPECT_EQ(e.code, Code::resourceExhausted) << e.message;
  auto fine = open(guestd, 4, "fine");
  ASSERT_TRUE(fine);
  EXPECT_TRUE(roundTrip(*fine, 1));
}

TEST_F(Trust, ACertificateForOneNodeCannotRegisterAsAnotherOrWithAbsurdCards) {
  auto victim = open(guestd, 4, "victim");
  ASSERT_TRUE(victim);
  auto [h, values] = store(*victim, 1 << 16, 7);

  tlsSend(*cluster, "intruder", registration("node0", 4));
  tlsSend(*cluster, "big1", registration("", 1e30));
  tlsSend(*cluster, "big2", registration("", std::nan("")));
  tlsSend(*cluster, "big3", registration("", 4294967296.0 + 16));
  // A host that would overflow what vaccels hold of it.
  tlsSend(*cluster, "big4", registration("", 4, 0, 1, ~uint64_t{0}, 8));
  std::string log;
  for (int i = 0; i < 100 && !(contains(log, "(got 4.29497e+09)") && contains(log, "host resources out of range")); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = readFile(cluster->dir() + "/scheduler.log");
  }
  EXPECT_TRUE(contains(log, "certificate is for node 'intruder', but it registered as 'node0'")) << log;
  EXPECT_TRUE(contains(log, "card 0 tflops must be a finite number from 0 to 65536 (got 1e+30)")) << log;
  EXPECT_TRUE(contains(log, "nan)")) << log;
  EXPECT_TRUE(contains(log, "(got 4.29497e+09)")) << log;
  EXPECT_TRUE(contains(log, "host resources out of range: 18446744073709551615 milli-CPU and 8 MiB")) << log;
  EXPECT_EQ(cluster->poolTotal(), 4u) << cluster->console("nodes");
  std::string nodes = cluster->console("nodes");
  EXPECT_TRUE(contains(nodes, "\"name\":\"node0\"") && contains(nodes, "\"online\":true")) << nodes;
  EXPECT_EQ(nodes.find("\"name\"", nodes.find("\"name\"") + 1), std::string::npos) << "one node only: " << nodes;

  // The victim's buffer is intact and still its own.
  auto back = victim->readFloats(h, values.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, values);
}

TEST_F(Trust, KeptContextsANetaccelMakesUpAreClosedAndNeverMoveTheIdsOthersGet) {
  auto victim = open(guestd, 2, "victim");
  ASSERT_TRUE(victim);
  auto [h, values] = store(*victim, 1 << 14, 11);
  // A genuine certificate, a made-up context at the top of the id space: it is not the
  // scheduler's, so it is closed, and the next contexts on node0 do not wrap onto the
  // victim's.
  tlsSend(*cluster, "n3", registration("n3", 2, UINT32_MAX, 70000));  // a tiny message, 70,000 made-up contexts
  tlsSend(*cluster, "n2", registration("n2", 2, UINT32_MAX), 2000);
  std::string log = readFile(cluster->dir() + "/scheduler.log");
  EXPECT_TRUE(contains(log, "at most 1024 cards and 65536 kept contexts (got 1 and 70000)")) << log;
  for (int i = 0; i < 3; ++i) {
    auto other = open(guestd, 2, "other" + std::to_string(i));
    ASSERT_TRUE(other);
    other->forceNextHandle(h);  // the same handle number as the victim's buffer
    auto mine = other->alloc(values.size() * 4);
    EXPECT_EQ(mine, h);
    auto zeros = other->readFloats(mine, values.size());
    ASSERT_TRUE(zeros) << zeros.error().message;
    EXPECT_EQ(*zeros, std::vector<float>(values.size(), 0.0f)) << "another tenant's bytes leaked";
    other->fill(mine, 0, values.size() * 4, 0x7f);
    ASSERT_TRUE(other->fence());
  }
  auto back = victim->readFloats(h, values.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, values);
}

// A card fault as a netaccel reports it (NodeMessage.fault).
std::vector<std::byte> fault(uint32_t card, std::vector<uint32_t> contexts, const std::string& message) {
  capnp::MallocMessageBuilder m;
  auto f = m.initRoot<wire::NodeMessage>().initFault();
  f.setCard(card);
  auto list = f.initContexts(static_cast<unsigned>(contexts.size()));
  for (size_t i = 0; i < contexts.size(); ++i) list.set(static_cast<unsigned>(i), contexts[i]);
  f.setMessage(message);
  std::vector<std::byte> out;
  transport::appendFrame(out, transport::kControlChannel, 0, m);
  return out;
}

TEST_F(Trust, CardFaultsANetaccelMakesUpTouchNoOneElsesBuffersAndAreClipped) {
  auto victim = open(guestd, 2, "victim");
  ASSERT_TRUE(victim);
  auto [h, values] = store(*victim, 1 << 12, 21);
  std::string vmsBefore = cluster->console("vms");
  // Registered with a genuine certificate, n5 claims faults: before registering, for
  // contexts it never held (the victim's id on node0 among them), and with a 1 MiB message.
  auto frames = fault(0, {1}, "before registering");
  for (auto part : {registration("n5", 2), fault(0, {1, 2, 3, 4, 5}, "made-up contexts"),
                    fault(7, {}, std::string(1 << 20, 'x')), fault(0, {1}, "a context of another node's number")})
    frames.insert(frames.end(), part.begin(), part.end());
  tlsSend(*cluster, "n5", frames);
  std::string events = cluster->ctl({"events", "--recent", "--json"});
  EXPECT_FALSE(contains(events, "before registering")) << events;
  EXPECT_FALSE(contains(events, "made-up contexts")) << events;
  EXPECT_FALSE(contains(events, std::string(4096, 'x'))) << "an unclipped message was kept";
  // The victim's buffer, its accounting and its VM's are untouched: what a fault would
  // change (state, problem, blocks, memory), not the kernel time its own work adds.
  auto accounting = [](std::string vms) { return std::regex_replace(vms, std::regex("\"kernelMs\":[0-9]+"), ""); };
  EXPECT_EQ(accounting(cluster->console("vms")), accounting(vmsBefore));
  auto back = victim->readFloats(h, values.size());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, values);
}

TEST_F(Trust, HelloNumbersAreCheckedAndHugeProgramNamesPinNothing) {
  transport::BlockingLink raw;  // straight to the VM's socket, as a hostile guest side would
  ASSERT_TRUE(raw.connectUnix(cluster->vmSocket()));
  sendHello(raw, 1, 4294967296.0 + 16, 0, "wrap");
  Error wrap = expectErrorReply(raw, 1);
  EXPECT_EQ(wrap.code, Code::invalidArgument) << wrap.message;
  EXPECT_TRUE(contains(wrap.message, "hello tflops must be a finite number from 0 to")) << wrap.message;
  sendHello(raw, 2, std::nan(""), 0, "nan");
  EXPECT_EQ(expectErrorReply(raw, 1).code, Code::invalidArgument);
  sendHello(raw, 3, 1, INT_MIN, "low");
  Error low = expectErrorReply(raw, 1);
  EXPECT_TRUE(contains(low.message, "hello priority must be from -1000 to 1000")) << low.message;
  sendHello(raw, 4, 1e-300, 0, "tiny");  // above 0: one block, as 0 is
  EXPECT_EQ(expectErrorReply(raw, 1).message, "welcomed");

  std::string huge(3 << 20, 'x');
  for (uint32_t ch = 10; ch < 30; ++ch) {
    sendHello(raw, ch, 1, 0, huge);
    Error e = expectErrorReply(raw, 1);
    ASSERT_EQ(e.code, Code::invalidArgument) << e.message;
    ASSERT_TRUE(contains(e.message, "at most 128")) << e.message;
  }
  int status = 0;
  std::string recent = cluster->ctl({"events", "--recent", "--json"}, &status);
  EXPECT_EQ(status, 0) << recent;
  EXPECT_LT(recent.size(), 64u * 1024) << "the event ring holds peers' text unclipped";
  auto fine = open(guestd, 1, "fine");
  ASSERT_TRUE(fine);
  EXPECT_TRUE(roundTrip(*fine, 3));
  // Zero-length transfers are legal and harmless.
  auto h = fine->alloc(64);
  fine->write(h, 0, {});
  std::vector<std::byte> none;
  EXPECT_TRUE(fine->read(h, 0, none));
  EXPECT_TRUE(fine->fence());
}

TEST_F(Trust, SetPolicyRefusesNumbersThatAreNotFiniteOrInRangeAndKeepsExactQuotas) {
  for (std::string bad : {"tflops=nan", "tflops=inf", "tflops=1e308", "priority=-2147483648", "memory_quota=18446744073709551616"}) {
    int status = 0;
    std::string out = cluster->ctl({"set-policy", "vm1", bad}, &status);
    EXPECT_NE(status, 0) << bad << ": " << out;
    EXPECT_TRUE(contains(out, bad.substr(0, bad.find('=')))) << "the error names the field: " << out;
  }
  for (int i = 0; i < 5; ++i) {
    int status = 0;
    std::string out = cluster->ctl({"set-policy", "vm1", "memory_quota=18446744073709551615"}, &status);
    ASSERT_EQ(status, 0) << out;
  }
  std::string vms = cluster->console("vms");
  EXPECT_TRUE(contains(vms, "\"memoryQuota\":18446744073709551615")) << vms;
  size_t first = vms.find("set by raccelctl");
  EXPECT_NE(first, std::string::npos) << vms;
  EXPECT_EQ(vms.find("set by raccelctl", first + 1), std::string::npos) << "the policy source grew: " << vms;
}

TEST_F(Trust, AnInstructionHeldBehindHelloThatFailsToDecodeEndsOnlyItsOwnSession) {
  auto holder = open(guestd, 4, "holder");  // every block: the next hello waits
  ASSERT_TRUE(holder);
  transport::BlockingLink raw;  // straight to the VM's socket: guestd would not pass the garbage on
  ASSERT_TRUE(raw.connectUnix(cluster->vmSocket()));
  sendHello(raw, 1, 1, 0, "pipelined", 20000);
  std::vector<std::byte> garbage(transport::kHeaderBytes + 64, std::byte{0xff});
  transport::encodeHeader({1, 64, 2}, garbage.data());
  ASSERT_TRUE(raw.sendRaw(garbage.data(), garbage.size()));
  capnp::MallocMessageBuilder fence;
  fence.initRoot<wire::Instruction>().setFence();
  ASSERT_TRUE(raw.sendNow(1, 3, fence));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  holder.reset();  // its blocks free: the waiting session is placed, its held garbage runs
  EXPECT_EQ(expectErrorReply(raw, 1).message, "welcomed");
  expectRefusedAndOthersRun(expectErrorReply(raw, 2), "malformed", 4, 5);
}

TEST_F(Trust, AGraphOpWithAnUnknownTagIsRefusedAndTheSchedulerCarriesOn) {
  transport::BlockingLink raw;
  ASSERT_TRUE(raw.connectUnix(cluster->vmSocket()));
  sendHello(raw, 1, 1, 0, "graph");
  ASSERT_EQ(expectErrorReply(raw, 1).message, "welcomed");
  capnp::MallocMessageBuilder alloc;
  auto a = alloc.initRoot<wire::Instruction>().initAlloc();
  a.setHandle(7);
  a.setSize(4096);
  ASSERT_TRUE(raw.sendNow(1, 2, alloc));
  capnp::MallocMessageBuilder graph;
  auto op = graph.initRoot<wire::Instruction>().initGraph().initNodes(1)[0].initOp();
  auto axpy = op.initAxpy();
  axpy.setN(16);
  axpy.setX(7);
  axpy.setY(7);
  // The op's union discriminant (its data section's first 16 bits) set to a tag no
  // schema version has: what an attacker's encoder, or a newer client, would send.
  capnp::AnyStruct::Builder(kj::mv(op)).getDataSection()[0] = 99;
  ASSERT_TRUE(raw.sendNow(1, 3, graph));
  expectRefusedAndOthersRun(expectErrorReply(raw, 3), "unknown built-in op (tag 99)", 1, 21);
}

TEST_F(Trust, TenThousandIdleConnectionsCostBoundedMemoryAndALegitimateProgramKeepsWorking) {
  rlimit fds{};
  getrlimit(RLIMIT_NOFILE, &fds);
  if (fds.rlim_max < 11000) GTEST_SKIP() << "needs 11000 file descriptors (hard limit " << fds.rlim_max << ")";
  fds.rlim_cur = fds.rlim_max;
  setrlimit(RLIMIT_NOFILE, &fds);
  {
    auto warm = open(guestd, 1, "warm");
    ASSERT_TRUE(warm);
    ASSERT_TRUE(roundTrip(*warm, 9));
  }
  pid_t pid = cluster->scheduler().pid();
  long before = rssKiB(pid);
  constexpr int kIdle = 10000;
  auto flood = [&](bool unix, long* peak) {
    std::vector<int> fds;
    for (int i = 0; i < kIdle; ++i) {
      int fd = ::socket(unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      int rc;
      if (unix) {
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, cluster->vmSocket().c_str(), sizeof a.sun_path - 1);
        rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      } else {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(cluster->nodePort()));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      }
      if (rc != 0 && errno != EINPROGRESS && errno != EAGAIN) {
        ::close(fd);
        continue;  // a full backlog refuses some: the scheduler is closing others
      }
      fds.push_back(fd);
      if (i % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    *peak = rssKiB(pid);
    // A legitimate program works while they are open.
    auto during = open(guestd, 2, unix ? "during-vm-flood" : "during-node-flood");
    EXPECT_TRUE(during && roundTrip(*during, 13));
    for (int fd : fds) ::close(fd);
    return fds.size();
  };
  long vmPeak = 0, nodePeak = 0;
  size_t vmOpened = flood(true, &vmPeak);
  size_t nodeOpened = flood(false, &nodePeak);
  long growthKiB = std::max(vmPeak, nodePeak) - before;
  std::cout << "scheduler RSS " << before / 1024 << " MiB; with " << vmOpened << " idle VM-socket connections "
            << vmPeak / 1024 << " MiB; with " << nodeOpened << " idle node-port connections " << nodePeak / 1024
            << " MiB (growth " << growthKiB / 1024 << " MiB, bound 64 MiB)\n";
  EXPECT_LT(growthKiB, 64 * 1024);
  auto after = open(guestd, 4, "after");
  ASSERT_TRUE(after);
  EXPECT_TRUE(roundTrip(*after, 17));
}

// A netaccel of an attacker's making that stays on the line: Debian's openssl s_client
// with `node`'s genuine certificate, its stdin and stdout one end of a socketpair that
// `link` speaks frames over.
class ForgedNetaccel {
 public:
  ForgedNetaccel(const Cluster& cluster, const std::string& node) {
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) throw std::runtime_error("socketpair failed");
    auto tls = netaccelTlsArgs(node);
    std::vector<std::string> args{"openssl", "s_client", "-quiet", "-connect",
                                  "127.0.0.1:" + std::to_string(cluster.nodePort()), "-CAfile", tls[1], "-cert", tls[3], "-key", tls[5]};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, ends[1], 0);
    posix_spawn_file_actions_adddup2(&actions, ends[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawn(&pid_, "/usr/bin/openssl", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(ends[1]);
    if (rc != 0) throw std::runtime_error("cannot start openssl s_client");
    link.adopt(ends[0]);
  }
  ~ForgedNetaccel() {
    link.close();
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  // The next frame that `want` accepts, heartbeating while it waits (as a live
  // netaccel does, so the scheduler keeps it).
  std::optional<transport::ReceivedFrame> await(const std::function<bool(transport::ReceivedFrame&)>& want) {
    for (int i = 0; i < 60; ++i) {
      auto f = link.receive(500);
      if (f && want(*f)) return std::move(*f);
      if (!f) {
        capnp::MallocMessageBuilder beat;
        beat.initRoot<wire::NodeMessage>().initHeartbeat();
        if (!link.sendNow(transport::kControlChannel, 0, beat)) return std::nullopt;
      }
    }
    return std::nullopt;
  }
  transport::BlockingLink link;

 private:
  pid_t pid_ = -1;
};

// What a guest receives next on `channel` (control frames skipped).
wire::Reply::Which nextReplyKind(transport::BlockingLink& link, uint32_t channel) {
  for (;;) {
    auto f = link.receive(15000);
    if (!f) throw std::runtime_error("no reply: " + f.error().message);
    if (f->header.channel != channel) continue;
    transport::MessageIn in(std::move(f->body));
    return in.root<wire::Reply>().which();
  }
}

TEST_F(Trust, ANetaccelCannotForgeTheSchedulersOwnAnswersToAGuest) {
  auto holder = open(guestd, 4, "holder");  // node0's every block: the next vaccel goes to the forger
  ASSERT_TRUE(holder);
  ForgedNetaccel forger(*cluster, "n6");
  auto reg = registration("n6", 2);
  ASSERT_TRUE(forger.link.sendRaw(reg.data(), reg.size()));
  auto schedulerSays = [](transport::ReceivedFrame& f, wire::SchedulerMessage::Which which, uint32_t* context = nullptr) {
    if (f.header.channel != transport::kControlChannel) return false;
    transport::MessageIn in(std::move(f.body));
    auto m = in.root<wire::SchedulerMessage>();
    if (m.which() != which) return false;
    if (context) *context = m.getOpenContext().getContext();
    return which != wire::SchedulerMessage::REGISTERED || m.getRegistered().getAccepted();
  };
  ASSERT_TRUE(forger.await([&](auto& f) { return schedulerSays(f, wire::SchedulerMessage::REGISTERED); }));
  transport::BlockingLink guest;  // straight to the VM's socket, to see each frame the scheduler sends
  ASSERT_TRUE(guest.connectUnix(cluster->vmSocket()));
  sendHello(guest, 1, 1, 0, "victim");
  ASSERT_EQ(expectErrorReply(guest, 1).message, "welcomed");
  uint32_t context = 0;
  ASSERT_TRUE(forger.await([&](auto& f) { return schedulerSays(f, wire::SchedulerMessage::OPEN_CONTEXT, &context); })) << "the victim's context never reached the forged netaccel\n" << cluster->logs();
  capnp::MallocMessageBuilder fence;
  fence.initRoot<wire::Instruction>().setFence();
  ASSERT_TRUE(guest.sendNow(1, 2, fence));
  ASSERT_TRUE(forger.await([&](transport::ReceivedFrame& f) { return f.header.channel == context && f.header.sequence == 2; }));
  // Its answer to the fence, with a welcome and a description of the vaccel made up first.
  capnp::MallocMessageBuilder welcome, vaccel, times, fenced;
  welcome.initRoot<wire::Reply>().initWelcome().setToken(4242);
  vaccel.initRoot<wire::Reply>().initVaccel();
  times.initRoot<wire::Reply>().initKernelTimes(1)[0].setSequence(2);
  fenced.initRoot<wire::Reply>().setFenced();
  for (auto* m : {&welcome, &vaccel, &times, &fenced}) ASSERT_TRUE(forger.link.sendNow(context, 2, *m));
  EXPECT_EQ(nextReplyKind(guest, 1), wire::Reply::KERNEL_TIMES);
  EXPECT_EQ(nextReplyKind(guest, 1), wire::Reply::FENCED);
  EXPECT_TRUE(contains(readFile(cluster->dir() + "/scheduler.log"), "sent a reply that only the scheduler may make"));
  EXPECT_TRUE(roundTrip(*holder, 23));  // the other tenant, on node0, carries on
}

TEST_F(Trust, AGuestThatAsksAndNeverReadsIsStoppedAtItsLinkAndLosesNoAnswer) {
  transport::BlockingLink guest;
  ASSERT_TRUE(guest.connectUnix(cluster->vmSocket()));
  sendHello(guest, 1, 1, 0, "never-reads");
  ASSERT_EQ(expectErrorReply(guest, 1).message, "welcomed");
  // describeVaccel, answered by the scheduler itself, as fast as the socket takes it.
  std::vector<std::byte> frames;
  size_t frameBytes = 0;
  constexpr uint64_t kCap = 1'000'000;
  for (uint64_t seq = 2; seq < 2 + kCap; ++seq) {
    capnp::MallocMessageBuilder m;
    m.initRoot<wire::Instruction>().setDescribeVaccel();
    transport::appendFrame(frames, 1, seq, m);
    if (seq == 2) frameBytes = frames.size();
  }
  ASSERT_EQ(frames.size(), frameBytes * kCap);
  int fd = guest.fd();
  size_t sent = 0;
  while (sent < frames.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 5000) == 0) break;  // five seconds without room: it stopped reading us
    ssize_t n = ::write(fd, frames.data() + sent, frames.size() - sent);
    if (n > 0) sent += static_cast<size_t>(n);
    else ASSERT_TRUE(errno == EAGAIN || errno == EINTR) << std::strerror(errno);
  }
  std::cout << "a guest that never reads wrote " << sent / frameBytes << " describeVaccel requests ("
            << sent / 1024 << " KiB) before the scheduler stopped reading it\n";
  ASSERT_LT(sent, frames.size()) << "the scheduler kept reading a guest that reads none of its answers";
  // Reading now, the guest gets every answer, once.
  size_t begun = (sent + frameBytes - 1) / frameBytes;
  ASSERT_TRUE(guest.sendRaw(frames.data() + sent, begun * frameBytes - sent));
  for (size_t i = 0; i < begun; ++i) {
    auto f = guest.receive(30000);
    ASSERT_TRUE(f) << "answer " << i << " of " << begun << ": " << f.error().message;
    ASSERT_EQ(f->header.sequence, 2 + i);
    transport::MessageIn in(std::move(f->body));
    ASSERT_EQ(in.root<wire::Reply>().which(), wire::Reply::VACCEL);
  }
  auto other = open(guestd, 2, "other");
  ASSERT_TRUE(other);
  EXPECT_TRUE(roundTrip(*other, 29));
}

// Reads answered by the card: each a few bytes to ask, each its buffer's size to answer.
// A guest that asks for a 64 MiB buffer 48 times over (3 GiB of answers) and reads none
// of them holds a bounded part of that anywhere: the scheduler stops reading the answers
// at the guest's link, and the netaccel stops making them at its own. Read afterwards,
// every answer arrives, in order and exact. Meanwhile, and after, another program on the
// same netaccel gets its own answers.
TEST_F(Trust, AGuestThatAsksForGibibytesOfReadsAndNeverReadsThemHoldsBoundedMemory) {
  const pid_t node = nodePid;
  transport::BlockingLink guest;
  ASSERT_TRUE(guest.connectUnix(cluster->vmSocket()));
  sendHello(guest, 1, 1, 0, "reads-never-read");
  ASSERT_EQ(expectErrorReply(guest, 1).message, "welcomed");
  constexpr uint64_t kBytes = 64 << 20, kReads = 48, kHandle = 5;
  auto send = [&](uint64_t seq, auto fill) {
    capnp::MallocMessageBuilder m;
    fill(m.initRoot<wire::Instruction>());
    ASSERT_TRUE(guest.sendNow(1, seq, m));
  };
  send(2, [&](wire::Instruction::Builder i) {
    auto a = i.initAlloc();
    a.setHandle(kHandle);
    a.setSize(kBytes);
  });
  send(3, [&](wire::Instruction::Builder i) {
    auto f = i.initFill();
    f.setBuffer(kHandle);
    f.setLength(kBytes);
    f.setValue(0x5a);
  });
  const pid_t scheduler = cluster->scheduler().pid();
  const long before = rssKiB(node), schedulerBefore = rssKiB(scheduler);
  for (uint64_t r = 0; r < kReads; ++r)
    send(4 + r, [&](wire::Instruction::Builder i) {
      auto rd = i.initRead();
      rd.setBuffer(kHandle);
      rd.setLength(kBytes);
    });
  // The card makes answers until something stops it: given time, none is left unmade.
  long peak = before, schedulerPeak = schedulerBefore;
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    peak = std::max(peak, rssKiB(node));
    schedulerPeak = std::max(schedulerPeak, rssKiB(scheduler));
  }
  std::cout << "RSS while " << kReads * kBytes / (1 << 20) << " MiB of reads went unread: the netaccel's " << before / 1024
            << " MiB before, at most " << peak / 1024 << " MiB; the scheduler's " << schedulerBefore / 1024 << " and "
            << schedulerPeak / 1024 << " MiB\n";
  EXPECT_LT(peak - before, 512 * 1024) << "the netaccel held half a GiB or more of answers nobody read";
  EXPECT_LT(schedulerPeak - schedulerBefore, 512 * 1024) << "the scheduler held half a GiB or more of answers nobody read";
  // Meanwhile another program's answers from the same netaccel keep coming: only the
  // guest that does not read waits.
  auto neighbour = open(guestd, 1, "neighbour");
  ASSERT_TRUE(neighbour);
  auto trip = std::async(std::launch::async, [&] { return roundTrip(*neighbour, 37); });
  ASSERT_EQ(trip.wait_for(std::chrono::seconds(120)), std::future_status::ready)
      << "another tenant of the netaccel waited for a guest that does not read its answers";
  EXPECT_TRUE(trip.get());
  neighbour.reset();
  // Reading now, the guest gets every answer, whole.
  for (uint64_t r = 0; r < kReads; ++r) {
    uint64_t got = 0;
    while (got < kBytes) {
      auto f = guest.receive(60000);
      ASSERT_TRUE(f) << "read " << r << " at " << got << ": " << f.error().message;
      ASSERT_EQ(f->header.sequence, 4 + r);
      transport::MessageIn in(std::move(f->body));
      auto reply = in.root<wire::Reply>();
      ASSERT_EQ(reply.which(), wire::Reply::DATA);
      auto data = reply.getData().getData();
      ASSERT_EQ(reply.getData().getOffset(), got);
      for (size_t k = 0; k < data.size(); k += 4093) ASSERT_EQ(data[k], 0x5a);
      got += data.size();
      ASSERT_EQ(reply.getData().getLast(), got == kBytes);
    }
  }
  auto other = open(guestd, 2, "other");
  ASSERT_TRUE(other);
  EXPECT_TRUE(roundTrip(*other, 31));
}

}  // namespace
}  // namespace raccel::testing
