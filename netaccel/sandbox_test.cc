// The hal conformance suite through a sandbox process (raccel-sandbox): every OpenCL
// and CUDA device found here, served by a real sandbox over its socket and shared-memory
// window, must behave exactly as the device does in process. Then what only a sandbox
// can do: die, hang, or be refused, and say so.
#include "netaccel/sandbox.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <thread>

#include "hal/backends.h"
#include "hal/conformance.h"

namespace raccel::hal {

namespace {
netaccel::SandboxSettings settings(unsigned timeoutMs = 60000) {
  netaccel::SandboxSettings s;
  s.executable = std::string(RACCEL_BIN_DIR) + "/raccel-sandbox";
  s.dir = ::testing::TempDir() + "raccel-sandbox-test";
  s.warm = 0;
  s.callTimeoutMs = timeoutMs;
  s.hostMemoryBytes = 8ull << 30;
  return s;
}

// A device of `backend` as its sandbox serves it (capabilities as discovered, 64 MiB).
Result<std::unique_ptr<Device>> sandboxed(const std::string& backend, unsigned index, unsigned timeoutMs = 60000) {
  auto local = openDevice(backend, index, {.tflops = 1, .memoryBytes = 64 << 20});
  if (!local) return fail(local.error());
  Capabilities caps = (*local)->capabilities();
  local->reset();  // the sandbox opens its own
  netaccel::SandboxPool pool(caps, settings(timeoutMs), "test card");
  return pool.take();
}
}  // namespace

std::vector<Backend> conformanceBackends() {
  std::vector<Backend> out;
  for (auto [backend, sample] : {std::pair{"opencl", openclSample()}, std::pair{"cuda", cudaSample()}})
    for (auto& d : discover(backend).devices) {
      unsigned index = d.index;
      std::string name = backend;
      out.push_back({"sandboxed_" + name + std::to_string(index), [=] { return sandboxed(name, index); }, sample});
    }
  return out;
}

namespace {

bool haveOpencl() { return !discover("opencl").devices.empty(); }

// Sets `path`'s time (not following a link) `hours` back.
bool age(const std::string& path, long hours) {
  const time_t then = ::time(nullptr) - hours * 3600;
  const struct timespec when[2] = {{then, 0}, {then, 0}};
  return ::utimensat(AT_FDCWD, path.c_str(), when, AT_SYMLINK_NOFOLLOW) == 0;
}
// How many hours ago `path` was written (or marked used); -1 if it is not there.
long hoursSince(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? (::time(nullptr) - st.st_mtime) / 3600 : -1;
}

TEST(Sandbox, ADeadSandboxIsLostAndEveryCallSaysHowItEnded) {
  if (!haveOpencl()) GTEST_SKIP() << "no OpenCL device";
  auto d = sandboxed("opencl", 0);
  ASSERT_TRUE(d) << d.error().message;
  auto b = (*d)->allocate(4096);
  ASSERT_TRUE(b) << b.error().message;
  pid_t pid = netaccel::SandboxPool::pidOf(**d);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  std::vector<std::byte> out(16);
  auto r = (*d)->read(**b, 0, out);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("killed by signal 9"), std::string::npos) << r.error().message;
  EXPECT_NE((*d)->lost().find("killed by signal 9"), std::string::npos) << (*d)->lost();
  auto again = (*d)->allocate(16);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().message, (*d)->lost());
  (*d)->release(std::move(*b));  // releasing into a lost sandbox is harmless
}

TEST(Sandbox, AKernelThatNeverEndsIsStoppedAtTheCallTimeout) {
  if (!haveOpencl()) GTEST_SKIP() << "no OpenCL device";
  // The timeout covers every call, the kernel's compile too: PoCL compiling in a cold
  // cache under AddressSanitizer on a busy 2-core machine has taken over 1.5 s.
  auto d = sandboxed("opencl", 0, 6000);
  ASSERT_TRUE(d) << d.error().message;
  std::string source = "__kernel void spin(volatile __global int* x) { while (x[0] == 0) { x[1] += 1; } }";
  auto p = (*d)->loadProgram(ProgramKind::openclC, "spin", std::as_bytes(std::span(source)));
  ASSERT_TRUE(p) << p.error().message;
  auto b = (*d)->allocate(64);
  ASSERT_TRUE(b);
  KernelArg arg{KernelArg::Type::buffer, b->get(), {}};
  auto launched = (*d)->launch(**p, "spin", {}, std::span(&arg, 1));
  auto finished = launched ? (*d)->finish() : launched;  // one of them waits for the kernel
  ASSERT_FALSE(finished);
  EXPECT_NE(finished.error().message.find("answered nothing for 6000 ms"), std::string::npos) << finished.error().message;
  EXPECT_FALSE((*d)->lost().empty());
}

