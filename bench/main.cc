// raccel-bench: raccel's speed on loopback, each figure beside its baseline measured in
// the same run (the README's "Benchmarks" has the current figures).
//
//   sync_rtt_us_p50         one tiny instruction + fence: program -> scheduler -> netaccel -> back,
//                           the node link in mutual TLS as deployed
//   sync_rtt_us_p50_plain   the same with the node link in plain TCP (--insecure), same run
//   sync_rtt_us_p50_tls_thread  the same over TLS with each side's cipher work on a thread
//                           of the link's own (--tls-crypto-thread on; auto chooses it with
//                           4 cores or more): what the hand-over to it costs a round trip
//   sync_rtt_us_p50_etcd    the same (plain TCP) with the scheduler in a pool shared through a
//                           3-member etcd (--etcd): the data path does not touch etcd (target
//                           <= 1.1x sync_rtt_us_p50_plain)
//   raw_two_hop_rtt_us_p50  the same path built from plain sockets relaying bytes (the floor)
//   wakeup_rtt_us_same_cpu / _cross_cpu  one byte back and forth between two threads
//                           pinned to one CPU / to two: what each hop's wake-up costs on this
//                           machine (where a waiting CPU halts, as in many VMs, the second
//                           is tens of microseconds, and every hop of a round trip that the
//                           kernel places across CPUs pays it)
//   async_instr_per_s       a stream of small asynchronous instructions, end to end (median of
//                           3 rounds of 4 s that alternate with the next figure's)
//   async_instr_per_s_scraped  the same stream while a scraper GETs the scheduler's and the
//                           netaccel's /metrics once a second, as Prometheus would; the
//                           overhead (1 - scraped/plain) has a target of < 2%
//   metrics_scrape_ms       one GET /metrics from the scheduler plus one from the netaccel (median
//                           latency while the stream runs)
//   metrics_cpu_ms_per_scrape  the scheduler's and netaccel's CPU time (/proc) per scrape of
//                           both pages, over 200 scrapes with the stream idle
//   bulk_write_read_gbps_lane  256 MiB written and read back through both hops (Gbit/s) on
//                           one host as deployed: the TLS node link, its big frames through
//                           the same-host lane (shared memory; target >= 0.8x raw)
//   bulk_write_read_gbps    the same over the node link alone (as between two hosts, no
//                           lane), plain TCP (--insecure)
//   bulk_write_read_gbps_tls  the same through the mutual-TLS node link (target >= 0.8x plain)
//   bulk_cpu_ms_per_gib     the scheduler's and the netaccel's CPU time per GiB moved, plain,
//                           through TLS (_tls) and through the lane (_lane): what the relay
//                           costs, whatever the cores (each round's allocation included)
//   raw_socket_gbps         one raw loopback TCP socket, same run (Gbit/s); the plain bulk
//                           figure's target is >= 0.8x this
//   vm_sync_rtt_us_p50      the sync round trip timed by raccel-run inside a QEMU guest
//                           (TCG here) over virtio-serial and raccel-guestd, beside
//   host_guestd_sync_rtt_us_p50  the same program as a host process through a host
//                           raccel-guestd (the same hops without the VM)
//   alloc_ops_per_s         allocate + release pairs per second on a 10^6-block pool kept
//                           half full (the scheduler's own Pool, in process; target >= 2e6)
//   admission_p99_us        one admission on a full 10^5-block pool: preemption planning,
//                           releasing the victims, placing the request (target <= 50)
//   aggregate_efficiency    a gemm split over three paced simulated cards on two netaccels:
//                           its throughput over the sum of the cards' own, each measured
//                           alone in the same run (target >= 0.85)
//   fair_share_error        two tenants with 3:1 blocks of one card, both keeping it busy:
//                           |kernel-time ratio / 3 - 1| (target <= 0.05)
//   fair_share_error_async  the same on an asynchronous simulated card (kernels queued and
//                           timed on the card's own thread, as on a GPU stream)
//   sync_rtt_us_p50_sandbox the sync round trip on an OpenCL card (PoCL here) whose tenant
//                           runs in a sandbox process, beside sync_rtt_us_p50_in_process
//                           (the same card inside the netaccel, --no-sandbox), same run
//                           (target <= 1.15x); bulk_gbps_sandbox/_in_process likewise
//                           (target >= 0.9x)
//   cuda_gemm_ratio         with a CUDA GPU: raccel gemm TFLOPS (N=4096) over the hal's
//                           cuBLAS gemm called directly in this process (target >= 0.95)
//   cuda_bulk_gbps          1 GiB written and read back through both hops to the GPU, GB/s
//                           (10^9 bytes), beside a direct page-locked copy each way
//   fair_share_error_cuda   fair_share_error on the GPU with 4096^3 gemms (GPU time by CUDA events)
//   failover_recovery_ms    a vaccel holding 256 MiB: kill -9 of its netaccel to its next
//                           completed instruction (rebuilt on the other netaccel from its lineage)
//   lineage_overhead_pct    async_instr_per_s with the lineage kept against failover = off, same
//                           run (target <= 5%); lineage_bulk_overhead_pct likewise for bulk data
//   lineage_memory_bytes    most the lineage held (checkpoint + log) while a steady workload
//                           ran for --lineage-seconds (60 by default; the figure is 600)
//   --only failover         measures and prints the failover figures alone
//   --only bulk             the bulk figures alone (raw socket, plain and TLS node links, the
//                           OpenCL card sandboxed and in process)
//   --only cuda             the CUDA figures alone, with cuda_sync_rtt_us_p50 (the sync round
//                           trip with the GPU as the card) and cuda_node_link_gbps (the same
//                           1 GiB to a CPU card: cuda_bulk_gbps's target is >= 0.8x this);
//                           without a CUDA GPU it prints why (cuda_skipped)
//   --only sync             the round trips alone: sync_rtt_us_p50 beside the raw two-hop
//                           floor, plain, with crypto threads, through etcd, sandboxed
//   --only multi            the multi-host admission figures alone (a 3-member etcd)
//
// The daemons run as real processes, as deployed. --raw-echo and --raw-relay are the
// baseline's own processes (started by the bench itself).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <random>
#include <thread>
#include <unordered_map>

#include "bench/bulk.h"
#include "bench/failover.h"
#include "bench/multi_host.h"
#include "bench/raw_socket.h"
#include "bench/report.h"
#include "common/flags.h"
#include "hal/backends.h"
#ifdef RACCEL_HAVE_CUDA
#include "hal/cuda/cuda_device.h"
#endif
#include "scheduler/pool.h"
#include <httplib.h>

#include "tests/cluster.h"
#include "tests/etcd_cluster.h"
#include "tests/fairness.h"
#include "transport/tls.h"
#include "vmfrontend/raccel.h"

using namespace raccel;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// raccel-run --rtt's p50 from its output, or -1.
double rttFromOutput(const std::string& path) {
  std::smatch m;
  std::string s = testing::readFile(path);
  static const std::regex line("raccel-run: OK rtt_us p50 ([0-9.]+)");
  return std::regex_search(s, m, line) ? std::stod(m[1]) : -1;
}

