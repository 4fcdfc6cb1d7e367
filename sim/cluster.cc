#include "sim/cluster.h"

#include <fstream>
#include <sstream>

#include "common/config.h"
#include "sim/csv.h"

namespace raccel::sim {

using scheduler::CardSpec;

std::map<std::string, double> defaultModelTflops() {
  return {{"T4", 8.1},       {"P100", 9.3}, {"V100", 15.7}, {"V100M16", 15.7}, {"V100M32", 15.7},
          {"A10", 31.2},     {"G2", 15.7},  {"G3", 19.5},   {"A100", 19.5},    {"K80", 4.1}};
}

Status overrideModelTflops(std::map<std::string, double>& models, const std::string& spec) {
  for (auto& item : splitFields(spec, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) return fail(Code::invalidArgument, "model TFLOPS '" + item + "': expected MODEL=TFLOPS");
    auto tflops = parseReal(item.substr(eq + 1), "model " + item.substr(0, eq));
    if (!tflops) return fail(tflops.error());
    if (*tflops <= 0) return fail(Code::invalidArgument, "model " + item.substr(0, eq) + ": TFLOPS must be positive");
    models[item.substr(0, eq)] = *tflops;
  }
  return {};
}

namespace {
Status addNode(Cluster& cluster, const std::string& name, const std::vector<CardSpec>& cards, uint64_t cpu, uint64_t mem) {
  auto index = cluster.pool.addNode(name, cards, scheduler::HostVector{cpu, mem});
  if (!index) return fail(index.error());
  cluster.cards += static_cast<uint32_t>(cards.size());
  cluster.blocks = cluster.pool.total();
  return {};
}

CardSpec gpu(const std::string& model, double tflops, uint32_t index, CardKind kind = CardKind::gpu) {
  CardSpec c;
  c.index = index;
  c.kind = kind;
  c.model = model;
  c.backend = "sim";
  c.tflops = tflops;
  return c;
}
}  // namespace

Result<Cluster> loadOpenbNodes(const std::string& path, const std::map<std::string, double>& modelTflops, double blockTflops) {
  auto rows = RowReader::open(path, "the node list", ',');
  if (!rows) return fail(rows.error());
  Cluster cluster{Pool(blockTflops), 0, 0};
  std::vector<std::string> f;
  if (!rows->next(f) || f.size() < 5 || f[0] != "sn" || f[3] != "gpu" || f[4] != "model")
    return fail(Code::invalidArgument, path + ": not an openb node list (expected sn,cpu_milli,memory_mib,gpu,model)");
  while (rows->next(f)) {
    std::string where = rows->where();
    if (f.size() < 5) return fail(Code::invalidArgument, where + ": expected 5 fields");
    auto cpu = parseCount(f[1], where + " cpu_milli");
    auto mem = parseCount(f[2], where + " memory_mib");
    auto count = parseCount(f[3], where + " gpu");
    if (!cpu) return fail(cpu.error());
    if (!mem) return fail(mem.error());
    if (!count) return fail(count.error());
    std::vector<CardSpec> cards;
    if (*count > 0) {
      auto it = modelTflops.find(f[4]);
      if (it == modelTflops.end())
        return fail(Code::invalidArgument, where + ": GPU model '" + f[4] + "' has no TFLOPS figure (give one with --model-tflops " + f[4] + "=X)");
      for (uint32_t i = 0; i < *count; ++i) cards.push_back(gpu(f[4], it->second, i));
    }
    if (auto s = addNode(cluster, f[0], cards, *cpu, *mem); !s) return fail(s.error());
  }
  if (cluster.cards == 0) return fail(Code::invalidArgument, path + ": no GPU nodes");
  return cluster;
}

Cluster fixtureCluster() {
  Cluster cluster{Pool(1.0), 0, 0};
  auto card = [](CardKind kind, double tflops, uint32_t index) { return gpu(kindName(kind), tflops, index, kind); };
  (void)addNode(cluster, "node0", {card(CardKind::gpu, 9, 0), card(CardKind::gpu, 9, 1), card(CardKind::npu, 20, 2), card(CardKind::fpga, 25, 3)}, 0, 0);
  (void)addNode(cluster, "node1", {card(CardKind::gpu, 10, 0), card(CardKind::gpu, 10, 1), card(CardKind::npu, 18, 2), card(CardKind::npu, 18, 3)}, 0, 0);
  (void)addNode(cluster, "node2", {card(CardKind::fpga, 8, 0), card(CardKind::fpga, 8, 1), card(CardKind::fpga, 7, 2), card(CardKind::npu, 3, 3)}, 0, 0);
  (void)addNode(cluster, "node3", {card(CardKind::gpu, 14, 0), card(CardKind::gpu, 14, 1), card(CardKind::npu, 15, 2), card(CardKind::fpga, 12, 3)}, 0, 0);
  return cluster;
}

Result<Cluster> parseClusterConfig(const std::string& text, const std::string& origin) {
  auto config = Config::parse(text, origin);
  if (!config) return fail(config.error());
  if (auto unknown = config->top().unknownKeys({"block_tflops"}); !unknown.empty())
    return fail(Code::invalidArgument, origin + ": unknown key '" + unknown.front() + "'");
  auto blockTflops = config->top().getDouble("block_tflops", 1.0);
  if (!blockTflops) return fail(blockTflops.error());
  if (*blockTflops <= 0) return fail(Code::invalidArgument, origin + ": block_tflops must be positive");
  Cluster cluster{Pool(*blockTflops), 0, 0};
  for (const ConfigSection* s : config->sections("node")) {
    std::string where = origin + ":" + std::to_string(s->line());
    if (auto unknown = s->unknownKeys({"name", "cpu_milli", "memory_mib", "count", "cards"}); !unknown.empty())
      return fail(Code::invalidArgument, where + ": unknown key '" + unknown.front() + "'");
    auto name = s->getString("name");
    if (!name) return fail(name.error());
    auto cpu = s->getInt("cpu_milli", 0);
    auto mem = s->getInt("memory_mib", 0);
    auto count = s->getInt("count", 1);
    if (!cpu) return fail(cpu.error());
    if (!mem) return fail(mem.error());
    if (!count) return fail(count.error());
    if (*cpu < 0 || *mem < 0 || *count < 1) return fail(Code::invalidArgument, where + ": cpu_milli, memory_mib >= 0, count >= 1");
    std::vector<CardSpec> cards;
    for (auto& item : s->getList("cards")) {
      // KIND:MODEL:TFLOPS[xN]
      auto parts = splitFields(item, ':');
      if (parts.size() != 3) return fail(Code::invalidArgument, where + ": card '" + item + "': expected KIND:MODEL:TFLOPS[xN]");
      auto kind = parseKind(parts[0]);
      if (!kind) return fail(Code::invalidArgument, where + ": card '" + item + "': " + kind.error().message);
      uint64_t n = 1;
      std::string tflopsText = parts[2];
      if (auto x = tflopsText.find('x'); x != std::string::npos) {
        auto times = parseCount(tflopsText.substr(x + 1), where + " card count");
        if (!times || *times == 0) return fail(Code::invalidArgument, where + ": card '" + item + "': bad xN");
        n = *times;
        tflopsText = tflopsText.substr(0, x);
      }
      auto tflops = parseReal(tflopsText, where + " card TFLOPS");
      if (!tflops) return fail(tflops.error());
      if (*tflops <= 0) return fail(Code::invalidArgument, where + ": card '" + item + "': TFLOPS must be positive");
      for (uint64_t i = 0; i < n; ++i) cards.push_back(gpu(parts[1], *tflops, static_cast<uint32_t>(cards.size()), *kind));
    }
    if (cards.empty()) return fail(Code::invalidArgument, where + ": node '" + *name + "' has no cards");
    for (long long i = 0; i < *count; ++i) {
      std::string nodeName = *count == 1 ? *name : *name + "-" + std::to_string(i);
      if (auto st = addNode(cluster, nodeName, cards, static_cast<uint64_t>(*cpu), static_cast<uint64_t>(*mem)); !st)
        return fail(Code::invalidArgument, where + ": " + st.error().message);
    }
  }
  if (cluster.cards == 0) return fail(Code::invalidArgument, origin + ": no [node] sections with cards");
  return cluster;
}

Result<Cluster> loadClusterConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return fail(Code::notFound, "cannot read the cluster config " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parseClusterConfig(text.str(), path);
}

}  // namespace raccel::sim
