#include "scheduler/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "common/log.h"

namespace raccel::etcd {
namespace {

constexpr size_t kMaxEndpoints = 16;

std::string stripScheme(const std::string& endpoint, bool* tls) {
  *tls = endpoint.starts_with("https://");
  if (endpoint.starts_with("http://")) return endpoint.substr(7);
  if (*tls) return endpoint.substr(8);
  return endpoint;
}

bool isIpv4HostPort(const std::string& hostPort) {
  size_t colon = hostPort.rfind(':');
  if (colon == std::string::npos) return false;
  in_addr address;
  return inet_pton(AF_INET, hostPort.substr(0, colon).c_str(), &address) == 1;
}

Result<std::string> readFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Code::invalidArgument, std::string("cannot read etcd's ") + what + " " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

Result<std::vector<std::string>> parseEndpoints(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    bool tls = false;
    std::string hostPort = stripScheme(item, &tls);
    size_t colon = hostPort.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == hostPort.size() ||
        hostPort.find_first_not_of("0123456789", colon + 1) != std::string::npos)
      return fail(Code::invalidArgument, "--etcd: '" + item + "' is not an endpoint (host:port, or http(s)://host:port)");
    out.push_back(item);
  }
  if (out.empty()) return fail(Code::invalidArgument, "--etcd: no endpoint given (host:port, comma-separated)");
  if (out.size() > kMaxEndpoints)
    return fail(Code::invalidArgument, "--etcd: at most " + std::to_string(kMaxEndpoints) + " endpoints");
  return out;
}

Result<Options> optionsFrom(const EtcdSettings& settings, uint32_t callTimeoutMs) {
  auto endpoints = parseEndpoints(settings.endpoints);
  if (!endpoints) return fail(endpoints.error().code, "etcd: " + endpoints.error().message);
  return Options{*endpoints, settings.ca, settings.cert, settings.key, callTimeoutMs};
}

std::string prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Result<std::unique_ptr<Client>> Client::open(const Options& options) {
  if (options.endpoints.empty()) return fail(Code::invalidArgument, "etcd: no endpoints");
  bool tls = false;
  std::vector<std::string> hostPorts;
  for (const auto& e : options.endpoints) {
    bool thisTls = false;
    hostPorts.push_back(stripScheme(e, &thisTls));
    if (&e != &options.endpoints.front() && thisTls != tls)
      return fail(Code::invalidArgument, "etcd: endpoints mix http and https");
    tls = thisTls;
  }
  std::string joined;
  for (const auto& h : hostPorts) joined += (joined.empty() ? "" : ",") + h;
  // Several endpoints are one channel over all of them: that takes IP literals (gRPC's
  // ipv4: target); one endpoint may be a name.
  std::string target;
  bool literal = std::all_of(hostPorts.begin(), hostPorts.end(), isIpv4HostPort);
  if (literal) {
    target = "ipv4:" + joined;
  } else if (hostPorts.size() == 1) {
    target = "dns:///" + hostPorts[0];
  } else {
    return fail(Code::invalidArgument, "etcd: several endpoints must be IPv4 addresses (" + joined + ")");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls || !options.caFile.empty()) {
    grpc::SslCredentialsOptions ssl;
    if (options.caFile.empty()) return fail(Code::invalidArgument, "etcd: https endpoints need the CA (the etcd_ca setting)");
    auto ca = readFile(options.caFile, "CA");
    if (!ca) return fail(ca.error());
    ssl.pem_root_certs = *ca;
    if (!options.certFile.empty() || !options.keyFile.empty()) {
      auto cert = readFile(options.certFile, "client certificate");
      if (!cert) return fail(cert.error());
      auto key = readFile(options.keyFile, "client key");
      if (!key) return fail(key.error());
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("round_robin");  // a dead member is skipped, the others serve
  // A member that is starting accepts connections before it answers them: a connection
  // attempt gives up after a second (gRPC's minimum backoff is also its connect timeout)
  // so that a member that has come back is found within about a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  return std::unique_ptr<Client>(
      new Client(options, std::move(target), std::move(credentials), std::move(args), "etcd (" + joined + ")"));
}

namespace {
int64_t steadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
constexpr int64_t kRenewAfterMs = 3000;  // failing calls and no success for this long: a new channel
}  // namespace

Client::Client(Options options, std::string target, std::shared_ptr<grpc::ChannelCredentials> credentials,
               grpc::ChannelArguments args, std::string describe)
    : options_(std::move(options)),
      target_(std::move(target)),
      credentials_(std::move(credentials)),
      args_(std::move(args)),
      describe_(std::move(describe)),
      link_(makeLink()),
      lastOkMs_(steadyMs()),
      renewedMs_(steadyMs()) {}

std::shared_ptr<Client::Link> Client::makeLink() const {
  auto l = std::make_shared<Link>();
  l->channel = grpc::CreateCustomChannel(target_, credentials_, args_);
  l->kv = pb::KV::NewStub(l->channel);
  l->lease = pb::Lease::NewStub(l->channel);
  return l;
}

std::shared_ptr<Client::Link> Client::link() {
  std::lock_guard lock(mutex_);
  return link_;
}

void Client::note(const grpc::Status& status) {
  int64_t now = steadyMs();
  std::lock_guard lock(mutex_);
  if (status.ok()) {
    lastOkMs_ = now;
    return;
  }
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE && status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
    return;
  if (now - lastOkMs_ < kRenewAfterMs || now - renewedMs_ < kRenewAfterMs) return;
  RLOG_INFO("etcd") << describe_ << ": no answer for " << (now - lastOkMs_) << " ms; connecting anew";
  link_ = makeLink();  // calls under way keep the old one until they end
  renewedMs_ = now;
}

void Client::deadline(grpc::ClientContext& context) const {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.callTimeoutMs));
}

