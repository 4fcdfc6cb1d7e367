#include "common/etcd_settings.h"

namespace raccel {

Result<EtcdSettings> parseEtcdSettings(const ConfigSection& section) {
  EtcdSettings out;
  out.endpoints = section.getString("etcd", "");
  out.prefix = section.getString("etcd_prefix", out.prefix);
  if (out.prefix.empty() || out.prefix.front() != '/' || out.prefix.back() != '/' || out.prefix.size() > 256)
    return fail(Code::invalidArgument, "etcd_prefix must start and end in '/' (and be at most 256 bytes)");
  out.ca = section.getString("etcd_ca", "");
  out.cert = section.getString("etcd_cert", "");
  out.key = section.getString("etcd_key", "");
  auto ttl = section.getInt("etcd_lease_ttl", out.leaseTtlSeconds);
  if (!ttl) return fail(ttl.error());
  if (*ttl < 1 || *ttl > 3600) return fail(Code::invalidArgument, "etcd_lease_ttl must be 1 to 3600 seconds");
  out.leaseTtlSeconds = *ttl;
  return out;
}

}  // namespace raccel
