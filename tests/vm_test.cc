// Real VMs: the test guest (vm-images/build.sh) booted under QEMU TCG, its raccel-guestd
// on a real virtio-serial port, against a real scheduler and netaccels on this host.
// The guest's verdict is read from its serial console. Skips, saying why, where the
// host has no guest image (no kernel or busybox-static) or no QEMU.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <iostream>
#include <map>
#include <regex>
#include <thread>

#include "tests/cluster.h"

namespace raccel {
namespace {

using testing::Cluster;
using testing::readFile;
using testing::Process;
using testing::VmSpec;

// One QEMU guest running `job`; its serial console goes to `console`.
class Guest {
 public:
  // `extra`: more boot.sh options (--share, --memory).
  Guest(const std::string& socket, const std::string& console, const std::string& job, const std::string& mode = "bind",
        std::vector<std::string> extra = {})
      : console_(console), process_(testing::guestBootScript(), bootArgs(socket, console, job, mode, extra), console + ".boot") {}
  // Waits for the guest to power off; returns the job's exit status (see boot.sh).
  int wait(int timeoutMs = 250000) { return process_.wait(timeoutMs); }
  std::string console() const { return readFile(console_) + readFile(console_ + ".boot"); }
  // Waits until the console shows `text` (or the guest ends).
  bool waitForText(const std::string& text, int timeoutMs) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    while (std::chrono::steady_clock::now() < end) {
      if (readFile(console_).find(text) != std::string::npos) return true;
      if (!process_.running()) return readFile(console_).find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  static std::vector<std::string> bootArgs(const std::string& socket, const std::string& console, const std::string& job,
                                           const std::string& mode, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--socket", socket, "--mode", mode, "--image", testing::guestImage(),
                                     "--log", console, "--timeout", "240"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--", job});
    return args;
  }
  std::string console_;
  Process process_;
};

class VmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = testing::vmUnavailable(); !why.empty()) GTEST_SKIP() << why;
  }
  // A scheduler listening on vm1's socket (QEMU connects) and one PoCL card.
  static std::unique_ptr<Cluster> oneOpenclCard() {
    VmSpec vm;
    vm.attach = "connect";
    auto cluster = std::make_unique<Cluster>(std::vector<VmSpec>{vm});
    cluster->addNetaccel("ocl", {"backend=opencl,device=0,tflops=4,memory=1GiB"}, 4);
    return cluster;
  }
};

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The demo's program in a QEMU guest survives a kill -9 of the netaccel its vaccel is on:
// the vaccel is rebuilt on the other netaccel from its lineage, and raccel-run's checked
// gemms, ops and OpenCL C kernel all come out right.
TEST_F(VmTest, TheDemoInTheGuestSurvivesAKilledNetaccel) {
  VmSpec vm;
  vm.attach = "connect";
  Cluster cluster({vm});
  std::map<std::string, Process*> nodes;
  for (const char* name : {"ocl0", "ocl1"})
    nodes[name] = &cluster.addNetaccel(name, {"backend=opencl,device=0,tflops=4,memory=1GiB"}, 4);
  Guest guest(cluster.vmSocket(), cluster.dir() + "/guest.console",
              "raccel-run --tflops 4 --size 128 --iterations 6 --interval-ms 400 --ops --opencl");
  ASSERT_TRUE(guest.waitForText("raccel-run: iteration 1 max error", 200000)) << guest.console() << cluster.logs();
  std::smatch m;
  const std::string vaccels = cluster.console("vaccels");
  ASSERT_TRUE(std::regex_search(vaccels, m, std::regex(R"re("cards":\[\{"node":"([a-z0-9]+)")re"))) << vaccels;
  const std::string home = m[1].str();
  ASSERT_TRUE(nodes.count(home)) << vaccels;
  nodes.at(home)->kill(SIGKILL);
  int code = guest.wait();
  std::string console = guest.console();
  EXPECT_EQ(code, 0) << console << cluster.logs();
  EXPECT_NE(console.find("raccel-run: OK gemm 128x128x128 x6 + axpy/vadd/reduceSum + OpenCL C on vaccel"), std::string::npos)
      << console << cluster.logs();
  // (raccel-run names the cards it was admitted on; the scheduler's events say the rest)
  const std::string events = cluster.ctl({"events", "--recent"});
  EXPECT_NE(events.find("node-lost    " + home), std::string::npos) << events;
  EXPECT_NE(events.find("recovered"), std::string::npos) << events;
}

