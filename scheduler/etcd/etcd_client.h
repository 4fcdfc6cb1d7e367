// A client of etcd v3 over its gRPC API (Debian's gRPC C++ and the .proto files Debian
// ships in golang-etcd-server-dev): key ranges, transactions, leases and watches.
//
// Calls block the calling thread until etcd answers or the per-call deadline passes;
// the client is thread-safe (gRPC stubs are). A scheduler's loop thread never calls it:
// it hands work to a thread of its own. Every failure is an Error whose message names
// etcd and its endpoints, so a refusal that comes from a lost etcd says so.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/error.h"
#include "common/etcd_settings.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace raccel::etcd {

namespace pb = etcdserverpb;

struct Options {
  // "http://127.0.0.1:2379" or "127.0.0.1:2379"; several IP endpoints are one channel
  // that goes on through any member that answers. "https://" endpoints need caFile.
  std::vector<std::string> endpoints;
  std::string caFile, certFile, keyFile;  // etcd's TLS: its CA, our client certificate
  uint32_t callTimeoutMs = 3000;
};

// Parses "--etcd"'s value: endpoints separated by commas.
Result<std::vector<std::string>> parseEndpoints(const std::string& text);
// A daemon's etcd settings (common/etcd_settings.h) as a client's options; an error
// names the endpoints that do not parse.
Result<Options> optionsFrom(const EtcdSettings& settings, uint32_t callTimeoutMs = Options{}.callTimeoutMs);

// The key just past every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefixEnd(const std::string& prefix);

class Client {
 public:
  static Result<std::unique_ptr<Client>> open(const Options& options);

  // Every key under `prefix`, at the store's current revision (or `revision`, when
  // not 0): the response carries that revision in its header.
  Result<pb::RangeResponse> range(const std::string& prefix, int64_t revision = 0);
  Result<pb::TxnResponse> txn(const pb::TxnRequest& request);
  Result<pb::PutResponse> put(const std::string& key, const std::string& value, int64_t lease = 0);
  Result<pb::DeleteRangeResponse> removePrefix(const std::string& prefix);
  // A lease of `ttlSeconds`: its id (chosen by etcd).
  Result<int64_t> grantLease(int64_t ttlSeconds);
  Status revokeLease(int64_t lease);
  // One keep-alive of `lease`: its remaining TTL in seconds (0 or less: it has expired).
  Result<int64_t> keepAliveOnce(int64_t lease);

  // "etcd (127.0.0.1:2379,...)", for messages.
  const std::string& describe() const { return describe_; }
  std::shared_ptr<grpc::Channel> channel() { return link()->channel; }
  uint32_t callTimeoutMs() const { return options_.callTimeoutMs; }
  // The error of a failed call, naming etcd (`what`: the call). Every call's status
  // passes through it, so that a channel that stays broken is replaced (see note()).
  Error failure(const grpc::Status& status, const char* what);
  void note(const grpc::Status& status);

 private:
  // A channel and its stubs. Replaced as a whole when calls have failed for a while with
  // no success between: gRPC's own reconnection can stay stuck on members that came
  // back, while a new channel finds them at once.
  struct Link {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
  };
  Client(Options options, std::string target, std::shared_ptr<grpc::ChannelCredentials> credentials,
         grpc::ChannelArguments args, std::string describe);
  std::shared_ptr<Link> link();
  std::shared_ptr<Link> makeLink() const;
  void deadline(grpc::ClientContext& context) const;
  // One unary call under the deadline: its answer, or the failure naming etcd and `what`.
  template <class Response, class Call>
  Result<Response> unary(const char* what, Call call) {
    Response response;
    grpc::ClientContext context;
    deadline(context);
    grpc::Status status = call(&context, &response);
    note(status);
    if (!status.ok()) return fail(failure(status, what));
    return response;
  }

  Options options_;
  std::string target_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  grpc::ChannelArguments args_;
  std::string describe_;
  std::mutex mutex_;
  std::shared_ptr<Link> link_;
  int64_t lastOkMs_ = 0, renewedMs_ = 0;
};

// Keeps a lease alive from a thread of its own, one keep-alive every third of its TTL.
// `expired` is called (on that thread) once etcd says the lease is gone; while etcd
// cannot be reached it keeps trying, since etcd extends leases across its own outages.
class LeaseKeeper {
 public:
  LeaseKeeper(Client& client, int64_t lease, int64_t ttlSeconds, std::function<void()> expired);
  ~LeaseKeeper();  // stops the thread; the lease is left to expire (or revoked by the owner)
  bool alive() const { return alive_; }

 private:
  void run(int64_t ttlSeconds);

  Client& client_;
  int64_t lease_;
  std::function<void()> expired_;
  std::atomic<bool> alive_{true};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// A watch of every key under a prefix from a revision on, read on a thread of its own.
// Events arrive in revision order through `onEvents` (on that thread), each batch with
// the revision it brings the watcher to. When the stream breaks (etcd lost, compacted
// history) the watcher reports it through `onBroken` and stops: its owner re-reads and
// starts a new one.
class Watcher {
 public:
  using Events = std::vector<mvccpb::Event>;
  Watcher(Client& client, std::string prefix, int64_t fromRevision, bool prevKv,
          std::function<void(Events, int64_t revision)> onEvents, std::function<void(Error)> onBroken);
  ~Watcher();

 private:
  void run(int64_t fromRevision, bool prevKv);

  Client& client_;
  std::string prefix_;
  std::function<void(Events, int64_t)> onEvents_;
  std::function<void(Error)> onBroken_;
  std::mutex mutex_;
  grpc::ClientContext* context_ = nullptr;  // of the stream, while it runs
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace raccel::etcd
