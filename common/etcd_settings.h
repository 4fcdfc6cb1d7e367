// How a daemon reaches the pool shared through etcd (scheduler/etcd/shared_pool.h): the
// same keys in raccel-scheduler's and raccel-netaccel's configuration files.
//
//   etcd = 10.0.0.1:2379,10.0.0.2:2379  # the cluster's members (empty: no shared pool)
//   etcd_prefix = /raccel/               # the shared pool's keys
//   etcd_lease_ttl = 5                   # seconds: what a dead daemon holds outlives it this long
//   etcd_ca = ..., etcd_cert = ..., etcd_key = ...   # etcd's TLS (https endpoints)
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/error.h"

namespace raccel {

struct EtcdSettings {
  std::string endpoints, prefix = "/raccel/", ca, cert, key;
  int64_t leaseTtlSeconds = 5;
  bool enabled() const { return !endpoints.empty(); }
};

// The keys every daemon that joins the shared pool takes.
inline constexpr const char* kEtcdKeys[] = {"etcd", "etcd_prefix", "etcd_lease_ttl", "etcd_ca", "etcd_cert", "etcd_key"};

// Reads those keys of `section`; an error names the key.
Result<EtcdSettings> parseEtcdSettings(const ConfigSection& section);

}  // namespace raccel
