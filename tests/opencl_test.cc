// Unmodified OpenCL programs against raccel through libraccel-opencl: Debian's clinfo,
// Debian's PyOpenCL and a plain C program linked only with -lOpenCL, found by the
// system's ICD loader (ocl-icd) through an .icd file, against a real scheduler, netaccel
// (PoCL's OpenCL device behind a sandbox) and raccel-guestd.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <sstream>
#include <thread>

#include "tests/cluster.h"
#include "vmfrontend/raccel.h"

namespace raccel {
namespace {

using testing::Cluster;
using testing::runCommand;
using testing::sh;
using testing::sourcePath;

// A scheduler, a netaccel serving PoCL's device and raccel-guestd.
class OpenclCard : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>();
    cluster_->addNetaccel("ocl", {"backend=opencl,device=0,tflops=4,memory=1GiB"}, 4);
    socket_ = cluster_->startGuestd();
  }
  // A libraccel session of program `name` on the guestd, with `timeoutMs` for replies.
  std::unique_ptr<client::Session> open(const std::string& name, int timeoutMs = 120000) {
    client::Options o;
    o.socket = socket_;
    o.program = name;
    o.timeoutMs = timeoutMs;
    auto opened = client::Session::open(o);
    EXPECT_TRUE(opened) << opened.error().message;
    return opened ? std::move(*opened) : nullptr;
  }
  std::unique_ptr<Cluster> cluster_;
  std::string socket_;
};

class OpenclIcd : public OpenclCard {
 protected:
  void SetUp() override {
    if (std::string(RACCEL_ICD_DIR).empty()) GTEST_SKIP() << "libraccel-opencl is not built here (no CL/cl_icd.h)";
    OpenclCard::SetUp();
  }
  // `command` with the loader pointed at raccel's .icd only, and the session's socket.
  std::string run(const std::string& command, int* status, const std::string& extraEnv = "") {
    return runCommand("OCL_ICD_VENDORS=" + sh(RACCEL_ICD_DIR) + " RACCEL_SOCKET=" + sh(socket_) +
                          " RACCEL_TFLOPS=2 " + extraEnv + " " + command + " 2>&1",
                      status);
  }
};

TEST_F(OpenclIcd, ClinfoListsTheRaccelPlatformAndItsDevice) {
  int status = -1;
  std::string out = run("clinfo", &status);
  if (out.find("not found") != std::string::npos && status == 127) GTEST_SKIP() << "no clinfo (apt-get install clinfo)";
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("Platform Name                                   raccel"), std::string::npos) << out;
  EXPECT_NE(out.find("Device Name                                     raccel vaccel #"), std::string::npos) << out;
  EXPECT_NE(out.find(" x2)"), std::string::npos) << out;  // RACCEL_TFLOPS=2: two blocks of the PoCL card
  EXPECT_NE(out.find("Compiler Available                              Yes"), std::string::npos) << out;
  EXPECT_NE(out.find("Global memory size                              1073741824"), std::string::npos) << out;
  // What the PoCL card has and raccel carries: fp64, the linker, images with the card's
  // own formats.
  EXPECT_NE(out.find("Double-precision Floating-point support         (cl_khr_fp64)"), std::string::npos) << out;
  EXPECT_NE(out.find("Linker Available                                Yes"), std::string::npos) << out;
  // Images as the card's own clinfo (local PoCL) gives them.
  std::string card = runCommand("OCL_ICD_VENDORS=/etc/OpenCL/vendors/pocl.icd POCL_CACHE_DIR=" + sh(cluster_->dir() + "/pocl") +
                                    " clinfo 2>&1",
                                &status);
  for (const char* what : {"Image support  ", "Max 2D image size", "Max 3D image size", "Max 1D or 2D image array size",
                           "Max number of read image args", "Max number of write image args"}) {
    auto at = card.find(what);
    if (status != 0 || at == std::string::npos) continue;  // no local PoCL to compare with
    std::string line = card.substr(at, card.find('\n', at) - at);
    EXPECT_NE(out.find(line), std::string::npos) << "the card says '" << line << "'\n" << out;
  }
  EXPECT_NE(out.find("Image support                                   Yes"), std::string::npos) << out;
  auto extensions = out.find("Device Extensions");
  ASSERT_NE(extensions, std::string::npos) << out;
  std::string line = out.substr(extensions, out.find('\n', extensions) - extensions);
  for (const char* e : {"cl_khr_fp64", "cl_khr_int64_base_atomics", "cl_khr_global_int32_base_atomics", "cl_khr_byte_addressable_store",
                        "cl_khr_3d_image_writes"})
    EXPECT_NE(line.find(e), std::string::npos) << e << " missing: " << line;
}

