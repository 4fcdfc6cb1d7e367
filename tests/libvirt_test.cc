// The scheduler's libvirt watcher against real libvirt (the test:///default driver: no
// daemon). test:///default keeps one state per process, so the scheduler runs in this
// process (on its own loop thread) and the test defines and starts domains through its
// own connection; the netaccel is a real process and programs reach the VM's socket.
#include <gtest/gtest.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <sys/stat.h>

#include <chrono>
#include <functional>
#include <thread>

#include "console/console_client.h"
#include "scheduler/libvirt_watcher.h"
#include "scheduler/scheduler.h"
#include "tests/cluster.h"
#include "vmfrontend/raccel.h"

namespace raccel {
namespace {

using testing::binary;
using testing::Process;

std::string domainXml(const std::string& name, const std::string& metadata, const std::string& socket) {
  return "<domain type='test'><name>" + name + "</name><memory>262144</memory><vcpu>1</vcpu>"
         "<metadata><raccel:vaccel xmlns:raccel='https://raccel.dev/xmlns/vaccel/1'>" + metadata +
         "</raccel:vaccel></metadata><os><type>hvm</type></os><devices>"
         "<channel type='unix'><source mode='connect' path='" + socket + "'/>"
         "<target type='virtio' name='org.raccel.vaccel.0'/></channel></devices></domain>";
}

// The scheduler and its watcher on a loop thread of their own.
class InProcessScheduler {
 public:
  InProcessScheduler(const std::string& dir, const std::string& uri) {
    uv_loop_init(&loop_);
    scheduler::SchedulerConfig config;
    config.nodeListen = "127.0.0.1:0";
    config.httpListen = "off";
    config.console = "unix:" + dir + "/console.sock";
    config.heartbeatTimeoutMs = 2000;
    config.security.files = transport::TlsFiles{testing::certDir() + "/ca.pem", testing::certDir() + "/scheduler.pem", testing::certDir() + "/scheduler.key"};
    scheduler_ = std::make_unique<scheduler::Scheduler>(&loop_, config);
    started_ = scheduler_->start();
    watcher_ = std::make_unique<scheduler::LibvirtWatcher>(&loop_, *scheduler_, uri);
    if (started_) started_ = watcher_->start();
    stop_.data = this;
    uv_async_init(&loop_, &stop_, [](uv_async_t* a) {
      auto* self = static_cast<InProcessScheduler*>(a->data);
      self->watcher_->stop();
      self->scheduler_->stop();
      uv_close(reinterpret_cast<uv_handle_t*>(a), nullptr);
    });
    thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
  }
  ~InProcessScheduler() {
    uv_async_send(&stop_);
    thread_.join();
    uv_loop_close(&loop_);
  }
  const Status& started() const { return started_; }
  int nodePort() const { return scheduler_->nodePort(); }