Error Client::failure(const grpc::Status& status, const char* what) {
  // Unreachable, timed out or without a leader: retryable. Anything else etcd refused.
  Code code = Code::internal;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
      code = Code::unavailable;
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      code = Code::resourceExhausted;
      break;
    case grpc::StatusCode::NOT_FOUND:
      code = Code::notFound;
      break;
    default:
      break;
  }
  return Error{code, describe_ + " " + what + ": " + status.error_message()};
}

Result<pb::RangeResponse> Client::range(const std::string& prefix, int64_t revision) {
  pb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(prefixEnd(prefix));
  request.set_revision(revision);
  return unary<pb::RangeResponse>("range", [&](grpc::ClientContext* context, pb::RangeResponse* out) {
    return link()->kv->Range(context, request, out);
  });
}

Result<pb::TxnResponse> Client::txn(const pb::TxnRequest& request) {
  return unary<pb::TxnResponse>("transaction", [&](grpc::ClientContext* context, pb::TxnResponse* out) {
    return link()->kv->Txn(context, request, out);
  });
}

Result<pb::PutResponse> Client::put(const std::string& key, const std::string& value, int64_t lease) {
  pb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  return unary<pb::PutResponse>("put", [&](grpc::ClientContext* context, pb::PutResponse* out) {
    return link()->kv->Put(context, request, out);
  });
}

Result<pb::DeleteRangeResponse> Client::removePrefix(const std::string& prefix) {
  pb::DeleteRangeRequest request;
  request.set_key(prefix);
  request.set_range_end(prefixEnd(prefix));
  return unary<pb::DeleteRangeResponse>("delete", [&](grpc::ClientContext* context, pb::DeleteRangeResponse* out) {
    return link()->kv->DeleteRange(context, request, out);
  });
}

Result<int64_t> Client::grantLease(int64_t ttlSeconds) {
  pb::LeaseGrantRequest request;
  request.set_ttl(ttlSeconds);
  auto response = unary<pb::LeaseGrantResponse>("lease grant", [&](grpc::ClientContext* context, pb::LeaseGrantResponse* out) {
    return link()->lease->LeaseGrant(context, request, out);
  });
  if (!response) return fail(response.error());
  if (!response->error().empty()) return fail(Code::unavailable, describe_ + " lease grant: " + response->error());
  if (response->id() <= 0) return fail(Code::internal, describe_ + " granted an invalid lease id");
  return response->id();
}