// The ICD's spin setting (RACCEL_SPIN_US, spin_us: how long clFinish's wait polls before
// it sleeps): 0 and the most give the device as ever; a value out of range gives no
// device, and the program is told why in the settings' words.
TEST_F(OpenclIcd, TheSpinSettingIsTakenAndABadOneIsNamedWhenTheDeviceIsMissing) {
  int status = -1;
  std::string out = run("clinfo", &status, "RACCEL_SPIN_US=0");
  if (out.find("not found") != std::string::npos && status == 127) GTEST_SKIP() << "no clinfo (apt-get install clinfo)";
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("Device Name                                     raccel vaccel #"), std::string::npos) << out;
  out = run("clinfo", &status, "RACCEL_SPIN_US=1000");
  EXPECT_NE(out.find("Device Name                                     raccel vaccel #"), std::string::npos) << out;
  out = run("clinfo", &status, "RACCEL_SPIN_US=5000");
  EXPECT_EQ(out.find("Device Name                                     raccel vaccel #"), std::string::npos) << out;
  EXPECT_NE(out.find("raccel OpenCL settings: spin_us = '5000' is not a number from 0"), std::string::npos) << out;
}

// A card whose operator turned its images off (the netaccel's images = false): the
// device has none, its compiler's __IMAGE_SUPPORT__ goes, and image calls get the
// standard CL_INVALID_OPERATION.
class OpenclNoImages : public OpenclIcd {
 protected:
  void SetUp() override {
    if (std::string(RACCEL_ICD_DIR).empty()) GTEST_SKIP() << "libraccel-opencl is not built here (no CL/cl_icd.h)";
    cluster_ = std::make_unique<Cluster>();
    cluster_->addNetaccel("ocl", {"backend=opencl,device=0,tflops=4,memory=1GiB,images=false"}, 4);
    socket_ = cluster_->startGuestd();
  }
};