TEST(Sandbox, ACardItCannotOpenIsReportedOnEveryCall) {
  Capabilities caps;
  caps.backend = "opencl";
  caps.deviceIndex = 999;  // no such device
  caps.memoryBytes = 1 << 20;
  caps.tflops = 1;
  netaccel::SandboxPool pool(caps, settings(), "test card");
  auto d = pool.take();
  auto b = d->allocate(16);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("the sandbox could not open the card"), std::string::npos) << b.error().message;
  EXPECT_NE(b.error().message.find("999"), std::string::npos) << b.error().message;
}

TEST(Sandbox, ItsAllocationCapIsItsTenantsShare) {
  if (!haveOpencl()) GTEST_SKIP() << "no OpenCL device";
  auto d = sandboxed("opencl", 0);
  ASSERT_TRUE(d) << d.error().message;
  (*d)->setMemoryCap(1 << 20);
  auto fits = (*d)->allocate(512 << 10);
  ASSERT_TRUE(fits) << fits.error().message;
  auto over = (*d)->allocate(768 << 10);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, Code::resourceExhausted);
  EXPECT_NE(over.error().message.find("share"), std::string::npos) << over.error().message;
}

// A sandbox taken over by its guest (hostile-sandbox) answers badly; each way ends
// with that device lost or its calls failing, never with the netaccel's side trusting
// what it said.
std::unique_ptr<Device> hostile(const std::string& mode, unsigned timeoutMs = 3000) {
  ::setenv("RACCEL_HOSTILE", mode.c_str(), 1);
  Capabilities caps;
  caps.backend = "opencl";
  caps.memoryBytes = 64 << 20;
  caps.tflops = 1;
  caps.programKinds = {ProgramKind::builtin, ProgramKind::openclC};
  auto s = settings(timeoutMs);
  s.executable = std::string(RACCEL_BIN_DIR) + "/hostile-sandbox";
  netaccel::SandboxPool pool(caps, s, "test card");
  auto d = pool.take();
  ::unsetenv("RACCEL_HOSTILE");
  return d;
}

// Every kernel a sandboxed card completes is reported once, with its tag, whether the
// worker collects it or waits for it: the times a wait brings back are kept for the next
// collection, not dropped (they are each tenant's device time, the fair share's measure).
TEST(Sandbox, EveryCompletedKernelIsReportedOnceWaitedForOrNot) {
  for (const char* backend : {"opencl", "cuda"}) {
    if (discover(backend).devices.empty()) continue;
    auto d = sandboxed(backend, 0);
    ASSERT_TRUE(d) << backend << ": " << d.error().message;
    ASSERT_TRUE((*d)->timesKernels()) << backend;
    const uint32_t n = 128;
    auto a = (*d)->allocate(n * n * 4), b = (*d)->allocate(n * n * 4), c = (*d)->allocate(n * n * 4);
    ASSERT_TRUE(a && b && c) << backend;
    const uint64_t kernels = 12;
    for (uint64_t tag = 1; tag <= kernels; ++tag) {
      (*d)->tagKernels(tag);
      ASSERT_TRUE((*d)->gemm({n, n, n, 1, 0, a->get(), b->get(), c->get()})) << backend;
    }
    std::vector<KernelTime> done;
    for (int i = 0; i < 1000 && done.size() < kernels; ++i) {
      (*d)->waitCompleted(100);
      (*d)->takeCompleted(done);
    }
    std::vector<uint64_t> tags;
    for (auto& k : done) tags.push_back(k.tag);
    std::sort(tags.begin(), tags.end());
    std::vector<uint64_t> want(kernels);
    std::iota(want.begin(), want.end(), 1);
    EXPECT_EQ(tags, want) << backend;
    (*d)->release(std::move(*a)), (*d)->release(std::move(*b)), (*d)->release(std::move(*c));
  }
}

