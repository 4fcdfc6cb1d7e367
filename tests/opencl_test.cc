// Unmodified OpenCL programs against raccel through libraccel-opencl: Debian's clinfo,
// Debian's PyOpenCL and a plain C program linked only with -lOpenCL, found by the
// system's ICD loader (ocl-icd) through an .icd file, against a real scheduler, netaccel
// (PoCL's OpenCL device behind a sandbox) and raccel-guestd.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/cluster.h"

namespace raccel {
namespace {

using testing::Cluster;
using testing::runCommand;

class OpenclIcd : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(RACCEL_ICD_DIR).empty()) GTEST_SKIP() << "libraccel-opencl is not built here (no CL/cl_icd.h)";
    cluster_ = std::make_unique<Cluster>();
    cluster_->addNetaccel("ocl", {"backend=opencl,device=0,tflops=4,memory=1GiB"}, 4);
    socket_ = cluster_->startGuestd();
  }
  // `command` with the loader pointed at raccel's .icd only, and the session's socket.
  std::string run(const std::string& command, int* status, const std::string& extraEnv = "") {
    return runCommand("OCL_ICD_VENDORS=" + std::string(RACCEL_ICD_DIR) + " RACCEL_SOCKET=" + socket_ +
                          " RACCEL_TFLOPS=2 " + extraEnv + " " + command + " 2>&1",
                      status);
  }
  std::unique_ptr<Cluster> cluster_;
  std::string socket_;
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
}

TEST_F(OpenclIcd, APlainCProgramRunsAKernelAndChecksIt) {
  int status = -1;
  std::string out = run(RACCEL_OCL_SMOKE, &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find("ocl_smoke: OK saxpy over 65536 floats on raccel vaccel"), std::string::npos) << out;
}

TEST_F(OpenclIcd, BadInputGetsTheStandardErrorsAndCrashesNothing) {
  int status = -1;
  std::string out = run(std::string(RACCEL_OCL_SMOKE) + " --abuse", &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find("ocl_smoke: OK bad input refused with the standard errors"), std::string::npos) << out;
  // The daemons are unaffected: a fresh program runs.
  out = run(RACCEL_OCL_SMOKE, &status);
  EXPECT_EQ(status, 0) << out << cluster_->logs();
}

TEST_F(OpenclIcd, TheSchedulerGoingAwayMidQueueFailsCallsCleanly) {
  std::string log = cluster_->dir() + "/until-error.log";
  std::string command = "OCL_ICD_VENDORS=" + std::string(RACCEL_ICD_DIR) + " RACCEL_SOCKET=" + socket_ +
                        " RACCEL_TIMEOUT_MS=3000 " + RACCEL_OCL_SMOKE + " --until-error 60 > " + log + " 2>&1";
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
  std::string out = run("/usr/bin/python3 " RACCEL_SOURCE_DIR "/tests/opencl/pyopencl_check.py", &status,
                        "PYOPENCL_CTX= PYOPENCL_NO_CACHE=1 HOME=" + cluster_->dir());
  EXPECT_EQ(status, 0) << out << cluster_->logs();
  EXPECT_NE(out.find("8 passed, 0 failed"), std::string::npos) << out;
}

}  // namespace
}  // namespace raccel