Status Client::revokeLease(int64_t lease) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  auto response = unary<pb::LeaseRevokeResponse>("lease revoke", [&](grpc::ClientContext* context, pb::LeaseRevokeResponse* out) {
    return link()->lease->LeaseRevoke(context, request, out);
  });
  if (!response) return fail(response.error());
  return {};
}

Result<int64_t> Client::keepAliveOnce(int64_t lease) {
  grpc::ClientContext context;
  deadline(context);
  auto l = link();
  auto stream = l->lease->LeaseKeepAlive(&context);
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  pb::LeaseKeepAliveResponse response;
  bool sent = stream->Write(request) && stream->WritesDone();
  bool read = sent && stream->Read(&response);
  grpc::Status status = stream->Finish();
  note(status);
  if (!status.ok()) return fail(failure(status, "lease keep-alive"));
  if (!read) return fail(Code::unavailable, describe_ + " lease keep-alive: no answer");
  return response.ttl();
}

LeaseKeeper::LeaseKeeper(Client& client, int64_t lease, int64_t ttlSeconds, std::function<void()> expired)
    : client_(client), lease_(lease), expired_(std::move(expired)), thread_([this, ttlSeconds] { run(ttlSeconds); }) {}

LeaseKeeper::~LeaseKeeper() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void LeaseKeeper::run(int64_t ttlSeconds) {
  auto period = std::chrono::milliseconds(std::max<int64_t>(100, ttlSeconds * 1000 / 3));
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    auto ttl = client_.keepAliveOnce(lease_);
    lock.lock();
    if (ttl && *ttl <= 0) {
      alive_ = false;
      RLOG_WARN("etcd") << "lease " << lease_ << " expired";
      if (expired_) expired_();
      return;
    }
    if (!ttl) RLOG_DEBUG("etcd") << "lease " << lease_ << ": " << ttl.error().message;
  }
}

Watcher::Watcher(Client& client, std::string prefix, int64_t fromRevision, bool prevKv,
                 std::function<void(Events, int64_t)> onEvents, std::function<void(Error)> onBroken)
    : client_(client),
      prefix_(std::move(prefix)),
      onEvents_(std::move(onEvents)),
      onBroken_(std::move(onBroken)),
      thread_([this, fromRevision, prevKv] { run(fromRevision, prevKv); }) {}

Watcher::~Watcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (context_) context_->TryCancel();
  }
  thread_.join();
}

void Watcher::run(int64_t fromRevision, bool prevKv) {
  grpc::ClientContext context;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    context_ = &context;
  }
  auto stub = pb::Watch::NewStub(client_.channel());
  auto stream = stub->Watch(&context);
  pb::WatchRequest request;
  auto* create = request.mutable_create_request();
  create->set_key(prefix_);
  create->set_range_end(prefixEnd(prefix_));
  create->set_start_revision(fromRevision);
  create->set_prev_kv(prevKv);
  create->set_progress_notify(true);
  Error broken{Code::unavailable, client_.describe() + " watch: the stream ended"};
  if (stream->Write(request)) {
    pb::WatchResponse response;
    while (stream->Read(&response)) {
      if (response.canceled()) {
        broken = Error{Code::unavailable, client_.describe() + " watch canceled" +
                                              (response.compact_revision() > 0 ? " (history compacted)" : "") + ": " +
                                              response.cancel_reason()};
        break;
      }
      if (response.events_size() == 0 && !response.created()) {
        onEvents_({}, response.header().revision());  // progress
        continue;
      }
      if (response.events_size() == 0) continue;
      Events events(response.events().begin(), response.events().end());
      onEvents_(std::move(events), response.header().revision());
    }
  }
  context.TryCancel();
  grpc::Status status = stream->Finish();
  client_.note(status);
  bool stopping;
  {
    std::lock_guard lock(mutex_);
    context_ = nullptr;
    stopping = stopping_;
  }
  if (stopping) return;
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) broken = client_.failure(status, "watch");
  onBroken_(broken);
}

}  // namespace raccel::etcd