// A read ahead (the card worker's read of a large buffer, piece by piece) gives every
// piece exactly, however the buffer's size falls into pieces; one left part-way ends
// cleanly: a write, a read elsewhere and a new read ahead after it see the buffer as it
// is, not a half the sandbox was still filling.
TEST(Sandbox, AReadAheadGivesEveryPieceExactlyAndEndsCleanlyWhereverItIsLeft) {
  if (!haveOpencl()) GTEST_SKIP() << "no OpenCL device";
  auto d = sandboxed("opencl", 0);
  ASSERT_TRUE(d) << d.error().message;
  const uint64_t piece = 1 << 20, size = 5 * piece + 4099;
  auto b = (*d)->allocate(size);
  ASSERT_TRUE(b) << b.error().message;
  std::vector<std::byte> data(size);
  for (uint64_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>(i * 7 + i / 4096);
  ASSERT_TRUE((*d)->write(**b, 0, data));
  auto readPieces = [&](uint64_t from, uint64_t length, uint64_t stopAfter) {
    (*d)->readAhead(**b, from, length, piece);
    for (uint64_t done = 0, k = 0; done < length && k < stopAfter; ++k) {
      const uint64_t n = std::min(piece, length - done);
      std::vector<std::byte> out(n);
      auto r = (*d)->read(**b, from + done, out);
      ASSERT_TRUE(r) << r.error().message;
      ASSERT_EQ(0, std::memcmp(out.data(), data.data() + from + done, n)) << "piece at " << from + done;
      done += n;
    }
  };
  readPieces(0, size, ~0ull);
  readPieces(12345, size - 12345, ~0ull);
  readPieces(0, size, 1);  // left with pieces in both halves
  std::vector<std::byte> changed(3 * piece, std::byte{0x5a});
  ASSERT_TRUE((*d)->write(**b, piece, changed));
  std::memcpy(data.data() + piece, changed.data(), changed.size());
  readPieces(0, size, 2);
  std::vector<std::byte> elsewhere(100);  // a read that is not the next piece
  ASSERT_TRUE((*d)->read(**b, 3 * piece + 17, elsewhere));
  EXPECT_EQ(0, std::memcmp(elsewhere.data(), data.data() + 3 * piece + 17, 100));
  readPieces(0, size, ~0ull);
  ASSERT_TRUE((*d)->finish());
  (*d)->release(std::move(*b));
}

// A sandbox is started ahead of its tenant (the warm pool) and builds raccel's tensor
// kernels meanwhile, so that its tenant's first tensor op does not wait for that compile:
// once it is ready, before any tensor op, its compiler's cache holds two programs, the
// built-in kernels and the tensor kernels. (PoCL's cache: a folder per program, with
// its program.bc.)
TEST(Sandbox, ItBuildsTheTensorKernelsBeforeItsTenantAsksForOne) {
  if (!haveOpencl()) GTEST_SKIP() << "no OpenCL device";
  auto d = sandboxed("opencl", 0);
  ASSERT_TRUE(d) << d.error().message;
  ASSERT_TRUE((*d)->finish());  // its first message came: the card is open and prepared
  const std::string dir = settings().dir + "/" + std::to_string(::getpid()) + "-";
  size_t programs = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(settings().dir))
    if (e.path().filename() == "program.bc" && e.path().string().rfind(dir, 0) == 0) ++programs;
  EXPECT_EQ(programs, 2u) << "in " << settings().dir;
}