// A pool of `nodes` nodes of 8 gpu cards of 125 blocks.
scheduler::Pool bigPool(int nodes) {
  scheduler::Pool pool(1.0);
  std::vector<scheduler::CardSpec> cards;
  for (uint32_t c = 0; c < 8; ++c) cards.push_back({c, CardKind::gpu, "bench", "cpu", 125, 1ull << 30, {}});
  for (int n = 0; n < nodes; ++n) (void)pool.addNode("n" + std::to_string(n), cards);
  return pool;
}

double allocOpsPerSecond(bool quick) {
  scheduler::Pool pool = bigPool(1000);  // 10^6 blocks
  std::mt19937 rng(1);
  scheduler::VaccelId next = 1;
  std::vector<scheduler::VaccelId> live;
  while (pool.freeBlocks() > pool.total() / 2)  // half full, fragmented by random sizes
    if (pool.allocate(next, {1 + static_cast<uint32_t>(rng() % 64)})) live.push_back(next++);
  for (size_t i = 0; i < live.size(); i += 3) pool.release(live[i]);  // holes
  const int pairs = quick ? 200000 : 2000000;
  std::vector<uint32_t> sizes(4096);
  for (auto& x : sizes) x = 1 + static_cast<uint32_t>(rng() % 32);
  auto t = Clock::now();
  for (int i = 0; i < pairs; ++i) {
    scheduler::VaccelId id = next++;
    if (pool.allocate(id, {sizes[static_cast<size_t>(i) & 4095]})) pool.release(id);
  }
  return pairs / since(t);
}

// Returns the p99 in microseconds; *victimsMean gets the holders suspended per admission.
double admissionP99Us(bool quick, double* victimsMean) {
  scheduler::Pool pool = bigPool(100);  // 10^5 blocks
  std::mt19937 rng(2);
  scheduler::VaccelId next = 1;
  struct Held { uint32_t blocks; int priority; };
  std::unordered_map<scheduler::VaccelId, Held> held;
  // Full, with holders of priorities 0..7 and sizes 1..64.
  for (;;) {
    Held h{1 + static_cast<uint32_t>(rng() % 64), static_cast<int>(rng() % 8)};
    if (h.blocks > pool.freeBlocks()) break;
    if (pool.allocate(next, {h.blocks, scheduler::kAllKinds, h.priority})) held[next] = h;
    ++next;
  }
  const int admissions = quick ? 2000 : 20000;
  std::vector<double> us;
  size_t suspended = 0;
  for (int i = 0; i < admissions; ++i) {
    scheduler::Pool::Request request{1 + static_cast<uint32_t>(rng() % 64), scheduler::kAllKinds, 8};
    scheduler::VaccelId id = next++;
    auto t = Clock::now();
    auto victims = pool.planPreemption(request);
    if (victims) {
      for (auto v : *victims) pool.release(v);
      (void)pool.allocate(id, request);
    }
    us.push_back(since(t) * 1e6);
    if (victims) suspended += victims->size();
    // Not timed: the newcomer leaves and the suspended ones resume, so the pool stays full.
    pool.release(id);
    if (victims)
      for (auto v : *victims) {
        Held h = held[v];
        held.erase(v);
        scheduler::VaccelId back = next++;
        if (pool.allocate(back, {h.blocks, scheduler::kAllKinds, h.priority})) held[back] = h;
      }
  }
  *victimsMean = static_cast<double>(suspended) / admissions;
  return percentile(us, 0.99);
}

struct Figures {
  double allocOps = 0, admissionP99 = 0, admissionVictims = 0;
  double vmRttP50 = -1, hostGuestdRttP50 = -1;
  std::string vmSkipped;
  double asyncRateScraped = 0, scrapeMs = 0, scrapeCpuMs = 0;
  size_t scrapes = 0;
  double syncP50 = 0, syncP99 = 0, rawP50 = 0, asyncRate = 0;
  double wakeSameCpu = -1, wakeCrossCpu = -1;  // wakeupRttUs (-1: not measurable here)
  double syncPlainP50 = 0, syncThreadP50 = -1;
  bench::BulkFigures bulk;
  double syncEtcdP50 = -1;  // plain node link, the scheduler in a shared pool (--etcd)
  std::string etcdSkipped;
  double aggEfficiency = 0, aggGflops = 0, aggSingles = 0;
  testing::FairShare fair, fairAsync, fairCuda;
  double sandboxRttP50 = -1, inProcessRttP50 = -1;  // (the card's bulk figures are bulk.sandbox, bulk.inProcess)
  std::string sandboxSkipped;
  double cudaDirectTflops = -1, cudaRaccelTflops = -1, cudaBulkGBps = -1, cudaWriteGBps = -1, cudaReadGBps = -1;
  double cudaSyncP50 = -1;        // the sync round trip with the GPU as the card
  double cudaNodeLinkGBps = -1;   // 1 GiB through both hops to a CPU card, same run (the link's own figure)
#ifdef RACCEL_HAVE_CUDA
  hal::PinnedCopy pinned;
#else
  struct {
    double writeGBps = 0, readGBps = 0;
  } pinned;
#endif
  std::string cudaSkipped;
  bench::FailoverFigures failover;
  bench::MultiHostFigures multi;
};


bool failed(const std::string& why) {
  std::fprintf(stderr, "raccel-bench: %s\n", why.c_str());
  return false;
}

// What every section of a full run shares: its sizes, the VM it opens sessions on, and
// its progress lines.
struct Run {
  bool quick = false, json = false;
  int syncIters = 5000, asyncCount = 400000;
  testing::VmSpec vm;
  client::Options options;

  void progress(const char* what) const {
    if (!json) std::fprintf(stderr, "raccel-bench: %s...\n", what);
  }
  // A session of this program on a cluster's VM; null after saying why not.
  std::unique_ptr<client::Session> openOn(testing::Cluster& on) {
    options.socket = on.vmSocket();
    auto p = client::Session::open(options);
    if (!p) {
      std::fprintf(stderr, "raccel-bench: %s\n", p.error().message.c_str());
      return nullptr;
    }
    return std::move(*p);
  }
  // One tiny instruction + fence, timed; false (after saying why) when one failed.
  bool syncRtts(client::Session& on, std::vector<double>& rtts) const {
    auto tiny = on.alloc(4096);
    (void)on.fence();
    for (int i = 0; i < syncIters + 100; ++i) {
      auto t = Clock::now();
      on.fill(tiny, 0, 4, static_cast<uint8_t>(i));
      if (auto r = on.fence(); !r) return failed(r.error().message);
      if (i >= 100) rtts.push_back(since(t) * 1e6);
    }
    on.free(tiny);
    return true;
  }
};