TEST_F(OpenclNoImages, ACardWithoutImagesRefusesThemWithTheStandardError) {
  int status = -1;
  std::string out = run(sh(RACCEL_OCL_CONFORMANCE) + " --only images_refused", &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find("ok   images_refused"), std::string::npos) << out;
  out = run(sh(RACCEL_OCL_CONFORMANCE) + " --only image_macro_matches", &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  out = run(sh(RACCEL_OCL_CONFORMANCE) + " --only images_2d", &status);
  EXPECT_NE(out.find("FAIL images_2d: CL_DEVICE_IMAGE_SUPPORT is false"), std::string::npos) << out;
}

TEST_F(OpenclIcd, APlainCProgramRunsAKernelAndChecksIt) {
  int status = -1;
  std::string out = run(sh(RACCEL_OCL_SMOKE), &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find("ocl_smoke: OK saxpy over 65536 floats on raccel vaccel"), std::string::npos) << out;
}

TEST_F(OpenclIcd, BadInputGetsTheStandardErrorsAndCrashesNothing) {
  int status = -1;
  std::string out = run(sh(RACCEL_OCL_SMOKE) + " --abuse", &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find("ocl_smoke: OK bad input refused with the standard errors"), std::string::npos) << out;
  // The daemons are unaffected: a fresh program runs.
  out = run(sh(RACCEL_OCL_SMOKE), &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
}

// The calls' timeout is what notices the scheduler's loss (guestd waits for it to come
// back); it covers clBuildProgram too, a cold PoCL compile in a fresh sandbox, which took
// over 3 s on a busy 2-core machine: 10 s.
TEST_F(OpenclIcd, TheSchedulerGoingAwayMidQueueFailsCallsCleanly) {
  std::string log = cluster_->dir() + "/until-error.log";
  std::string command = "OCL_ICD_VENDORS=" + sh(RACCEL_ICD_DIR) + " RACCEL_SOCKET=" + sh(socket_) +
                        " RACCEL_TIMEOUT_MS=10000 " + sh(RACCEL_OCL_SMOKE) + " --until-error 60 > " + sh(log) + " 2>&1";
  testing::Process program("/bin/sh", {"-c", command}, cluster_->dir() + "/until-error.sh.log");
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (testing::readFile(log).find("running") == std::string::npos && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // mid-queue
  cluster_->scheduler().kill(SIGKILL);
  int status = program.wait(60000);
  std::string out = testing::readFile(log);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("a call failed with -5"), std::string::npos) << out;  // CL_OUT_OF_RESOURCES
  EXPECT_NE(out.find("a read afterwards gives -5"), std::string::npos) << out;
}

TEST_F(OpenclIcd, DebiansPyOpenclRunsArraysKernelsReductionsScansAndEvents) {
  int status = -1;
  std::string probe = runCommand("/usr/bin/python3 -c 'import pyopencl, numpy' 2>&1", &status);
  if (status != 0) GTEST_SKIP() << "no Debian PyOpenCL (apt-get install python3-pyopencl): " << probe;
  std::string out = run("/usr/bin/python3 " + sourcePath("tests/opencl/pyopencl_check.py"), &status,
                        "PYOPENCL_CTX= PYOPENCL_NO_CACHE=1 HOME=" + cluster_->dir());
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find("8 passed, 0 failed"), std::string::npos) << out;
}

// What the ICD never sends, a guest may: launches with oversized by-value bytes, empty
// local arrays, sub-buffers past the end, overflowing offsets, too many arguments, huge
// build options, descriptions of handles that are not programs. Each is refused with a
// clear error where it enters the card, and the session and daemons carry on.
TEST_F(OpenclCard, BadLaunchesAndDescriptionsFromAGuestAreRefusedAndTheSessionCarriesOn) {
  auto opened = open("hostile");
  ASSERT_TRUE(opened);
  client::Session& s = *opened;
  const std::string src = "__kernel void k(__global int* x, __local int* t, int v) { x[get_global_id(0)] = v; }";
  auto program = s.loadProgram(ProgramKind::openclC, "k", std::as_bytes(std::span(src)));
  auto buffer = s.alloc(256);
  ASSERT_TRUE(s.fence());
  int32_t v = 7;
  auto value = std::as_bytes(std::span(&v, 1));
  uint64_t global[1] = {64}, none[1] = {0};
  auto launchWith = [&](std::vector<client::Arg> args, std::span<const uint64_t> offset = {}) {
    s.launchRange(program, "k", global, {}, offset, args);
    auto status = s.fence();
    return status ? std::string("accepted") : status.error().message;
  };
  std::vector<std::byte> huge(5000);
  EXPECT_NE(launchWith({client::Arg::buffer(buffer), client::Arg::local(64), client::Arg::value(huge)}).find(
                "5000 bytes by value (1 to 4096)"),
            std::string::npos);
  EXPECT_NE(launchWith({client::Arg::buffer(buffer), client::Arg::local(0), client::Arg::value(value)}).find(
                "a local array of 0 bytes"),
            std::string::npos);
  EXPECT_NE(launchWith({client::Arg::subBuffer(buffer, 1 << 20), client::Arg::local(64), client::Arg::value(value)})
                .find("is past the end of a 256-byte buffer"),
            std::string::npos);
  uint64_t far[1] = {UINT64_MAX - 10};
  EXPECT_NE(launchWith({client::Arg::buffer(buffer), client::Arg::local(64), client::Arg::value(value)}, far)
                .find("offset plus size overflows"),
            std::string::npos);
  std::vector<client::Arg> many(300, client::Arg::value(value));
  EXPECT_NE(launchWith(many).find("at most 256 arguments"), std::string::npos);
  // Images and samplers the ICD would never send: absurd sizes, more pixels than the
  // buffer holds, an unknown format, a sampler word with stray bits.
  const uint32_t rgbaFloat[2] = {0x10B5, 0x10DE};
  ImageDesc absurd{image::kImage3d, rgbaFloat[0], rgbaFloat[1], 0, 1ull << 32, 1ull << 32, 1ull << 32, 0};
  EXPECT_NE(launchWith({client::Arg::imageOf(buffer, 0, absurd), client::Arg::local(64), client::Arg::value(value)})
                .find("past this card's limits"),
            std::string::npos);
  ImageDesc tooBig{image::kImage2d, rgbaFloat[0], rgbaFloat[1], 0, 16, 16, 0, 0};
  EXPECT_NE(launchWith({client::Arg::imageOf(buffer, 0, tooBig), client::Arg::local(64), client::Arg::value(value)})
                .find("does not fit its 256-byte buffer"),
            std::string::npos);
  ImageDesc unknownFormat{image::kImage2d, 0x1234, rgbaFloat[1], 0, 2, 2, 0, 0};
  EXPECT_NE(launchWith({client::Arg::imageOf(buffer, 0, unknownFormat), client::Arg::local(64), client::Arg::value(value)})
                .find("unknown image format"),
            std::string::npos);
  EXPECT_NE(launchWith({client::Arg::buffer(buffer), client::Arg::local(64), client::Arg::sampler(0xffff)}).find("sampler word"),
            std::string::npos);
  ImageDesc fits{image::kImage2d, rgbaFloat[0], rgbaFloat[1], 0, 4, 4, 0, 0};
  EXPECT_NE(launchWith({client::Arg::imageOf(buffer, 0, fits), client::Arg::local(64), client::Arg::value(value)})
                .find("argument 0"),
            std::string::npos) << "an image where the kernel takes a buffer: the card's driver refuses it";
  auto notProgram = s.describeProgram(buffer);
  ASSERT_FALSE(notProgram);
  EXPECT_EQ(notProgram.error().code, Code::notFound) << notProgram.error().message;
  auto unknown = s.describeProgram(999999);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Code::notFound) << unknown.error().message;
  auto bigOptions = s.loadProgram(ProgramKind::openclC, "k2", std::as_bytes(std::span(src)), std::string(5000, ' '));
  auto refused = s.describeProgram(bigOptions);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("dependency failed"), std::string::npos) << refused.error().message;
  EXPECT_NE(s.fence().error().message.find("build options of 5000 bytes (at most 4096)"), std::string::npos);
  // The session, its program and its buffer still work.
  auto info = s.describeProgram(program);
  ASSERT_TRUE(info) << info.error().message;
  ASSERT_EQ(info->kernels.size(), 1u);
  EXPECT_EQ(info->kernels[0].args.size(), 3u);
  EXPECT_EQ(info->kernels[0].args[2].size, 4u);
  EXPECT_EQ(launchWith({client::Arg::buffer(buffer), client::Arg::local(64), client::Arg::value(value)}, none), "accepted");
  std::vector<int32_t> out(64);
  ASSERT_TRUE(s.read(buffer, 0, std::as_writable_bytes(std::span(out))));
  for (int32_t x : out) EXPECT_EQ(x, 7);
}