// The kernel template (kernel_template.h): the pool's first sandbox starts its builder,
// which compiles every tensor kernel at each work-group size into a folder of its own and
// then moves it into place whole; a sandbox started after that gets a copy of its own
// (never a link a tenant could write through), and its ops need no compile.
TEST(Sandbox, ANewSandboxGetsItsOwnCopyOfTheKernelTemplate) {
  if (!haveOpencl()) GTEST_SKIP() << "no OpenCL device";
  auto local = openDevice("opencl", 0, {.tflops = 1, .memoryBytes = 64 << 20});
  ASSERT_TRUE(local) << local.error().message;
  Capabilities caps = (*local)->capabilities();
  local->reset();
  netaccel::SandboxSettings s = settings();
  s.dir = ::testing::TempDir() + "raccel-template-test-" + std::to_string(::getpid());
  std::filesystem::remove_all(s.dir);
  // A template another kernel source left a week ago: the pool removes it as it opens.
  const std::string stale = s.dir + "/kernel-template/opencl0-0123456789abcdef";
  std::filesystem::create_directories(stale + "/pocl-cache");
  ::chmod(s.dir.c_str(), 0700);
  ::chmod((s.dir + "/kernel-template").c_str(), 0700);
  ASSERT_TRUE(age(stale, 8 * 24));
  netaccel::SandboxPool pool(caps, s, "test card");
  EXPECT_FALSE(std::filesystem::exists(stale)) << "a template unused for a week was kept";
  auto first = pool.take();  // starts the builder
  ASSERT_TRUE(first->finish());
  netaccel::KernelTemplate made(s.dir + "/kernel-template",
                                netaccel::KernelTemplate::nameFor("opencl", 0, caps.model, caps.driverVersion));
  EXPECT_FALSE(caps.driverVersion.empty()) << "the template's name must change with the driver";
  for (int i = 0; i < 3000 && !made.ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(made.ready()) << "no template after 5 minutes in " << s.dir;
  std::vector<std::filesystem::path> built;
  for (auto& e : std::filesystem::recursive_directory_iterator(made.path()))
    if (e.path().extension() == ".so") built.push_back(e.path());
  ASSERT_GT(built.size(), 50u) << "kernels compiled per work-group size in " << made.path();

  ASSERT_TRUE(age(made.path(), 8 * 24));
  auto second = pool.take();
  ASSERT_TRUE(second->finish());
  EXPECT_EQ(hoursSince(made.path()), 0) << "its use did not mark the template used";
  unsigned newest = 0;  // its folder, <pid>-<serial>: the later of the two
  for (auto& e : std::filesystem::directory_iterator(s.dir))
    if (std::string n = e.path().filename().string(); n.rfind(std::to_string(::getpid()) + "-", 0) == 0)
      newest = std::max<unsigned>(newest, std::stoul(n.substr(n.find('-') + 1)));
  const std::string cache = s.dir + "/" + std::to_string(::getpid()) + "-" + std::to_string(newest) + "/pocl-cache";
  for (auto& so : built) {
    const auto copy = cache + so.string().substr(made.path().size());
    struct stat a {}, b {};
    ASSERT_EQ(::stat(so.c_str(), &a), 0);
    ASSERT_EQ(::stat(copy.c_str(), &b), 0) << copy << " was not copied";
    EXPECT_NE(a.st_ino, b.st_ino) << copy << " is a link to the template";
    EXPECT_EQ(b.st_nlink, 1u) << copy;
  }
  // And it computes with them: a tensor op's answer read back.
  auto x = second->allocate(64);
  ASSERT_TRUE(x) << x.error().message;
  ASSERT_TRUE(second->fill(**x, 0, 64, 0));
  TensorOp op;
  op.fn = TensorFn::fill;
  op.shape[0] = 16;
  op.alpha = 2.5f;
  op.operands[0].buffer = x->get();
  op.operands[0].strides[0] = 1;
  auto done = second->tensor(op);
  ASSERT_TRUE(done) << done.error().message;
  std::vector<float> got(16);
  ASSERT_TRUE(second->read(**x, 0, std::as_writable_bytes(std::span(got))));
  for (float v : got) EXPECT_EQ(v, 2.5f);
  std::filesystem::remove_all(s.dir);
}

// A sandbox_dir of a test's own (top) with its kernel-template folder, both 0700, and a
// template named in it; removed at the end.
struct TemplateFolder {
  explicit TemplateFolder(const std::string& test)
      : top(::testing::TempDir() + "raccel-template-" + test + "-" + std::to_string(::getpid())),
        root(top + "/kernel-template"),
        t(root, "opencl0-test") {
    std::filesystem::remove_all(top);
    made = ::mkdir(top.c_str(), 0700) == 0 && ::mkdir(root.c_str(), 0700) == 0;
  }
  ~TemplateFolder() { std::filesystem::remove_all(top); }
  std::string top, root;
  netaccel::KernelTemplate t;
  bool made = false;
};
// Whether `path` appears within 6 s (a builder started in the background leaves it).
bool appears(const std::string& path) {
  for (int i = 0; i < 300 && !std::filesystem::exists(path); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return std::filesystem::exists(path);
}

// A template is code every tenant runs: one in a folder that another user could have
// written (group- or world-writable, at any level within sandbox_dir) is not used, and
// no builder is started there.
TEST(Sandbox, AKernelTemplateOthersCouldWriteIsNotUsed) {
  TemplateFolder f("trust");
  ASSERT_TRUE(f.made);
  const std::string &top = f.top, &root = f.root;
  netaccel::KernelTemplate& t = f.t;
  ASSERT_EQ(::mkdir(t.path().c_str(), 0700), 0);
  EXPECT_TRUE(t.ready());
  for (const std::string& dir : {top, root, t.path()}) {
    for (mode_t loose : {0770, 0707}) {
      ASSERT_EQ(::chmod(dir.c_str(), loose), 0);
      EXPECT_FALSE(t.ready()) << dir << " mode " << std::oct << loose;
    }
    ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  }
  EXPECT_TRUE(t.ready());
  // Nor is one built there: the builder (here a program that would leave a mark) never starts.
  std::filesystem::remove_all(t.path());
  ASSERT_EQ(::chmod(root.c_str(), 0777), 0);
  t.build({"/bin/sh", "-c", "touch " + top + "/ran"});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(std::filesystem::exists(top + "/ran"));
  EXPECT_FALSE(std::filesystem::exists(t.path() + ".building"));
  ASSERT_EQ(::chmod(root.c_str(), 0700), 0);  // and the same call where it is ours alone does start it
  t.build({"/bin/sh", "-c", "touch " + top + "/ran"});
  EXPECT_TRUE(appears(top + "/ran"));
}

// A builder that died (its pid gone) left its folder: the next netaccel takes it over
// with what it had compiled; and a builder that fails is not started again by the same
// netaccel at each new sandbox. (The builder here is a shell that reports what it finds
// in its folder, then fails.)
TEST(Sandbox, ADeadBuildersCacheIsKeptAndAFailedBuildIsNotRepeated) {
  TemplateFolder f("resume");
  ASSERT_TRUE(f.made);
  const std::string& top = f.top;
  netaccel::KernelTemplate& t = f.t;
  const std::string building = t.path() + ".building";
  std::filesystem::create_directories(building + "/pocl-cache");
  std::ofstream(building + "/pocl-cache/compiled-before") << "x";
  pid_t dead = ::fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  std::ofstream(building + "/pid") << dead << "\n";
  const std::vector<std::string> builder = {
      "/bin/sh", "-c", "d=${0#--workdir=}; test -f $d/pocl-cache/compiled-before && echo kept >> " + top + "/runs; exit 1"};
  t.build(builder);
  ASSERT_TRUE(appears(top + "/runs"));
  for (int i = 0; i < 100; ++i) {  // as a netaccel starting sandbox after sandbox: it is reaped, then none runs
    t.build(builder);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream runs(top + "/runs");
  std::string all((std::istreambuf_iterator<char>(runs)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "kept\n") << "the builder ran with the dead one's cache once, and only once";
  EXPECT_FALSE(t.ready());
}

// A builder that is alive is left alone; but a pid written more than half an hour ago
// is not trusted to be the builder still (pids are reused): its folder is taken over.
TEST(Sandbox, ALiveBuilderIsLeftAloneUntilItsPidIsHalfAnHourOld) {
  TemplateFolder f("stale");
  ASSERT_TRUE(f.made);
  const std::string& top = f.top;
  netaccel::KernelTemplate& t = f.t;
  const std::string building = t.path() + ".building";
  ASSERT_EQ(::mkdir(building.c_str(), 0700), 0);
  std::ofstream(building + "/pid") << ::getpid() << "\n";  // alive: this test
  const std::vector<std::string> builder = {"/bin/sh", "-c", "touch " + top + "/ran"};
  t.build(builder);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(std::filesystem::exists(top + "/ran")) << "a live builder's folder was taken";
  std::filesystem::last_write_time(building + "/pid",
                                   std::filesystem::file_time_type::clock::now() - std::chrono::minutes(31));
  t.build(builder);
  EXPECT_TRUE(appears(top + "/ran")) << "a pid half an hour old still held the folder";
}

// A builder writes only its own folder and marks its cache complete there last: the
// first to look for the template then moves that cache into place, and not before.
TEST(Sandbox, ACompletedBuildBecomesTheTemplateWhenNextLookedFor) {
  TemplateFolder f("publish");
  ASSERT_TRUE(f.made);
  const std::string building = f.t.path() + ".building";
  std::filesystem::create_directories(building + "/pocl-cache/kernel");
  std::ofstream(building + "/pocl-cache/kernel/k.so") << "x";
  std::ofstream(building + "/pid") << ::getpid() << "\n";
  EXPECT_FALSE(f.t.ready()) << "a build not marked complete was taken";
  ASSERT_EQ(::mkdir((building + "/complete").c_str(), 0700), 0);
  EXPECT_FALSE(f.t.ready()) << "a folder is not the builder's mark";
  ASSERT_EQ(::rmdir((building + "/complete").c_str()), 0);
  std::ofstream(building + "/complete") << "142\n";
  EXPECT_TRUE(f.t.ready());
  EXPECT_TRUE(std::filesystem::exists(f.t.path() + "/kernel/k.so"));
  EXPECT_FALSE(std::filesystem::exists(building));
  EXPECT_TRUE(netaccel::KernelTemplate(f.root, "opencl0-test").ready()) << "and it stays the template for everyone";
}

// What no netaccel has used for a week goes: other templates, their logs, dead builders'
// folders, a link (not what it points to). This card's own entries stay, however old,
// and so do a recent template, a live builder's folder and one just marked used.
TEST(Sandbox, WhatNoNetaccelUsedForAWeekIsRemovedFromTheTemplates) {
  TemplateFolder f("prune");
  ASSERT_TRUE(f.made);
  const std::string &top = f.top, &root = f.root;
  const auto dir = [&](const std::string& name) {
    std::filesystem::create_directories(root + "/" + name + "/pocl-cache");
    std::ofstream(root + "/" + name + "/pocl-cache/k.so") << "x";
  };
  for (const char* d : {"opencl0-test", "opencl1-old", "opencl2-recent", "opencl3-used", "opencl5-dead.building",
                        "opencl6-live.building", "opencl0-test.building"})
    dir(d);
  for (const char* log : {"opencl0-test.log", "opencl1-old.log"}) std::ofstream(root + "/" + log) << "log";
  std::ofstream(root + "/opencl6-live.building/pid") << ::getpid() << "\n";
  ASSERT_EQ(::mkdir((top + "/outside").c_str(), 0700), 0);
  ASSERT_EQ(::symlink((top + "/outside").c_str(), (root + "/opencl4-link").c_str()), 0);
  std::vector<std::string> old;
  for (auto& e : std::filesystem::directory_iterator(root))
    if (e.path().filename() != "opencl2-recent") old.push_back(e.path().string());
  for (auto& p : old) ASSERT_TRUE(age(p, 8 * 24)) << p;
  ASSERT_TRUE(age(root + "/opencl2-recent", 6 * 24));
  netaccel::KernelTemplate(root, "opencl3-used").markUsed();

  f.t.prune();
  std::set<std::string> left;
  for (auto& e : std::filesystem::directory_iterator(root)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"opencl0-test", "opencl0-test.building", "opencl0-test.log", "opencl2-recent",
                                         "opencl3-used", "opencl6-live.building"}));
  EXPECT_TRUE(std::filesystem::exists(top + "/outside")) << "a link's target was removed";
  // Where another user could write, nothing is touched.
  ASSERT_TRUE(age(root + "/opencl2-recent", 8 * 24));
  ASSERT_EQ(::chmod(root.c_str(), 0770), 0);
  f.t.prune();
  EXPECT_TRUE(std::filesystem::exists(root + "/opencl2-recent"));
  ASSERT_EQ(::chmod(root.c_str(), 0700), 0);
  f.t.prune();
  EXPECT_FALSE(std::filesystem::exists(root + "/opencl2-recent"));
}

TEST(HostileSandbox, OneThatNeverSpeaksIsStoppedAtTheTimeout) {
  auto d = hostile("silent", 800);
  auto b = d->allocate(64);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("answered nothing for 800 ms"), std::string::npos) << b.error().message;
}

TEST(HostileSandbox, OneThatAnswersPastItsWindowIsStopped) {
  auto d = hostile("oversize");
  auto b = d->allocate(64);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("broke its protocol"), std::string::npos) << b.error().message;
  EXPECT_FALSE(d->lost().empty());
}