// The floors: the raw two-hop (the same frame sizes through a relay process to an echo
// process) and the wake-up between two threads on one CPU and on two.
bool measureRawTwoHop(Run& run, Figures& f, testing::Cluster& cluster) {
  f.rawP50 = bench::rawTwoHopRttUs(cluster.dir(), run.syncIters);
  if (f.rawP50 < 0) return failed("raw baseline did not start");
  f.wakeSameCpu = bench::wakeupRttUs(true, run.syncIters);
  f.wakeCrossCpu = bench::wakeupRttUs(false, run.syncIters);
  return true;
}

// The same round trips from a QEMU guest (when one boots here) and from a host program
// through raccel-guestd.
void measureGuests(Run& run, Figures& f, testing::Cluster& cluster) {
  const std::string rtts = std::to_string(run.quick ? 300 : 3000);
  f.vmSkipped = testing::vmUnavailable();
  if (f.vmSkipped.empty()) {
    testing::Process guest(testing::guestBootScript(),
                           {"--socket", cluster.vmSocket(), "--mode", "connect", "--image", testing::guestImage(),
                            "--timeout", "300",
                            "--", "raccel-run", "--name", "vm-rtt", "--rtt", rtts},
                           cluster.dir() + "/vm-rtt.log");
    guest.wait(320000);
    f.vmRttP50 = rttFromOutput(cluster.dir() + "/vm-rtt.log");
    if (f.vmRttP50 < 0) f.vmSkipped = "the guest printed no figure (see " + cluster.dir() + "/vm-rtt.log)";
  }
  std::string guestd = cluster.startGuestd();
  testing::Process host("raccel-run", {"--socket", guestd, "--name", "host-rtt", "--rtt", rtts},
                        cluster.dir() + "/host-rtt.log");
  host.wait(120000);
  f.hostGuestdRttP50 = rttFromOutput(cluster.dir() + "/host-rtt.log");
}