// A launch the card's own driver refuses (a reqd_work_group_size(1,1,1) kernel given
// 2 x 1 x 1, which the ICD would have refused first) fails with the driver's OpenCL code,
// carried from the sandbox through the netaccel and the scheduler; the session carries on.
TEST_F(OpenclCard, ALaunchTheCardRefusesFailsWithTheCardsOwnOpenclError) {
  auto opened = open("refused");
  ASSERT_TRUE(opened);
  client::Session& s = *opened;
  const std::string src =
      "__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void k(__global int* x) { x[get_global_id(0)] = 3; }";
  auto program = s.loadProgram(ProgramKind::openclC, "k", std::as_bytes(std::span(src)));
  auto buffer = s.alloc(64 * 4);
  ASSERT_TRUE(s.fence());
  uint64_t global[1] = {64}, two[1] = {2}, one[1] = {1};
  std::vector<client::Arg> args{client::Arg::buffer(buffer)};
  s.launchRange(program, "k", global, two, {}, args);
  auto refused = s.fence();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().openclError, -54) << refused.error().message;  // CL_INVALID_WORK_GROUP_SIZE
  s.launchRange(program, "k", global, one, {}, args);  // exactly as required: runs
  std::vector<int32_t> out(64);
  ASSERT_TRUE(s.read(buffer, 0, std::as_writable_bytes(std::span(out))));
  for (int32_t x : out) EXPECT_EQ(x, 3);
}