TEST(HostileSandbox, AShortReadIsRefusedNotPaddedWithOldBytes) {
  auto d = hostile("shortread");
  auto b = d->allocate(1 << 20);
  ASSERT_TRUE(b) << b.error().message;
  std::vector<std::byte> out(1 << 20);
  auto r = d->read(**b, 0, out);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("for a read of"), std::string::npos) << r.error().message;
  d->release(std::move(*b));
}

// The same when the reads were posted ahead: the short piece is caught when its reply
// comes, and the device is lost.
TEST(HostileSandbox, AShortPieceOfAReadAheadIsRefused) {
  auto d = hostile("shortread");
  auto b = d->allocate(4 << 20);
  ASSERT_TRUE(b) << b.error().message;
  d->readAhead(**b, 0, 4 << 20, 1 << 20);
  std::vector<std::byte> out(1 << 20);
  auto r = d->read(**b, 0, out);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("for a read of"), std::string::npos) << r.error().message;
  EXPECT_FALSE(d->lost().empty());
}

TEST(HostileSandbox, ItCannotShrinkTheSharedWindowUnderTheNetaccel) {
  auto d = hostile("shrink");
  auto b = d->allocate(4 << 20);
  ASSERT_TRUE(b) << b.error().message;
  std::vector<std::byte> data(4 << 20, std::byte{7});
  // Every byte of the window is touched here: a shrunk window would be SIGBUS.
  EXPECT_TRUE(d->write(**b, 0, data));
  EXPECT_TRUE(d->read(**b, 0, data));
  d->release(std::move(*b));
}