// The asynchronous instruction stream, alone and beside a 1 Hz /metrics scraper, and what
// a scrape costs the daemons.
bool measureStream(Run& run, Figures& f, testing::Cluster& cluster, client::Session& s, client::Handle tiny, pid_t benchNode) {
  // Each round streams for a few seconds, so a 1 Hz scraper scrapes several times in it.
  const double roundSeconds = run.quick ? 0.5 : 2;
  auto stream = [&]() -> double {
    auto t = Clock::now();
    uint64_t sent = 0;
    while (since(t) < roundSeconds)
      for (int i = 0; i < run.asyncCount / 20; ++i, ++sent) s.fill(tiny, (sent % 1024) * 4, 4, static_cast<uint8_t>(sent));
    if (auto r = s.fence(); !r) {
      std::fprintf(stderr, "raccel-bench: %s\n", r.error().message.c_str());
      std::exit(1);
    }
    return sent / since(t);
  };
  std::vector<double> plain, scraped, scrapeMs;
  for (int round = 0; round < (run.quick ? 1 : 7); ++round) {
    plain.push_back(stream());
    std::atomic<bool> scraping{true};
    std::thread scraper([&] {
      httplib::Client scheduler("127.0.0.1", cluster.httpPort()), node("127.0.0.1", cluster.netaccelHttpPort("bench0"));
      while (scraping) {
        auto t = Clock::now();
        auto a = scheduler.Get("/metrics");
        auto b = node.Get("/metrics");
        if (!a || a->status != 200 || !b || b->status != 200) {
          std::fprintf(stderr, "raccel-bench: a /metrics scrape failed\n");
          std::exit(1);
        }
        scrapeMs.push_back(since(t) * 1e3);
        while (scraping && Clock::now() - t < std::chrono::seconds(1)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    scraped.push_back(stream());
    scraping = false;
    scraper.join();
  }
  f.asyncRate = percentile(plain, 0.5);
  f.asyncRateScraped = percentile(scraped, 0.5);
  f.scrapeMs = percentile(scrapeMs, 0.5);
  f.scrapes = scrapeMs.size();
  // What a scrape costs the daemons themselves: their CPU time over 200 scrapes of both
  // pages, the stream idle.
  double before = bench::processCpuMs(cluster.scheduler().pid()) + bench::processCpuMs(benchNode);
  httplib::Client scheduler("127.0.0.1", cluster.httpPort()), node("127.0.0.1", cluster.netaccelHttpPort("bench0"));
  const int n = run.quick ? 20 : 200;
  for (int i = 0; i < n; ++i)
    if (!scheduler.Get("/metrics") || !node.Get("/metrics")) return failed("a /metrics scrape failed");
  f.scrapeCpuMs = (bench::processCpuMs(cluster.scheduler().pid()) + bench::processCpuMs(benchNode) - before) / n;
  return true;
}

// The node link in plain TCP (--insecure), in TLS with crypto threads, and the scheduler
// in a pool shared through etcd (the data path does not touch etcd).
bool measurePlainAndShared(Run& run, Figures& f) {
  run.progress("the same with the node link in plain TCP (--insecure)");
  {
    testing::Cluster plain({run.vm}, "", {"--insecure"});
    plain.addNetaccel("bench0", {"kind=cpu,tflops=4,memory=1GiB"}, 4);
    auto p = run.openOn(plain);
    if (!p) return false;
    std::vector<double> plainRtts;
    if (!run.syncRtts(*p, plainRtts)) return false;
    f.syncPlainP50 = percentile(plainRtts, 0.5);
  }
  run.progress("the same over TLS with a crypto thread on each side of the link (--tls-crypto-thread on)");
  {
    testing::Cluster threaded({run.vm}, "", {"--tls-crypto-thread", "on"});
    threaded.addNetaccel("bench0", {"kind=cpu,tflops=4,memory=1GiB"}, 4, {"--tls-crypto-thread", "on"});
    auto p = run.openOn(threaded);
    if (!p) return false;
    std::vector<double> rtts;
    if (!run.syncRtts(*p, rtts)) return false;
    f.syncThreadP50 = percentile(rtts, 0.5);
  }
  // The same scheduler in a pool shared through etcd: the data path does not touch etcd.
  f.etcdSkipped = testing::etcdUnavailable();
  if (f.etcdSkipped.empty()) {
    run.progress("the same with the scheduler in a pool shared through etcd (--etcd, 3 members)");
    testing::EtcdCluster etcd(3);
    if (auto started = etcd.start(); !started) {
      f.etcdSkipped = started.error().message;
    } else {
      testing::Cluster shared({run.vm}, "", {"--insecure", "--etcd", etcd.endpoints(), "--name", "bench"});
      shared.addNetaccel("bench0", {"kind=cpu,tflops=4,memory=1GiB"}, 4, {"--etcd", etcd.endpoints()});
      auto p = run.openOn(shared);
      if (!p) return false;
      std::vector<double> etcdRtts;
      if (!run.syncRtts(*p, etcdRtts)) return false;
      f.syncEtcdP50 = percentile(etcdRtts, 0.5);
    }
  }

  return true;
}

bool measureSandbox(Run& run, Figures& f) {
  // Sync round trips on an OpenCL card (PoCL here): each tenant in a sandbox process (the
  // default), and the same card with guest code in the netaccel's own process
  // (--no-sandbox), same run. (The card's bulk figures are measureBulk's.)
  if (!hal::discover("opencl").devices.empty()) {
    for (bool sandboxed : {true, false}) {
      run.progress(sandboxed ? "an OpenCL card, each tenant in a sandbox process" : "the same card run inside the netaccel (--no-sandbox)");
      testing::Cluster c({run.vm});
      std::vector<std::string> extra;
      if (!sandboxed) extra.push_back("--no-sandbox");
      const pid_t node = c.addNetaccel("bench0", {"backend=opencl,kind=gpu,tflops=4,memory=1GiB"}, 4, extra).pid();
      auto p = run.openOn(c);
      if (!p) return false;
      // Its first instruction takes the warm sandbox; the new one builds its kernels first.
      if (auto first = p->fence(); !first) return failed(first.error().message);
      bench::awaitIdleChildren(node, run.quick ? 5000 : 30000);
      std::vector<double> r;
      if (!run.syncRtts(*p, r)) return false;
      (sandboxed ? f.sandboxRttP50 : f.inProcessRttP50) = percentile(r, 0.5);
    }
  } else {
    f.sandboxSkipped = "no OpenCL device: " + hal::discover("opencl").note;
  }

  return true;
}

// The hal's cuBLAS gemm called directly, in this process: the baseline of raccel's.
bool measureCudaDirect(Run& run, Figures& f, uint32_t n, int reps) {
  run.progress("CUDA: direct cuBLAS gemm (N=4096) through the hal, in this process");
  auto dev = hal::openDevice("cuda", 0, {.tflops = 8});
  if (!dev) return failed("cuda: " + dev.error().message);
  auto& d = **dev;
  auto a = d.allocate(uint64_t{n} * n * 4), b = d.allocate(uint64_t{n} * n * 4), c = d.allocate(uint64_t{n} * n * 4);
  if (!a || !b || !c) return failed("cuda: no memory for the gemm");
  hal::GemmArgs g{n, n, n, 1, 0, a->get(), b->get(), c->get()};
  (void)d.gemm(g);
  (void)d.finish();
  auto t = Clock::now();
  for (int i = 0; i < reps; ++i) (void)d.gemm(g);
  (void)d.finish();
  f.cudaDirectTflops = 2.0 * n * n * n * reps / since(t) / 1e12;
  d.release(std::move(*a));
  d.release(std::move(*b));
  d.release(std::move(*c));
#ifdef RACCEL_HAVE_CUDA
  run.progress("CUDA: direct page-locked copy, 1 GiB each way");
  if (auto p = hal::measurePinnedCopy(0, 1ull << 30); p) f.pinned = *p;
#endif
  return true;
}

// The same gemm, 1 GiB written and read back, and synchronous round trips, through both
// hops to the GPU.
bool measureCudaThroughRaccel(Run& run, Figures& f, uint32_t n, int reps) {
  run.progress("CUDA: the same gemm and 1 GiB through raccel (guest -> scheduler -> netaccel -> sandbox -> GPU)");
  testing::Cluster c({run.vm});
  c.addNetaccel("gpu0", {"backend=cuda,device=0,kind=gpu,tflops=8"}, 8);
  auto p = run.openOn(c);
  if (!p) return false;
  auto& g = *p;
  auto ha = g.alloc(uint64_t{n} * n * 4), hb = g.alloc(uint64_t{n} * n * 4), hc = g.alloc(uint64_t{n} * n * 4);
  g.writeFloats(ha, testing::randomFloats(size_t{n} * n, 1));
  g.writeFloats(hb, testing::randomFloats(size_t{n} * n, 2));
  g.gemm(n, n, n, 1.0f, ha, hb, 0.0f, hc);
  if (auto r = g.fence(); !r) return failed("cuda gemm: " + r.error().message);
  auto t = Clock::now();
  for (int i = 0; i < reps; ++i) g.gemm(n, n, n, 1.0f, ha, hb, 0.0f, hc);
  if (auto r = g.fence(); !r) return failed("cuda gemm: " + r.error().message);
  f.cudaRaccelTflops = 2.0 * n * n * n * reps / since(t) / 1e12;
  g.free(ha), g.free(hb), g.free(hc);
  bench::BulkRun bulk = bench::steadyBulk(g, size_t{1} << 30, run.quick ? 1 : 3);
  if (!bulk.problem.empty()) return failed(bulk.problem);
  f.cudaWriteGBps = bulk.writeGbps() / 8;
  f.cudaReadGBps = bulk.readGbps() / 8;
  f.cudaBulkGBps = bulk.gbps / 8;
  run.progress("CUDA: synchronous round trips with the GPU as the card");
  std::vector<double> rtts;
  if (!run.syncRtts(g, rtts)) return false;
  f.cudaSyncP50 = percentile(rtts, 0.5);
  return true;
}

// The same 1 GiB through both hops to a CPU card: the node link's own figure, the
// baseline of the GPU's.
bool measureCudaNodeLink(Run& run, Figures& f) {
  run.progress("CUDA baseline: the same 1 GiB through both hops to a CPU card (the node link's own figure)");
  testing::Cluster link({run.vm});
  link.addNetaccel("cpu0", {"kind=cpu,tflops=4,memory=3GiB"}, 4);
  auto lp = run.openOn(link);
  if (!lp) return false;
  bench::BulkRun linkBulk = bench::steadyBulk(*lp, size_t{1} << 30, run.quick ? 1 : 3);
  if (!linkBulk.problem.empty()) return failed(linkBulk.problem);
  f.cudaNodeLinkGBps = linkBulk.gbps / 8;
  return true;
}

// A CUDA GPU, when there is one: gemm through both hops against the same library (the
// hal's cuBLAS gemm) called directly, 1 GiB written and read back against a direct
// page-locked copy and against the node link's own figure, and the GPU shared 3:1, in
// the same run.
bool measureCuda(Run& run, Figures& f) {
  if (hal::discover("cuda").devices.empty()) {
    f.cudaSkipped = "no CUDA GPU: " + hal::discover("cuda").note;
    return true;
  }
  const uint32_t n = 4096;
  const int reps = run.quick ? 5 : 20;
  if (!measureCudaDirect(run, f, n, reps) || !measureCudaThroughRaccel(run, f, n, reps) || !measureCudaNodeLink(run, f))
    return false;
  run.progress("CUDA: two tenants with 3:1 blocks of the GPU, each streaming 4096^3 gemms");
  f.fairCuda = testing::measureFairShare(run.quick ? 3 : 8, testing::kCudaFairCard, 4096, 8);
  if (!f.fairCuda.problem.empty()) std::fprintf(stderr, "raccel-bench: fair share (cuda): %s\n", f.fairCuda.problem.c_str());
  return true;
}

void measureAggregation(Run& run, Figures& f) {
  // Paced cards compute for real but take as long as their declared TFLOPS says; the
  // host has more than enough speed for these rates, so what is measured is raccel's
  // splitting, copying and gathering.
  testing::Cluster agg({run.vm}, "", {"--block-tflops", "0.001"});
  agg.addNetaccel("agg0", {"kind=gpu,tflops=0.004,memory=512MiB,threads=1,paced=true",
                           "kind=npu,tflops=0.002,memory=512MiB,threads=1,paced=true"}, 6);
  agg.addNetaccel("agg1", {"kind=fpga,tflops=0.002,memory=512MiB,threads=1,paced=true"}, 2);
  const uint32_t n = run.quick ? 256 : 512;
  const int reps = run.quick ? 2 : 5;
  auto gflops = [&](double tflops, std::vector<CardKind> kinds, size_t expectCards) -> double {
    client::Options o = run.options;
    o.socket = agg.vmSocket();
    o.tflops = tflops;
    o.kinds = std::move(kinds);
    auto session = client::Session::open(o);
    if (!session || (*session)->vaccel().cards.size() != expectCards) {
      std::fprintf(stderr, "raccel-bench: aggregation vaccel: %s\n",
                   session ? (*session)->vaccel().describe().c_str() : session.error().message.c_str());
      return -1;
    }
    auto& v = **session;
    std::vector<float> a(size_t{n} * n, 1.0f), b(size_t{n} * n, 0.5f);
    auto ha = v.alloc(a.size() * 4), hb = v.alloc(b.size() * 4), hc = v.alloc(a.size() * 4);
    v.writeFloats(ha, a);
    v.writeFloats(hb, b);
    v.gemm(n, n, n, 1.0f, ha, hb, 0.0f, hc);  // warm-up: the other cards get their copies of a and b
    if (!v.fence()) return -1;
    auto t = Clock::now();
    for (int i = 0; i < reps; ++i) v.gemm(n, n, n, 1.0f, ha, hb, 0.0f, hc);
    auto done = v.fence();
    double secs = since(t);
    auto c = v.readFloats(hc, 1);
    if (!done || !c || (*c)[0] != 0.5f * n) return -1;
    return 2.0 * n * n * n * reps / secs / 1e9;
  };
  double g = gflops(0.004, {CardKind::gpu}, 1), p = gflops(0.002, {CardKind::npu}, 1),
         q = gflops(0.002, {CardKind::fpga}, 1);
  double all = gflops(0.008, {}, 3);
  f.aggSingles = g + p + q;
  f.aggGflops = all;
  f.aggEfficiency = (g > 0 && p > 0 && q > 0 && all > 0) ? all / f.aggSingles : 0;
}

// Which of the figures with a target meet it.
struct Met {
  bool sync, async, bulk, aggregate, alloc, admission, fair, fairAsync;
};
Met metOf(const Figures& f) {
  return {f.syncP50 <= 3 * f.rawP50, f.asyncRate >= 200000, f.bulk.plainMet(), f.aggEfficiency >= 0.85,
          f.allocOps >= 2e6, f.admissionP99 <= 50, f.fair.problem.empty() && f.fair.error <= 0.05,
          f.fairAsync.problem.empty() && f.fairAsync.error <= 0.05};
}

// The pool's figures: allocate/release pairs on 10^6 blocks, admission with preemption.
void measurePool(bool quick, Figures& f) {
  f.allocOps = allocOpsPerSecond(quick);
  f.admissionP99 = admissionP99Us(quick, &f.admissionVictims);
}
void printPoolText(const Figures& f) {
  const Met m = metOf(f);
  std::printf("%-26s %12.0f   target >= 2000000  %s\n", "alloc_ops_per_s", f.allocOps, m.alloc ? "met" : "MISSED");
  std::printf("%-26s %9.2f us   target <= 50 us  %s (%.2f holders suspended per admission)\n",
              "admission_p99_us", f.admissionP99, m.admission ? "met" : "MISSED", f.admissionVictims);
}

// The CUDA figures as JSON members (null where not measured).
std::string cudaJson(const Figures& f) {
  auto num = [](double v, const char* fmt) { return bench::jsonNumber(v, fmt); };
  const bool ran = f.cudaSkipped.empty();
  char text[1024];
  std::snprintf(text, sizeof text,
                "\"cuda_gemm_ratio\":%s,\"cuda_gemm_tflops\":%s,\"cuda_direct_gemm_tflops\":%s,\"cuda_bulk_gbps\":%s,"
                "\"cuda_node_link_gbps\":%s,\"cuda_pinned_write_gbps\":%s,\"cuda_pinned_read_gbps\":%s,"
                "\"cuda_sync_rtt_us_p50\":%s,\"fair_share_error_cuda\":%s,\"cuda_skipped\":\"%s\"",
                num(f.cudaRaccelTflops > 0 && f.cudaDirectTflops > 0 ? f.cudaRaccelTflops / f.cudaDirectTflops : -1, "%.3f").c_str(),
                num(f.cudaRaccelTflops, "%.2f").c_str(), num(f.cudaDirectTflops, "%.2f").c_str(),
                num(f.cudaBulkGBps, "%.2f").c_str(), num(f.cudaNodeLinkGBps, "%.2f").c_str(),
                num(ran ? f.pinned.writeGBps : -1, "%.2f").c_str(), num(ran ? f.pinned.readGBps : -1, "%.2f").c_str(),
                num(f.cudaSyncP50, "%.1f").c_str(), num(ran && f.fairCuda.problem.empty() ? f.fairCuda.error : -1, "%.4f").c_str(),
                bench::jsonSafe(f.cudaSkipped).c_str());
  return text;
}

void printCudaText(const Figures& f) {
  if (!f.cudaSkipped.empty()) {
    std::printf("%-26s %12s   skipped: %s\n", "cuda_gemm_ratio", "-", f.cudaSkipped.c_str());
    return;
  }
  double ratio = f.cudaRaccelTflops / f.cudaDirectTflops;
  std::printf("%-26s %12.3f   raccel %.2f TFLOPS vs the hal's cuBLAS directly %.2f TFLOPS (N=4096), target >= 0.95  %s\n",
              "cuda_gemm_ratio", ratio, f.cudaRaccelTflops, f.cudaDirectTflops, ratio >= 0.95 ? "met" : "MISSED");
  std::printf("%-26s %7.2f GB/s   1 GiB write %.2f GB/s, read %.2f GB/s; direct page-locked copy %.2f / %.2f GB/s\n",
              "cuda_bulk_gbps", f.cudaBulkGBps, f.cudaWriteGBps, f.cudaReadGBps, f.pinned.writeGBps, f.pinned.readGBps);
  std::printf("%-26s %7.2f GB/s   the node link's own 1 GiB figure (CPU card), same run; target cuda_bulk >= 0.8x  %s\n",
              "cuda_node_link_gbps", f.cudaNodeLinkGBps, f.cudaBulkGBps >= 0.8 * f.cudaNodeLinkGBps ? "met" : "MISSED");
  std::printf("%-26s %9.1f us   one tiny instruction + fence with the GPU as the card (TLS node link, sandboxed)\n",
              "cuda_sync_rtt_us_p50", f.cudaSyncP50);
  std::printf("%-26s %12.4f   GPU time %.0f ms vs %.0f ms = %.3f : 1 for 3:1 blocks (4096^3 gemms), target <= 0.05  %s%s\n",
              "fair_share_error_cuda", f.fairCuda.error, f.fairCuda.big, f.fairCuda.small, f.fairCuda.ratio,
              f.fairCuda.problem.empty() && f.fairCuda.error <= 0.05 ? "met" : "MISSED", f.fairCuda.problem.c_str());
}

void printJson(const Figures& f, bool quick) {
  const Met m = metOf(f);
  char vmRttText[32] = "null";
  if (f.vmRttP50 >= 0) std::snprintf(vmRttText, sizeof vmRttText, "%.1f", f.vmRttP50);
  const std::string vmRtt = vmRttText;
  std::printf("{\"sync_rtt_us_p50_plain\":%.1f,\"sync_rtt_us_p50_tls_thread\":%s,", f.syncPlainP50,
              bench::jsonNumber(f.syncThreadP50, "%.1f").c_str());
  if (f.syncEtcdP50 >= 0) std::printf("\"sync_rtt_us_p50_etcd\":%.1f,", f.syncEtcdP50);
  else std::printf("\"sync_rtt_us_p50_etcd\":null,");
  auto num = [](double v, const char* fmt) { return bench::jsonNumber(v, fmt); };
  std::printf("\"sync_rtt_us_p50_sandbox\":%s,\"sync_rtt_us_p50_in_process\":%s,%s,",
              num(f.sandboxRttP50, "%.1f").c_str(), num(f.inProcessRttP50, "%.1f").c_str(), cudaJson(f).c_str());
  std::printf("%s,", bench::failoverJson(f.failover).c_str());
  std::printf("%s,", bench::multiHostJson(f.multi).c_str());
  std::printf("\"fair_share_error_async\":%.4f,\"fair_share_ratio_async\":%.3f,\"fair_share_async_met\":%s,",
              f.fairAsync.error, f.fairAsync.ratio, m.fairAsync ? "true" : "false");
  std::printf("\"wakeup_rtt_us_same_cpu\":%s,\"wakeup_rtt_us_cross_cpu\":%s,", num(f.wakeSameCpu, "%.1f").c_str(),
              num(f.wakeCrossCpu, "%.1f").c_str());
  std::printf("\"sync_rtt_us_p50\":%.1f,\"sync_rtt_us_p99\":%.1f,\"raw_two_hop_rtt_us_p50\":%.1f,"
              "\"async_instr_per_s\":%.0f,%s,"
              "\"vm_sync_rtt_us_p50\":%s,\"host_guestd_sync_rtt_us_p50\":%.1f,\"vm_skipped\":\"%s\","
              "\"alloc_ops_per_s\":%.0f,\"admission_p99_us\":%.2f,\"admission_victims_mean\":%.2f,"
              "\"aggregate_efficiency\":%.3f,\"aggregate_gflops\":%.2f,\"aggregate_cards_alone_gflops\":%.2f,"
              "\"quick\":%s,\"targets_met\":{\"sync_rtt\":%s,\"async_instr\":%s,\"bulk\":%s,"
              "\"aggregate\":%s,\"alloc_ops\":%s,\"admission\":%s,\"fair_share\":%s},"
              "\"fair_share_error\":%.4f,\"fair_share_ratio\":%.3f,\"async_instr_per_s_scraped\":%.0f,"
              "\"scrape_overhead_pct\":%.2f,\"metrics_scrape_ms\":%.3f,\"scrapes\":%zu,\"metrics_cpu_ms_per_scrape\":%.3f}\n",
              f.syncP50, f.syncP99, f.rawP50, f.asyncRate, bench::bulkJson(f.bulk).c_str(), vmRtt.c_str(), f.hostGuestdRttP50,
              f.vmSkipped.c_str(), f.allocOps, f.admissionP99, f.admissionVictims, f.aggEfficiency, f.aggGflops,
              f.aggSingles, quick ? "true" : "false", m.sync ? "true" : "false", m.async ? "true" : "false",
              m.bulk ? "true" : "false", m.aggregate ? "true" : "false", m.alloc ? "true" : "false",
              m.admission ? "true" : "false", m.fair ? "true" : "false", f.fair.error, f.fair.ratio, f.asyncRateScraped,
              100 * (1 - f.asyncRateScraped / f.asyncRate), f.scrapeMs, f.scrapes, f.scrapeCpuMs);
}

// Above this, wakeup_rtt_us_cross_cpu says the machine's idle CPUs halt (a few
// microseconds where they poll or stay awake).
constexpr double kSlowWakeupUs = 20;

// The round trips' rows: TLS as deployed, plain, with crypto threads, through etcd, and
// on a sandboxed OpenCL card beside the same in process.
void printSyncText(const Figures& f, const Met& m) {
  std::printf("%-26s %9.1f us   raw two-hop p50 %.1f us, target <= %.1f us  %s\n", "sync_rtt_us_p50", f.syncP50,
              f.rawP50, 3 * f.rawP50, m.sync ? "met" : "MISSED");
  std::printf("%-26s %9.1f us\n", "sync_rtt_us_p99", f.syncP99);
  std::printf("%-26s %12s   one byte between two threads: on one CPU %s us, across two %s us (each hop's wake-up)\n",
              "wakeup_rtt_us", "", bench::jsonNumber(f.wakeSameCpu, "%.1f").c_str(),
              bench::jsonNumber(f.wakeCrossCpu, "%.1f").c_str());
  // A machine whose idle CPUs halt (many VMs) makes each hop's wake-up cost tens of
  // microseconds: the round trips then measure that more than raccel.
  if (f.wakeCrossCpu > kSlowWakeupUs)
    std::printf("%-26s %12s   note: two wake-ups across CPUs cost %.0f us here (idle CPUs halt; in a VM, guest halt "
                "polling shortens it): the round trips above and below are mostly wake-ups\n",
                "", "", f.wakeCrossCpu);
  std::printf("%-26s %9.1f us   the node link in plain TCP (--insecure), same run\n", "sync_rtt_us_p50_plain",
              f.syncPlainP50);
  std::printf("%-26s %9.1f us   sync_rtt_us_p50 %.1f us (TLS as deployed: auto, crypto threads %s here)\n",
              "sync_rtt_us_p50_tls_thread", f.syncThreadP50, f.syncP50,
              std::thread::hardware_concurrency() >= transport::kCryptoThreadCores ? "on" : "off");
  if (f.syncEtcdP50 >= 0)
    std::printf("%-26s %9.1f us   sync_rtt_us_p50_plain %.1f us, target <= 1.1x  %s\n", "sync_rtt_us_p50_etcd",
                f.syncEtcdP50, f.syncPlainP50, f.syncEtcdP50 <= 1.1 * f.syncPlainP50 ? "met" : "MISSED");
  else
    std::printf("%-26s %12s   skipped: %s\n", "sync_rtt_us_p50_etcd", "-", f.etcdSkipped.c_str());
  if (f.sandboxRttP50 >= 0) {
    std::printf("%-26s %9.1f us   same OpenCL card in the netaccel's process %.1f us, target <= %.1f us  %s\n",
                "sync_rtt_us_p50_sandbox", f.sandboxRttP50, f.inProcessRttP50, 1.15 * f.inProcessRttP50,
                f.sandboxRttP50 <= 1.15 * f.inProcessRttP50 ? "met" : "MISSED");
  } else {
    std::printf("%-26s %12s   skipped: %s\n", "sync_rtt_us_p50_sandbox", "-", f.sandboxSkipped.c_str());
  }
}

void printText(const Figures& f) {
  const Met m = metOf(f);
  std::printf("%-26s %12s   %-34s %s\n", "figure", "value", "baseline / target", "");
  printSyncText(f, m);
  if (f.vmRttP50 >= 0)
    std::printf("%-26s %9.1f us   same program on the host through raccel-guestd: %.1f us (QEMU %s)\n",
                "vm_sync_rtt_us_p50", f.vmRttP50, f.hostGuestdRttP50,
                std::getenv("RACCEL_QEMU_ACCEL") ? std::getenv("RACCEL_QEMU_ACCEL") : "tcg");
  else
    std::printf("%-26s %12s   skipped: %s; host through raccel-guestd: %.1f us\n", "vm_sync_rtt_us_p50", "-",
                f.vmSkipped.c_str(), f.hostGuestdRttP50);
  std::printf("%-26s %12.0f   target >= 200000  %s\n", "async_instr_per_s", f.asyncRate, m.async ? "met" : "MISSED");
  std::printf("%-26s %12.0f   overhead %.2f%% beside a 1 Hz /metrics scraper (%zu scrapes), target < 2%%  %s\n",
              "async_instr_per_s_scraped", f.asyncRateScraped, 100 * (1 - f.asyncRateScraped / f.asyncRate), f.scrapes,
              f.asyncRateScraped > 0.98 * f.asyncRate ? "met" : "MISSED");
  std::printf("%-26s %9.3f ms   latency of one scheduler + one netaccel /metrics page while the stream runs, median\n", "metrics_scrape_ms", f.scrapeMs);
  std::printf("%-26s %9.3f ms   the daemons' CPU time per scrape of both pages (at 1 Hz: %.3f%% of one core)\n",
              "metrics_cpu_ms_per_scrape", f.scrapeCpuMs, f.scrapeCpuMs / 10);
  bench::printBulkText(f.bulk);
  printPoolText(f);
  std::printf("%-26s %12.3f   split gemm %.2f GFLOPS vs the cards alone %.2f GFLOPS, target >= 0.85  %s\n",
              "aggregate_efficiency", f.aggEfficiency, f.aggGflops, f.aggSingles, m.aggregate ? "met" : "MISSED");
  std::printf("%-26s %12.4f   kernel time %.0f ms vs %.0f ms = %.3f : 1 for 3:1 blocks, target <= 0.05  %s\n",
              "fair_share_error", f.fair.error, f.fair.big, f.fair.small, f.fair.ratio, m.fair ? "met" : "MISSED");
  printCudaText(f);
  bench::printMultiHostText(f.multi);
  bench::printFailoverText(f.failover);
  std::printf("%-26s %12.4f   device time %.0f ms vs %.0f ms = %.3f : 1 for 3:1 blocks, target <= 0.05  %s\n",
              "fair_share_error_async", f.fairAsync.error, f.fairAsync.big, f.fairAsync.small, f.fairAsync.ratio,
              m.fairAsync ? "met" : "MISSED");
}

Run makeRun(bool quick, bool json) {
  Run run;
  run.quick = quick;
  run.json = json;
  run.syncIters = quick ? 300 : 5000;
  run.asyncCount = quick ? 20000 : 400000;
  run.vm.memoryQuota = "1GiB";
  run.options.program = "raccel-bench";
  return run;
}

// The round trips alone (--only sync): TLS as deployed beside the raw two-hop floor,
// plain, with crypto threads, through etcd, and on a sandboxed OpenCL card beside the
// same in process.
int measureSyncOnly(bool quick, bool json) {
  Run run = makeRun(quick, json);
  Figures f;
  {
    testing::Cluster cluster({run.vm});
    cluster.addNetaccel("bench0", {"kind=cpu,tflops=4,memory=1GiB"}, 4);
    auto opened = run.openOn(cluster);
    if (!opened) return 1;
    run.progress("synchronous round trips (TLS node link)");
    std::vector<double> rtts;
    if (!run.syncRtts(*opened, rtts)) return 1;
    f.syncP50 = percentile(rtts, 0.5);
    f.syncP99 = percentile(rtts, 0.99);
    run.progress("raw two-hop baseline");
    if (!measureRawTwoHop(run, f, cluster)) return 1;
  }
  if (!measurePlainAndShared(run, f) || !measureSandbox(run, f)) return 1;
  if (!json) {
    printSyncText(f, metOf(f));
    return 0;
  }
  auto num = [](double v) { return bench::jsonNumber(v, "%.1f"); };
  std::printf("{\"sync_rtt_us_p50\":%.1f,\"sync_rtt_us_p99\":%.1f,\"raw_two_hop_rtt_us_p50\":%.1f,"
              "\"wakeup_rtt_us_same_cpu\":%s,\"wakeup_rtt_us_cross_cpu\":%s,"
              "\"sync_rtt_us_p50_plain\":%.1f,\"sync_rtt_us_p50_tls_thread\":%s,\"sync_rtt_us_p50_etcd\":%s,"
              "\"sync_rtt_us_p50_sandbox\":%s,\"sync_rtt_us_p50_in_process\":%s,\"quick\":%s}\n",
              f.syncP50, f.syncP99, f.rawP50, num(f.wakeSameCpu).c_str(), num(f.wakeCrossCpu).c_str(), f.syncPlainP50,
              num(f.syncThreadP50).c_str(), num(f.syncEtcdP50).c_str(), num(f.sandboxRttP50).c_str(),
              num(f.inProcessRttP50).c_str(), quick ? "true" : "false");
  return 0;
}

// One section alone (--only): its figures, printed as the full run prints them.
int measureOnly(const std::string& section, bool quick, bool json, double lineageSeconds) {
  if (section == "bulk") {
    if (!json) std::fprintf(stderr, "raccel-bench: bulk: a raw socket, then write and read back through both hops, TLS and plain...\n");
    bench::BulkFigures bulk = bench::measureBulk(quick);
    if (json) std::printf("{%s,\"quick\":%s}\n", bench::bulkJson(bulk).c_str(), quick ? "true" : "false");
    else bench::printBulkText(bulk);
    return bulk.problem.empty() ? 0 : 1;
  }
  if (section == "cuda") {
    Run run = makeRun(quick, json);
    Figures f;
    if (!measureCuda(run, f)) return 1;
    if (json) std::printf("{%s,\"quick\":%s}\n", cudaJson(f).c_str(), quick ? "true" : "false");
    else printCudaText(f);
    return f.fairCuda.problem.empty() ? 0 : 1;  // (no GPU is no failure: cuda_skipped says why)
  }
  if (section == "sync") return measureSyncOnly(quick, json);
  if (section == "pool") {
    Figures f;
    measurePool(quick, f);
    if (json)
      std::printf("{\"alloc_ops_per_s\":%.0f,\"admission_p99_us\":%.2f,\"admission_victims_mean\":%.2f,\"quick\":%s}\n",
                  f.allocOps, f.admissionP99, f.admissionVictims, quick ? "true" : "false");
    else printPoolText(f);
    return 0;
  }
  if (section == "multi") {
    if (!json) std::fprintf(stderr, "raccel-bench: multi: a 3-member etcd, one scheduler admitting alone, then three racing...\n");
    bench::MultiHostFigures multi = bench::measureMultiHost(quick);
    if (json) std::printf("{%s,\"quick\":%s}\n", bench::multiHostJson(multi).c_str(), quick ? "true" : "false");
    else bench::printMultiHostText(multi);
    return 0;  // (no etcd is no failure: multi_skipped says why)
  }
  if (section != "failover") {
    std::fprintf(stderr, "raccel-bench: --only takes failover, bulk, cuda, sync, pool or multi, not '%s'\n", section.c_str());
    return 2;
  }
  if (!json) std::fprintf(stderr, "raccel-bench: failover: lineage on against off, a 256 MiB vaccel's recovery, the lineage's memory...\n");
  bench::FailoverFigures failover = bench::measureFailover(quick, lineageSeconds);
  if (json) std::printf("{%s,\"quick\":%s}\n", bench::failoverJson(failover).c_str(), quick ? "true" : "false");
  else bench::printFailoverText(failover);
  return failover.problem.empty() ? 0 : 1;
}

// Every section, then every figure beside its baseline and target.
int measureAll(bool quick, bool json, double lineageSeconds) {
  Run run = makeRun(quick, json);
  Figures f;
  run.progress("pool: allocate/release on 10^6 blocks, admission with preemption on 10^5");
  measurePool(quick, f);

  run.progress("many hosts: admissions through etcd, three schedulers racing on one pool beside one alone");
  run.progress("failover: lineage on against off, a 256 MiB vaccel's recovery, the lineage's memory");
  f.failover = bench::measureFailover(quick, lineageSeconds);
  if (!f.failover.problem.empty()) std::fprintf(stderr, "raccel-bench: failover figures: %s\n", f.failover.problem.c_str());
  f.multi = bench::measureMultiHost(quick);
  if (!f.multi.skipped.empty()) std::fprintf(stderr, "raccel-bench: multi-host figures skipped: %s\n", f.multi.skipped.c_str());

  testing::Cluster cluster({run.vm});
  pid_t benchNode = cluster.addNetaccel("bench0", {"kind=cpu,tflops=4,memory=1GiB"}, 4).pid();
  auto opened = run.openOn(cluster);
  if (!opened) return 1;
  auto& s = *opened;
  run.progress("synchronous round trips (TLS node link)");
  std::vector<double> rtts;
  if (!run.syncRtts(s, rtts)) return 1;
  f.syncP50 = percentile(rtts, 0.5);
  f.syncP99 = percentile(rtts, 0.99);
  auto tiny = s.alloc(4096);
  (void)s.fence();
  run.progress("raw two-hop baseline");
  if (!measureRawTwoHop(run, f, cluster)) return 1;
  run.progress("synchronous round trips from a QEMU guest and through a host raccel-guestd");
  measureGuests(run, f, cluster);
  run.progress("asynchronous instruction stream, alone and beside a 1 Hz /metrics scraper");
  if (!measureStream(run, f, cluster, s, tiny, benchNode)) return 1;
  if (!measurePlainAndShared(run, f) || !measureSandbox(run, f) || !measureCuda(run, f)) return 1;
  // The bulk figures as --only bulk measures them (one cluster each: the lane as deployed,
  // the node link alone in TLS and plain, the sandboxed card and the same in process).
  run.progress("bulk write and read back: a raw socket, the same-host lane, the node link in TLS and plain, a sandboxed card");
  f.bulk = bench::measureBulk(quick);
  if (!f.bulk.problem.empty()) {
    failed(f.bulk.problem);
    return 1;
  }
  run.progress("compute aggregation over three simulated cards");
  measureAggregation(run, f);
  run.progress("sharing a card: two tenants with 3:1 blocks, both keeping it busy");
  f.fair = testing::measureFairShare(run.quick ? 1.5 : 5);
  if (!f.fair.problem.empty()) std::fprintf(stderr, "raccel-bench: fair share: %s\n", f.fair.problem.c_str());
  run.progress("sharing an asynchronous card (kernels queued, timed on the card's own thread): 3:1 blocks");
  f.fairAsync = testing::measureFairShare(run.quick ? 1.5 : 5, testing::kAsyncFairCard);
  if (!f.fairAsync.problem.empty())
    std::fprintf(stderr, "raccel-bench: fair share (async): %s\n", f.fairAsync.problem.c_str());

  std::replace(f.vmSkipped.begin(), f.vmSkipped.end(), '"', '\'');
  if (run.json) printJson(f, quick);
  else printText(f);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags("raccel-bench", "Measures raccel on loopback against plain-socket baselines from the same run.");
  flags.boolean("json", "print one JSON object with every figure");
  flags.boolean("quick", "small runs (for a smoke test; figures are noisy)");
  flags.value("lineage-seconds", "S", "how long the steady workload behind lineage_memory_bytes runs (default 60)");
  flags.value("only", "SECTION", "measure one section alone and print its figures: failover, bulk, cuda, sync, pool, multi");
  flags.value("raw-echo", "PORT", "(internal) run the baseline's echo process");
  flags.value("raw-relay", "PATH:PORT", "(internal) run the baseline's relay process");
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  if (flags.has("raw-echo")) return bench::rawEcho(std::atoi(flags.get("raw-echo").c_str()));
  if (flags.has("raw-relay")) {
    std::string spec = flags.get("raw-relay");
    auto colon = spec.rfind(':');
    return bench::rawRelay(spec.substr(0, colon), std::atoi(spec.c_str() + colon + 1));
  }
  const bool quick = flags.has("quick");
  double lineageSeconds = 60;
  if (flags.has("lineage-seconds")) {
    const std::string text = flags.get("lineage-seconds");
    char* end = nullptr;
    lineageSeconds = std::strtod(text.c_str(), &end);
    if (text.empty() || *end || !(lineageSeconds >= 1 && lineageSeconds <= 86400)) {
      std::fprintf(stderr, "raccel-bench: --lineage-seconds wants seconds from 1 to 86400, not '%s'\n", text.c_str());
      return 2;
    }
  }
  if (flags.has("only")) return measureOnly(flags.get("only"), quick, flags.has("json"), lineageSeconds);
  return measureAll(quick, flags.has("json"), lineageSeconds);
}