// A program that gives up waiting for a reply (its own timeout) closes its link: its
// vaccel ends, and its blocks, buffers and sandbox go back at once.
TEST_F(OpenclCard, AProgramThatGivesUpOnAReplyReleasesItsVaccel) {
  auto opened = open("impatient", 1);
  ASSERT_TRUE(opened);
  client::Session& s = *opened;
  cluster_->waitConsole("vaccels", [](auto& j) { return j.find("\"program\":\"impatient\"") != std::string::npos; });
  // A gemm of 1024^3 takes the PoCL card far longer than 1 ms.
  const uint32_t n = 1024;
  auto a = s.alloc(uint64_t{n} * n * 4), b = s.alloc(uint64_t{n} * n * 4), c = s.alloc(uint64_t{n} * n * 4);
  s.gemm(n, n, n, 1, a, b, 0, c);
  std::vector<float> out(4);
  auto read = s.read(c, 0, std::as_writable_bytes(std::span(out)));
  ASSERT_FALSE(read);
  EXPECT_NE(read.error().message.find("timed out"), std::string::npos) << read.error().message;
  // The session is over for good: a later call fails at once rather than reading the
  // late reply as its own.
  EXPECT_FALSE(s.fence());
  std::string left = cluster_->waitConsole("vaccels", [](auto& j) { return j.find("impatient") == std::string::npos; });
  EXPECT_EQ(left.find("impatient"), std::string::npos) << left << cluster_->logs();
}

// The standard's points one by one (tests/opencl/ocl_conformance.c), through raccel's
// ICD against a sandboxed PoCL card, and through the local PoCL device in the same run:
// every check passes on raccel, and each that local PoCL passes, raccel passes too.
// The large transfers are a test of their own (below), each small enough for a busy
// machine's timeout.
class OpenclStandard : public OpenclIcd {
 protected:
  void SetUp() override {
    if (std::string(RACCEL_ICD_DIR).empty()) GTEST_SKIP() << "libraccel-opencl is not built here (no CL/cl_icd.h)";
    testing::VmSpec vm;
    vm.memoryQuota = "3GiB";
    cluster_ = std::make_unique<Cluster>(std::vector<testing::VmSpec>{vm});
    cluster_->addNetaccel("ocl", {"backend=opencl,device=0,tflops=4,memory=4GiB"}, 4);
    socket_ = cluster_->startGuestd();
  }
  // ocl_conformance with `args` through raccel; the exit status in *status.
  std::string throughRaccel(const std::string& args, int* status) {
    return run(sh(RACCEL_OCL_CONFORMANCE) + " " + args, status, "RACCEL_TFLOPS=4");
  }
};

TEST_F(OpenclStandard, TheStandardsPointsHoldThroughTheIcdAsOnLocalPocl) {
  const std::string points = "--skip big_one_buffer --skip big_many_buffers";
  int status = -1;
  std::string pocl = runCommand("POCL_CACHE_DIR=" + sh(cluster_->dir() + "/pocl") + " RACCEL_TEST_PLATFORM='Portable Computing Language' " +
                                    sh(RACCEL_OCL_CONFORMANCE) + " " + points + " 2>&1",
                                &status);
  std::string out = throughRaccel(points + " --skip images_refused", &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find(" passed, 0 failed"), std::string::npos) << out;
  std::istringstream lines(pocl);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("ok   ", 0) == 0) {
      std::string passed = line.substr(0, line.find(" (", 5) + 1);  // "ok   NAME ", without its time
      EXPECT_NE(out.find(passed), std::string::npos) << "local PoCL passes " << line << "\n" << out;
    }
  std::cout << "raccel:\n" << out << "local PoCL:\n" << pocl;
}

// 1 GiB goes through the ICD in one buffer, and in sixteen, and comes back intact.
TEST_F(OpenclStandard, OneGibGoesThroughInOneBufferAndInSixteen) {
  int status = -1;
  std::string out = throughRaccel("--big-mib 1024 --only big_one_buffer", &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find("1 passed, 0 failed"), std::string::npos) << out;
  std::string many = throughRaccel("--big-mib 1024 --only big_many_buffers", &status);
  EXPECT_EQ(status, 0) << many << cluster_->logs();
  EXPECT_NE(many.find("1 passed, 0 failed"), std::string::npos) << many;
  std::cout << out << many;
}

}  // namespace
}  // namespace raccel