TEST(HostileSandbox, APostedWriteThatFailsLosesTheDeviceAtTheNextCall) {
  auto d = hostile("failwrite");
  auto b = d->allocate(64);
  ASSERT_TRUE(b) << b.error().message;
  std::vector<std::byte> data(64);
  EXPECT_TRUE(d->write(**b, 0, data));  // posted: its reply is read by the next call
  auto r = d->read(**b, 0, data);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("a write the sandbox had taken failed: nope"), std::string::npos) << r.error().message;
  EXPECT_FALSE(d->lost().empty());
  d->release(std::move(*b));
}

// A sandbox's word that its card went away makes the loss not its work's doing (the
// scheduler rebuilds the tenant, and bounds how often); any other value is its work's.
TEST(HostileSandbox, OnlyTheCardsLossCodeMakesALossNotItsOwn) {
  for (const char* mode : {"cardgone", "lostodd"}) {
    auto d = hostile(mode);
    auto b = d->allocate(64);
    ASSERT_TRUE(b) << b.error().message;
    std::vector<std::byte> out(64);
    auto r = d->read(**b, 0, out);
    ASSERT_FALSE(r) << mode;
    EXPECT_FALSE(d->lost().empty()) << mode;
    const bool card = std::string(mode) == "cardgone";
    EXPECT_EQ(d->lostFromOutside(), card) << mode;
    EXPECT_NE(r.error().message.find(card ? "its card went away under it: gone" : "the kernel faulted: gone"), std::string::npos)
        << mode << ": " << r.error().message;
    d->release(std::move(*b));
  }
}

