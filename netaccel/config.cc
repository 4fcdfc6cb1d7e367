#include "netaccel/config.h"


namespace raccel::netaccel {
namespace {
Result<CardConfig> cardFrom(const ConfigSection& s) {
  auto unknown = s.unknownKeys({"backend", "kind", "model", "tflops", "memory", "threads"});
  if (!unknown.empty()) return fail(Code::invalidArgument, "unknown card setting '" + unknown[0] + "'");
  CardConfig c;
  c.backend = s.getString("backend", "cpu");
  if (c.backend != "cpu")
    return fail(Code::unimplemented, "card backend '" + c.backend + "' is not built into this netaccel (available: cpu)");
  auto kind = parseKind(s.getString("kind", "cpu"));
  if (!kind) return fail(kind.error());
  c.kind = *kind;
  c.model = s.getString("model", c.kind == CardKind::cpu ? "host-cpu" : std::string("sim-") + kindName(c.kind));
  auto tflops = s.getDouble("tflops", 1);
  if (!tflops) return fail(tflops.error());
  if (*tflops <= 0) return fail(Code::invalidArgument, "card tflops must be positive");
  c.tflops = *tflops;
  auto memory = s.getBytes("memory", 1ull << 30);
  if (!memory) return fail(memory.error());
  if (*memory == 0) return fail(Code::invalidArgument, "card memory must be positive");
  c.memoryBytes = *memory;
  auto threads = s.getInt("threads", 0);
  if (!threads) return fail(threads.error());
  if (*threads < 0 || *threads > 1024) return fail(Code::invalidArgument, "card threads must be 0..1024");
  c.threads = static_cast<unsigned>(*threads);
  return c;
}
}  // namespace

Result<CardConfig> parseCardSpec(const std::string& spec) {
  auto s = ConfigSection::fromSpec("card", spec);
  if (!s) return fail(Code::invalidArgument, "--card " + spec + ": " + s.error().message);
  auto c = cardFrom(*s);
  if (!c) return fail(c.error().code, "--card " + spec + ": " + c.error().message);
  return c;
}

Result<NetaccelConfig> parseConfig(const Config& config) {
  NetaccelConfig out;
  auto& top = config.top();
  auto unknown = top.unknownKeys({"name", "scheduler", "heartbeat_ms"});
  if (!unknown.empty()) return fail(Code::invalidArgument, config.origin() + ": unknown setting '" + unknown[0] + "'");
  out.name = top.getString("name", "");
  out.scheduler = top.getString("scheduler", out.scheduler);
  auto hb = top.getInt("heartbeat_ms", 1000);
  if (!hb) return fail(hb.error());
  if (*hb < 10) return fail(Code::invalidArgument, "heartbeat_ms must be at least 10");
  out.heartbeatMs = static_cast<unsigned>(*hb);
  for (auto* s : config.sections("card")) {
    auto c = cardFrom(*s);
    if (!c) return fail(c.error().code, config.origin() + ":" + std::to_string(s->line()) + ": " + c.error().message);
    out.cards.push_back(*c);
  }
  return out;
}

}  // namespace raccel::netaccel
