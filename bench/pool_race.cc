// raccel-pool-race: one scheduler's share of a race for a shared pool in etcd. It joins
// the pool as a scheduler (scheduler/etcd/shared_pool.h), makes admissions and releases
// with the same code a scheduler runs, and prints what it saw as one JSON line. The
// concurrency tests and raccel-bench's multi_* figures run several at once; `--node`
// registers a node first (a stand-in for a netaccel's registration, under this
// program's lease), `--hold` keeps its blocks until killed.
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/flags.h"
#include "scheduler/etcd/shared_pool.h"

using namespace raccel;
using namespace raccel::scheduler;

namespace {

Result<uint64_t> count(const Flags& flags, const std::string& name, uint64_t fallback, uint64_t max) {
  if (!flags.has(name)) return fallback;
  std::string text = flags.get(name);
  if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string::npos)
    return fail(Code::invalidArgument, "--" + name + ": '" + text + "' is not a count");
  uint64_t v = std::stoull(text);
  if (v > max) return fail(Code::invalidArgument, "--" + name + " is at most " + std::to_string(max));
  return v;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int failWith(const Error& e) {
  std::fprintf(stderr, "raccel-pool-race: %s\n", e.message.c_str());
  return 1;
}

// --node NAME:BLOCKS or NAME:BLOCKSxCARDS: a node of CPU cards, registered under this
// program's lease.
Status registerNode(SharedPool& pool, const std::string& spec) {
  size_t colon = spec.rfind(':');
  std::string size = colon == std::string::npos ? "" : spec.substr(colon + 1);
  size_t x = size.find('x');
  auto blocks = parseBytes(size.substr(0, x));
  auto cards = x == std::string::npos ? Result<unsigned long long>(1) : parseBytes(size.substr(x + 1));
  if (!blocks || !cards || *blocks == 0 || *blocks > 65536 || *cards == 0 || *cards > 64)
    return fail(Code::invalidArgument, "--node: '" + spec + "' is not NAME:BLOCKS or NAME:BLOCKSxCARDS "
                                       "(1 to 65536 blocks, 1 to 64 cards)");
  std::vector<CardSpec> specs;
  for (unsigned long long c = 0; c < *cards; ++c) {
    CardSpec card;
    card.index = static_cast<uint32_t>(c);
    card.kind = CardKind::cpu;
    card.tflops = static_cast<double>(*blocks);
    card.programKinds = {ProgramKind::builtin};
    specs.push_back(card);
  }
  auto range = pool.registerNode(spec.substr(0, colon), specs, {}, pool.lease());
  if (!range) return fail(range.error());
  return {};
}

// What one scheduler saw racing: `admissions` requests of 1 to maxBlocks blocks, the
// oldest released whenever more than `window` are held (all of them after a refusal).
struct Race {
  uint64_t admitted = 0, refused = 0, errors = 0;
  std::string lastError;
  std::vector<double> latencyMs;
  std::deque<uint64_t> held;
  double seconds = 0;
};
Race runRace(SharedPool& pool, const std::string& name, uint64_t admissions, uint64_t window, uint64_t maxBlocks,
             uint64_t seed) {
  Race r;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> size(1, static_cast<uint32_t>(maxBlocks));
  auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 1; i <= admissions; ++i) {
    Pool::Request request;
    request.blocks = size(rng);
    auto t0 = std::chrono::steady_clock::now();
    auto placed = pool.allocate(i, name, request);
    r.latencyMs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (placed) {
      ++r.admitted;
      r.held.push_back(i);
    } else if (placed.error().code == Code::resourceExhausted) {
      ++r.refused;
    } else {
      ++r.errors;
      r.lastError = placed.error().message;
    }
    while (r.held.size() > window || (!placed && !r.held.empty())) {
      if (auto ok = pool.release(r.held.front()); !ok) {
        ++r.errors;
        r.lastError = ok.error().message;
      }
      r.held.pop_front();
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags("raccel-pool-race", "Races admissions and releases of one scheduler on a shared pool in etcd.");
  flags.value("etcd", "ENDPOINTS", "etcd's endpoints, host:port separated by commas (required)");
  flags.value("name", "NAME", "this scheduler's name in the pool (required)");
  flags.value("prefix", "PREFIX", "the pool's keys in etcd (default /raccel/)");
  flags.value("admissions", "N", "admissions to try (default 200)");
  flags.value("window", "N", "vaccels held at once before the oldest is released (default 2)");
  flags.value("max-blocks", "N", "each request asks for 1 to N blocks (default 4)");
  flags.value("seed", "N", "random seed (default 1)");
  flags.value("node", "NAME:BLOCKS[xCARDS]", "register a node of CPU cards (1 by default) of that many 1-TFLOPS blocks first", true);
  flags.boolean("hold", "after the admissions, keep what is held until killed");
  flags.value("lease-ttl", "SECONDS", "this scheduler's lease (default 5)");
  int code = 0;
  if (!parseFlagsOrExit(flags, argc, argv, &code)) return code;
  if (!flags.has("etcd") || !flags.has("name")) return failWith({Code::invalidArgument, "--etcd and --name are required"});
  auto endpoints = etcd::parseEndpoints(flags.get("etcd"));
  if (!endpoints) return failWith(endpoints.error());
  auto admissions = count(flags, "admissions", 200, 1'000'000);
  auto window = count(flags, "window", 2, 10'000);
  auto maxBlocks = count(flags, "max-blocks", 4, 1'000'000);
  auto seed = count(flags, "seed", 1, UINT32_MAX);
  auto ttl = count(flags, "lease-ttl", 5, 3600);
  for (auto* r : {&admissions, &window, &maxBlocks, &seed, &ttl})
    if (!*r) return failWith(r->error());
  if (*maxBlocks == 0) return failWith({Code::invalidArgument, "--max-blocks must be at least 1"});

  auto client = etcd::Client::open({*endpoints});
  if (!client) return failWith(client.error());
  SharedPoolOptions options;
  options.scheduler = flags.get("name");
  options.prefix = flags.get("prefix", "/raccel/");
  options.leaseTtlSeconds = static_cast<int64_t>(*ttl);
  auto pool = SharedPool::open(**client, options);
  if (!pool) return failWith(pool.error());
  for (auto& spec : flags.getAll("node"))
    if (auto registered = registerNode(**pool, spec); !registered) return failWith(registered.error());

  Race race = runRace(**pool, options.scheduler, *admissions, *window, *maxBlocks, *seed);
  auto stats = (*pool)->stats();
  nlohmann::json out{{"name", options.scheduler},
                     {"admitted", race.admitted},
                     {"refused", race.refused},
                     {"errors", race.errors},
                     {"conflicts", stats.conflicts},
                     {"commits", stats.commits},
                     {"seconds", race.seconds},
                     {"admission_p50_ms", percentile(race.latencyMs, 0.5)},
                     {"admission_p99_ms", percentile(race.latencyMs, 0.99)},
                     {"last_error", race.lastError}};
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  if (flags.has("hold"))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
  for (uint64_t v : race.held) (void)(*pool)->release(v);
  (void)(*pool)->leave();
  return race.errors == 0 ? 0 : 2;
}