TEST(HostileSandbox, AnExtraReplyIsCaughtByItsSerialAndStopsTheSandbox) {
  auto d = hostile("extra");
  auto b = d->allocate(64);  // answered twice: the second answers nothing that was asked
  ASSERT_TRUE(b) << b.error().message;
  std::vector<std::byte> out(64);
  auto r = d->read(**b, 0, out);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("broke its protocol (a reply to request 1 where 2 was due)"), std::string::npos)
      << r.error().message;
  EXPECT_FALSE(d->lost().empty());
  d->release(std::move(*b));
}

// Plugged, posted requests wait in the netaccel until their run goes as one message: a
// reply to one of them before it was sent answers work the sandbox never got.
TEST(HostileSandbox, AReplyToARequestNotYetSentStopsTheSandbox) {
  auto d = hostile("ahead");
  ASSERT_TRUE(d->timesKernels());
  auto b = d->allocate(64);  // request 1; its reply, and one to request 2, which is not made yet
  ASSERT_TRUE(b) << b.error().message;
  d->plug();
  EXPECT_TRUE(d->fill(**b, 0, 64, 1));  // request 2, posted and held
  std::vector<hal::KernelTime> times;
  for (int i = 0; i < 10000 && d->lost().empty(); ++i) {  // up to 10 s for the replies to come
    d->takeCompleted(times);                             // reads those that have
    if (d->lost().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_NE(d->lost().find("broke its protocol (a reply to request 2, which it was not sent)"), std::string::npos) << d->lost();
  d->unplug();
  d->release(std::move(*b));
}

// Replies may come several to a message, but only whole ones, and no more than the
// netaccel reads at once (a longer message is not cut short and read as if whole).
// A call (here a fence) made while a run of posted requests waits in the outbox goes in
// the same message, behind them: the run and the call cost one round trip. (The sandbox
// here says, in the fence's reply, how many requests came before it in its message.)
TEST(Sandbox, ACallGoesInTheSameMessageAsThePostedRunBeforeIt) {
  auto d = hostile("batched");
  ASSERT_TRUE(d->timesKernels());
  auto b = d->allocate(64);
  ASSERT_TRUE(b) << b.error().message;
  d->plug();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(d->fill(**b, 0, 64, static_cast<uint8_t>(i)));
  auto fenced = d->finish();
  ASSERT_FALSE(fenced);
  EXPECT_EQ(fenced.error().message, "after 3");
  d->unplug();
  auto alone = d->finish();  // nothing posted: the fence alone
  ASSERT_FALSE(alone);
  EXPECT_EQ(alone.error().message, "after 0");
  EXPECT_TRUE(d->lost().empty()) << d->lost();
  d->release(std::move(*b));
}

// Posted requests fail in runs, their replies sent together: each failure keeps its own
// message (they travel with their replies, not in one place in the window that the next
// failure would write over before the netaccel read it).
TEST(Sandbox, EachPostedFailureInARunKeepsItsOwnMessage) {
  auto d = hostile("failfills");
  ASSERT_TRUE(d->timesKernels());
  auto b = d->allocate(64);
  ASSERT_TRUE(b) << b.error().message;
  d->plug();
  for (uint64_t tag = 1; tag <= 5; ++tag) {
    d->tagKernels(tag);
    EXPECT_TRUE(d->fill(**b, 0, 64, 1));
  }
  d->unplug();
  EXPECT_TRUE(d->finish());
  auto errors = d->takeDeferredErrors();
  ASSERT_EQ(errors.size(), 5u);
  for (auto& e : errors) EXPECT_EQ(e.error.message, "the fill of tag " + std::to_string(e.tag) + " failed");
  EXPECT_TRUE(d->lost().empty()) << d->lost();
  d->release(std::move(*b));
}

TEST(HostileSandbox, AnErrorMessageShorterThanItsReplySaysStopsTheSandbox) {
  auto d = hostile("lying");
  auto b = d->allocate(64);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("broke its protocol (a reply message of"), std::string::npos) << b.error().message;
  EXPECT_FALSE(d->lost().empty());
}

TEST(HostileSandbox, AReplyMessageOfPartOrTooManyRepliesStopsTheSandbox) {
  for (const char* mode : {"ragged", "burst"}) {
    auto d = hostile(mode);
    auto b = d->allocate(64);
    ASSERT_FALSE(b) << mode;
    EXPECT_NE(b.error().message.find("broke its protocol (a reply message of"), std::string::npos) << b.error().message;
    EXPECT_FALSE(d->lost().empty()) << mode;
  }
}

// Posted work (a card that times its kernels): the call returns at once; a failure the
// sandbox reports later names the call by its kernel tag, and the device carries on.
TEST(HostileSandbox, APostedOpThatFailsIsReportedWithItsTagAndTheDeviceCarriesOn) {
  auto d = hostile("failop");
  ASSERT_TRUE(d->timesKernels());
  auto a = d->allocate(64), b = d->allocate(64), c = d->allocate(64);
  ASSERT_TRUE(a && b && c);
  d->tagKernels(77);
  EXPECT_TRUE(d->gemm({4, 4, 1, 1, 0, a->get(), b->get(), c->get()}));  // posted: nothing known yet
  d->tagKernels(78);
  EXPECT_TRUE(d->fill(**c, 0, 64, 1));
  EXPECT_TRUE(d->finish());  // waits for every posted reply
  auto failed = d->takeDeferredErrors();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].tag, 77u);
  EXPECT_EQ(failed[0].error.message, "nope");
  EXPECT_TRUE(d->takeDeferredErrors().empty()) << "reported twice";
  EXPECT_TRUE(d->lost().empty());
  d->release(std::move(*a)), d->release(std::move(*b)), d->release(std::move(*c));
}