// An unmodified OpenCL program in the guest (linked with -lOpenCL only): Debian's ICD
// loader in the guest finds raccel's ICD, whose device is the program's vaccel.
TEST_F(VmTest, AnUnmodifiedOpenclProgramRunsThroughTheGuestsIcd) {
  auto cluster = oneOpenclCard();
  Guest guest(cluster->vmSocket(), cluster->dir() + "/guest.console",
              "if [ ! -x /bin/ocl_smoke ]; then echo 'raccel-guest: no OpenCL programs in this image'; exit 77; fi; "
              "RACCEL_TFLOPS=2 ocl_smoke && RACCEL_TFLOPS=1 clinfo -l");
  int code = guest.wait();
  std::string console = guest.console();
  if (code == 77) GTEST_SKIP() << "the guest image was built without libraccel-opencl";
  EXPECT_EQ(code, 0) << console << cluster->logs();
  EXPECT_NE(console.find("ocl_smoke: OK saxpy over 65536 floats on raccel vaccel"), std::string::npos)
      << console << cluster->logs();
  EXPECT_NE(console.find("Platform #0: raccel"), std::string::npos) << console;
}

// PyTorch in the guest: the host's root shared read-only over virtio-9p (python3, torch,
// and the build's raccel package), the training script run in a chroot of it as a guest
// program, through the guest's raccel-guestd and virtio-serial port.
TEST_F(VmTest, ATorchTrainingScriptInTheGuestRunsOnTheVaccel) {
  if (std::string(RACCEL_PYTHON_DIR).empty()) GTEST_SKIP() << "raccel.torch is not built here";
  int status = -1;
  testing::runCommand("/usr/bin/python3 -c 'import torch' 2>&1", &status);
  if (status != 0) GTEST_SKIP() << "no Debian torch on this host (apt-get install python3-torch)";
  auto cluster = oneOpenclCard();
  Guest guest(cluster->vmSocket(), cluster->dir() + "/guest.console",
              "[ -x /host/usr/bin/python3 ] || { echo 'raccel-guest: no shared host root'; exit 77; }; "
              "chroot /host /usr/bin/env PYTHONPATH=" + testing::sh(std::string(RACCEL_PYTHON_DIR) + "/..") +
                  " RACCEL_SOCKET=/run/raccel/guestd.sock HOME=/run TMPDIR=/run /usr/bin/python3 " +
                  testing::sourcePath("tests/torch/mlp_train.py") + " --steps 20 --progress",
              "bind", {"--share", "/", "--memory", "2048"});
  int code = guest.wait();
  std::string console = guest.console();
  if (code == 77) GTEST_SKIP() << "the guest image cannot mount a shared folder (no 9p modules)";
  EXPECT_EQ(code, 0) << console << cluster->logs();
  EXPECT_NE(console.find("final loss "), std::string::npos) << console << cluster->logs();
  EXPECT_NE(console.find("on raccel"), std::string::npos) << console;
  if (auto at = console.find("final loss "); at != std::string::npos)
    std::cout << "guest console: " << console.substr(at, console.find('\n', at) - at) << "\n";
  EXPECT_NE(cluster->logs().find("admitted vm1/torch#"), std::string::npos) << cluster->logs();
}

TEST_F(VmTest, GuestRunsGemmOpsAndAnOpenclKernelOverVirtioSerial) {
  // QEMU binds the VM's socket (libvirt's default) and the scheduler connects to it.
  VmSpec vm;
  vm.attach = "connect";
  Cluster cluster({vm});
  // Two netaccels: PoCL's OpenCL device (4 TFLOPS) and a cpu card standing in for a gpu.
  cluster.addNetaccel("ocl", {"backend=opencl,device=0,tflops=4,memory=1GiB"}, 4);
  cluster.addNetaccel("cpu", {"backend=cpu,kind=gpu,tflops=4,memory=1GiB"}, 4);
  // 8 TFLOPS spans both netaccels: the gemm is split over the two cards, the OpenCL C
  // kernel is routed to the OpenCL one.
  Guest guest(cluster.vmSocket(), cluster.dir() + "/guest.console",
              "raccel-run --tflops 8 --size 192 --iterations 2 --ops --opencl");
  int code = guest.wait();
  std::string console = guest.console();
  EXPECT_EQ(code, 0) << console << cluster.logs();
  EXPECT_NE(console.find("raccel-guest: port org.raccel.vaccel.0 is /dev/vport"), std::string::npos) << console;
  EXPECT_NE(console.find("raccel-run: OK gemm 192x192x192 x2 + axpy/vadd/reduceSum + OpenCL C on vaccel"),
            std::string::npos)
      << console << cluster.logs();
  EXPECT_NE(console.find("on ocl/0"), std::string::npos) << console;
  EXPECT_NE(console.find("cpu/0"), std::string::npos) << console;
  EXPECT_NE(console.find("raccel-guest: exit 0"), std::string::npos) << console;
}