 private:
  uv_loop_t loop_;
  uv_async_t stop_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<scheduler::LibvirtWatcher> watcher_;
  Status started_;
  std::thread thread_;
};

class LibvirtWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::makeTempDir();
    conn_ = virConnectOpen("test:///default");
    ASSERT_NE(conn_, nullptr);
  }
  void TearDown() override {
    for (auto* d : domains_) {
      virDomainDestroy(d);
      virDomainUndefine(d);
      virDomainFree(d);
    }
    if (conn_) virConnectClose(conn_);
  }
  virDomainPtr define(const std::string& xml) {
    virDomainPtr d = virDomainDefineXML(conn_, xml.c_str());
    EXPECT_NE(d, nullptr) << virGetLastErrorMessage();
    if (d) domains_.push_back(d);
    return d;
  }
  std::string console(console::Query q) {
    auto text = console::run(dir_ + "/console.sock", q, true);
    return text ? *text : "error: " + text.error().message;
  }
  // Polls `query` until `predicate` holds (up to 10 s); returns the last answer.
  std::string waitFor(console::Query q, const std::function<bool(const std::string&)>& predicate) {
    std::string last;
    for (int i = 0; i < 200; ++i) {
      last = console(q);
      if (predicate(last)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return last;
  }
  static bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

  std::string dir_;
  virConnectPtr conn_ = nullptr;
  std::vector<virDomainPtr> domains_;
};

TEST_F(LibvirtWatcherTest, DomainMetadataIsTheVmPolicyAndStopReleasesItsBlocks) {
  // A domain that already runs when the scheduler starts is found by the first scan.
  virDomainPtr early = define(domainXml("early", "<raccel:tflops>1</raccel:tflops>", dir_ + "/early.sock"));
  ASSERT_EQ(virDomainCreate(early), 0) << virGetLastErrorMessage();

  InProcessScheduler scheduler(dir_, "test:///default");
  ASSERT_TRUE(scheduler.started()) << scheduler.started().error().message;
  std::vector<std::string> args = {"--scheduler", "127.0.0.1:" + std::to_string(scheduler.nodePort()), "--discover",
                                   "none", "--card", "backend=cpu,kind=gpu,tflops=8,memory=1GiB", "--http-listen", "off"};
  for (auto& a : testing::netaccelTlsArgs("n1")) args.push_back(a);
  Process netaccel("raccel-netaccel", args, dir_ + "/n1.log");
  waitFor(console::Query::pool, [](const std::string& s) { return has(s, "\"total\":8"); });

  std::string vms = waitFor(console::Query::vms, [](const std::string& s) { return has(s, "\"name\":\"early\""); });
  EXPECT_TRUE(has(vms, "\"name\":\"early\",\"source\":\"libvirt test:///default\"")) << vms;

  virDomainPtr good = define(domainXml("good",
                                       "<raccel:tflops>4</raccel:tflops><raccel:priority>1</raccel:priority>"
                                       "<raccel:kinds>gpu</raccel:kinds><raccel:memory_quota>256MiB</raccel:memory_quota>",
                                       dir_ + "/good.sock"));
  virDomainPtr bad = define(domainXml("bad", "<raccel:tflops>4</raccel:tflops><raccel:kinds>gpu,tpu</raccel:kinds>",
                                      dir_ + "/bad.sock"));
  ASSERT_EQ(virDomainCreate(good), 0) << virGetLastErrorMessage();
  ASSERT_EQ(virDomainCreate(bad), 0) << virGetLastErrorMessage();

  vms = waitFor(console::Query::vms, [](const std::string& s) {
    return has(s, "\"name\":\"good\"") && has(s, "\"name\":\"bad\"");
  });
  EXPECT_TRUE(has(vms, "{\"name\":\"good\",\"source\":\"libvirt test:///default\",\"socket\":\"" + dir_ +
                           "/good.sock\",\"attach\":\"listen\",\"tflops\":4,\"priority\":1,\"kinds\":\"gpu\","
                           "\"memoryQuota\":268435456,\"state\":\"listening\""))
      << vms;
  // The malformed one: a clear error, no socket, so no program of it gets blocks.
  EXPECT_TRUE(has(vms, "\"name\":\"bad\"")) << vms;
  EXPECT_TRUE(has(vms, "\"state\":\"rejected\",\"problem\":\"domain 'bad': raccel metadata")) << vms;
  EXPECT_TRUE(has(vms, "unknown card kind 'tpu'") || has(vms, "tpu")) << vms;
  struct stat st;
  EXPECT_NE(::stat((dir_ + "/bad.sock").c_str(), &st), 0) << "a rejected VM's socket exists";
  client::Options badOptions;
  badOptions.socket = dir_ + "/bad.sock";
  badOptions.timeoutMs = 2000;
  EXPECT_FALSE(client::Session::open(badOptions));

  // The good one's policy is applied: 4 TFLOPS at most, gpu only.
  client::Options options;
  options.socket = dir_ + "/good.sock";
  options.program = "too-big";
  options.tflops = 6;
  auto tooBig = client::Session::open(options);
  ASSERT_FALSE(tooBig);
  EXPECT_TRUE(has(tooBig.error().message, "vm 'good' may hold 4 blocks")) << tooBig.error().message;
  options.program = "fits";
  options.tflops = 3;
  auto session = client::Session::open(options);
  ASSERT_TRUE(session) << session.error().message;
  auto h = (*session)->alloc(1024);
  (*session)->fill(h, 0, 1024, 7);
  ASSERT_TRUE((*session)->fence());
  std::string pool = console(console::Query::pool);
  EXPECT_TRUE(has(pool, "\"free\":5")) << pool;

  // Stopping the domain detaches the VM: its session ends and the blocks come back.
  ASSERT_EQ(virDomainDestroy(good), 0);
  pool = waitFor(console::Query::pool, [](const std::string& s) { return has(s, "\"free\":8"); });
  EXPECT_TRUE(has(pool, "\"free\":8")) << pool;
  vms = console(console::Query::vms);
  EXPECT_TRUE(has(vms, "\"name\":\"good\",\"source\":\"libvirt test:///default\"")) << vms;
  EXPECT_TRUE(has(vms, "\"state\":\"stopped\"")) << vms;
  EXPECT_FALSE((*session)->fence());
  EXPECT_NE(::stat((dir_ + "/good.sock").c_str(), &st), 0) << "a stopped VM's socket is still there";

  // Started again, it is served again.
  ASSERT_EQ(virDomainCreate(good), 0);
  waitFor(console::Query::vms, [](const std::string& s) { return has(s, "\"kinds\":\"gpu\",\"memoryQuota\":268435456,\"state\":\"listening\""); });
  options.program = "again";
  auto again = client::Session::open(options);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_TRUE((*again)->fence());
}

TEST_F(LibvirtWatcherTest, AnUnreachableUriIsAClearError) {
  InProcessScheduler scheduler(dir_, "test:///nonexistent/raccel-no-such-file.xml");
  ASSERT_FALSE(scheduler.started());
  EXPECT_TRUE(has(scheduler.started().error().message, "libvirt test:///nonexistent/raccel-no-such-file.xml"))
      << scheduler.started().error().message;
}

}  // namespace
}  // namespace raccel