TEST(HostileSandbox, ACompletionRingClaimingMoreThanItHoldsStopsTheSandbox) {
  auto d = hostile("overrun");
  auto b = d->allocate(64);
  ASSERT_TRUE(b) << b.error().message;
  std::vector<KernelTime> times;
  EXPECT_EQ(d->takeCompleted(times), 0u);
  EXPECT_TRUE(times.empty());
  EXPECT_NE(d->lost().find("broke its protocol (a completion ring of 4097 entries"), std::string::npos) << d->lost();
  d->release(std::move(*b));
}

// Confined as for a tenant (raccel-sandbox --probe-read/--probe-write): an allow-list.
// The driver's and compiler's files can be read, what the operator adds (--read) too;
// the node's key, /etc and everything else cannot, and nothing outside its own folder
// can be written.
TEST(Sandbox, ItReadsOnlyItsDriversFilesAndWritesOnlyItsFolder) {
  namespace fs = std::filesystem;
  fs::path base = fs::path(::testing::TempDir()) / ("raccel-probe-" + std::to_string(::getpid()));
  fs::create_directories(base / "secrets");
  fs::create_directories(base / "work");
  fs::create_directories(base / "models");
  { std::ofstream(base / "secrets" / "node.key") << "-----BEGIN PRIVATE KEY-----\n"; }
  { std::ofstream(base / "models" / "weights.bin") << "public\n"; }
  auto probe = [&](const std::string& args, int* status) {
    // Quoted: the build's path may hold spaces (the probe paths here hold none).
    std::string command = "'" + std::string(RACCEL_BIN_DIR) + "/raccel-sandbox' --workdir '" + (base / "work").string() +
                          "' --read '" + (base / "models").string() + "' " + args + " 2>&1";
    FILE* p = ::popen(command.c_str(), "r");
    std::string out;
    char buf[512];
    while (p && std::fgets(buf, sizeof buf, p)) out += buf;
    int rc = p ? ::pclose(p) : -1;
    *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    return out;
  };
  int status = 0;
  std::string out;
  for (std::string denied : {(base / "secrets" / "node.key").string(), std::string("/etc/passwd"), std::string("/etc/hostname"),
                             std::string("/proc/1/environ")}) {
    out = probe("--probe-read " + denied, &status);
    if (out.find("Landlock is not available") != std::string::npos) GTEST_SKIP() << out;
    EXPECT_EQ(status, 3) << out;
    EXPECT_NE(out.find("read " + denied + ": "), std::string::npos) << out;
    EXPECT_EQ(out.find("allowed"), std::string::npos) << out;
  }
  out = probe("--probe-read " + (base / "models" / "weights.bin").string() +
                  " --probe-read /usr/include/stdio.h --probe-read /etc/ld.so.cache --probe-write " +
                  (base / "work" / "scratch").string(),
              &status);
  EXPECT_EQ(status, 0) << out;
  out = probe("--probe-write " + (base / "planted").string(), &status);
  EXPECT_EQ(status, 3) << out;
  EXPECT_FALSE(fs::exists(base / "planted"));
  // The kernel template's builder is confined the same way once it has opened its card.
  if (haveOpencl()) {
    const std::string builder = "--precompile --backend=opencl --device=0 ";
    out = probe(builder + "--probe-write " + (base / "planted").string() + " --probe-read " +
                    (base / "secrets" / "node.key").string(),
                &status);
    EXPECT_EQ(status, 3) << out;
    EXPECT_EQ(out.find("allowed"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(base / "planted"));
    out = probe(builder + "--probe-write " + (base / "work" / "built").string() + " --probe-read /usr/include/stdio.h",
                &status);
    EXPECT_EQ(status, 0) << out;
  }
  std::error_code ec;
  fs::remove_all(base, ec);
}

}  // namespace
}  // namespace raccel::hal