TEST_F(VmTest, TwoVmsWithDifferentPrioritiesEachSeeOnlyTheirOwnBuffers) {
  VmSpec low, high;
  low.name = "low";
  low.attach = "connect";
  low.priority = 0;
  high.name = "high";
  high.attach = "connect";
  high.priority = 5;
  Cluster cluster({low, high});
  cluster.addNetaccel("n1", {"backend=cpu,kind=gpu,tflops=8,memory=1GiB"}, 8);
  // The same program, the same buffer handles, different inputs (seeds): each checks its
  // results against its own reference while all hold their accelerators at once. The
  // high VM runs two programs at once, multiplexed by its raccel-guestd on one port.
  const std::string run = "raccel-run --tflops 2 --size 96 --hold-ms 4000 --priority 9";
  Guest a(cluster.vmSocket("low"), cluster.dir() + "/low.console", run + " --name low-run --seed 11");
  Guest b(cluster.vmSocket("high"), cluster.dir() + "/high.console",
          run + " --name high-1 --seed 22 & " + run + " --name high-2 --seed 33; second=$?; wait $!; "
                "first=$?; exit $((first|second))");
  // All three are admitted at the same time, each at its own VM's priority cap.
  std::string vaccels;
  bool all = false;
  for (int i = 0; i < 1200 && !all; ++i) {
    vaccels = cluster.console("vaccels");
    all = vaccels.find("\"vm\":\"low\",\"program\":\"low-run\",\"priority\":0") != std::string::npos &&
          vaccels.find("\"vm\":\"high\",\"program\":\"high-1\",\"priority\":5") != std::string::npos &&
          vaccels.find("\"vm\":\"high\",\"program\":\"high-2\",\"priority\":5") != std::string::npos;
    if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(all) << vaccels << a.console() << b.console() << cluster.logs();
  int ca = a.wait(), cb = b.wait();
  EXPECT_EQ(ca, 0) << a.console() << cluster.logs();
  EXPECT_EQ(cb, 0) << b.console() << cluster.logs();
  EXPECT_EQ(count(a.console(), "raccel-run: OK gemm 96x96x96"), 1u) << a.console();
  EXPECT_EQ(count(b.console(), "raccel-run: OK gemm 96x96x96"), 2u) << b.console();
}

TEST_F(VmTest, GuestStartedBeforeTheSchedulerWaitsAndSurvivesItsRestart) {
  std::string dir = testing::makeTempDir();
  std::string socket = dir + "/vm1.sock";
  // The guest boots first: its port reports HUP (no host), raccel-guestd waits, and the
  // first program's hello waits with it. Then the scheduler comes, runs it, is killed
  // with -9 and started again; the guest's second program runs on the new one.
  Guest guest(socket, dir + "/guest.console",
              "raccel-run --name first --size 64 && sleep 12 && raccel-run --name second --size 64 --seed 7");
  ASSERT_TRUE(guest.waitForText("raccel-guest: running", 60000)) << guest.console();
  std::this_thread::sleep_for(std::chrono::seconds(2));  // the program is now waiting for the host
  EXPECT_EQ(count(guest.console(), "raccel-run: OK"), 0u) << guest.console();

  VmSpec vm;
  vm.attach = "connect";
  vm.socket = socket;
  Cluster cluster({vm}, dir);
  cluster.addNetaccel("n1", {"backend=cpu,kind=gpu,tflops=4,memory=1GiB"}, 4);
  ASSERT_TRUE(guest.waitForText("raccel-run: OK gemm 64x64x64", 60000)) << guest.console() << cluster.logs();

  cluster.restartScheduler();
  int code = guest.wait();
  std::string console = guest.console();
  EXPECT_EQ(code, 0) << console << cluster.logs();
  EXPECT_EQ(count(console, "raccel-run: OK gemm 64x64x64"), 2u) << console << cluster.logs();
}

}  // namespace
}  // namespace raccel
