#include "server/cluster/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "tessera/base/mutex.h"
#include "tessera/status_macros.h"

namespace tessera::cluster {
namespace internal {

// The first wait before reopening a broken stream; doubles up to max_reconnect_backoff.
constexpr absl::Duration kMinStreamBackoff = absl::Milliseconds(100);
// Between two tries of a read that failed with UNAVAILABLE.
constexpr absl::Duration kReadRetryPause = absl::Milliseconds(50);

struct EtcdStubs {
  EtcdClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
};

namespace {

std::string Quoted(absl::string_view key) { return absl::StrCat("'", absl::CHexEscape(key), "'"); }

std::string LeaseName(int64_t lease_id) {
  return absl::StrCat("lease ", absl::Hex(static_cast<uint64_t>(lease_id)));
}

// `what` names the operation and its key: "Get 'k'".
absl::Status FromGrpc(const grpc::Status& status, const EtcdStubs& stubs, absl::string_view what) {
  const EtcdClientOptions& options = stubs.options;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(absl::StrCat(what, ": etcd at ", options.endpoint,
                                                 " unavailable: ", status.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED: {
      const bool connected = stubs.channel->GetState(false) == GRPC_CHANNEL_READY;
      // Over TLS a refused handshake (wrong CA, no client certificate) also ends here.
      const char* failure = connected                        ? "no answer"
                            : options.credentials != nullptr ? "cannot connect over TLS"
                                                             : "cannot connect";
      return absl::UnavailableError(absl::StrCat(what, ": etcd at ", options.endpoint,
                                                 " unavailable: ", failure, " within ",
                                                 absl::FormatDuration(options.call_timeout)));
    }
    default:
      // The absl codes are the gRPC codes.
      return absl::Status(
          static_cast<absl::StatusCode>(status.error_code()),
          absl::StrCat(what, " on etcd at ", options.endpoint, ": ", status.error_message()));
  }
}

// Runs `call(context)`, one unary RPC, under the call deadline. The call waits for the channel to
// connect rather than failing at once, as etcd's clientv3 does: with gRPC's synchronous API only a
// waiting call polls the connection, so with fail-fast calls a reconnection to an etcd that is
// back would complete only on gRPC's 5 s backup poll. A read (`retry_unavailable`) that fails
// with UNAVAILABLE, e.g. sent on a connection that had just broken, is tried again until the
// deadline; a write is not, since it may have been applied.
template <typename Call>
absl::Status Unary(const EtcdStubs& stubs, absl::string_view what, bool retry_unavailable,
                   Call&& call) {
  const absl::Time deadline = absl::Now() + stubs.options.call_timeout;
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(deadline));
    const grpc::Status status = call(&context);
    if (status.ok()) return absl::OkStatus();
    if (!retry_unavailable || status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        absl::Now() >= deadline) {
      return FromGrpc(status, stubs, what);
    }
    // etcd answers UNAVAILABLE at once while it has no leader: do not spin.
    std::this_thread::sleep_for(
        absl::ToChronoNanoseconds(std::min(kReadRetryPause, deadline - absl::Now())));
  }
}

absl::Status CheckKey(absl::string_view key, absl::string_view what) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty key"));
  return absl::OkStatus();
}

// [key, range_end) of every key that starts with `prefix`, as etcd's clientv3 WithPrefix: the
// prefix with its last byte below 0xff incremented; "\0" as range_end means "every key ≥ key".
std::pair<std::string, std::string> PrefixRange(absl::string_view prefix) {
  const std::string all(1, '\0');
  if (prefix.empty()) return {all, all};
  std::string end(prefix);
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return {std::string(prefix), all};
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return {std::string(prefix), end};
}

KeyValue ToKeyValue(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

absl::Status ValidateEndpoint(absl::string_view endpoint) {
  const size_t colon = endpoint.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port < 1 || port > 65535 ||
      !std::all_of(endpoint.begin() + colon + 1, endpoint.end(), absl::ascii_isdigit)) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", endpoint, "': expected HOST:PORT, e.g. 127.0.0.1:2379"));
  }
  return absl::OkStatus();
}

}  // namespace

// One long-lived stream on a thread of its own: the context of the stream now open is registered
// so that Stop() can cancel it from another thread, and waits between attempts end early on
// Stop().
class StreamRunner {
 public:
  explicit StreamRunner(std::shared_ptr<EtcdStubs> stubs) : stubs_(std::move(stubs)) {}
  virtual ~StreamRunner() = default;

 protected:
  // Sets stopping, cancels the open stream and joins the thread. Call from the owner's
  // destructor (the thread runs the owner's virtual Run()).
  void StopAndJoin() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      if (context_ != nullptr) context_->TryCancel();
      cv_.SignalAll();
    }
    if (thread_.joinable()) thread_.join();
  }

  void StartThread() {
    thread_ = std::thread([this] { Run(); });
  }
  virtual void Run() = 0;

  // A context for a new stream: waits for the channel to connect rather than failing at once
  // (the retry loop would only spin), and asks etcd to end the stream when its member loses
  // the raft leader (clientv3's WithRequireLeader), so that it is reopened. Null when stopping.
  std::unique_ptr<grpc::ClientContext> OpenContext() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_wait_for_ready(true);
    context->AddMetadata("hasleader", "true");
    MutexLock lock(&mu_);
    if (stopping_) return nullptr;
    context_ = context.get();
    return context;
  }
  // Ends the stream (a no-op when it has ended) and unregisters its context; the grpc::Status
  // is the stream's own when it failed by itself.
  template <typename Stream>
  grpc::Status CloseStream(grpc::ClientContext* context, Stream* stream) {
    context->TryCancel();
    grpc::Status status = stream->Finish();
    MutexLock lock(&mu_);
    context_ = nullptr;
    return status;
  }

  // Waits `timeout`; false when Stop() came first.
  bool SleepUnlessStopping(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (!stopping_) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return true;
      cv_.WaitWithTimeout(&mu_, left);
    }
    return false;
  }
  bool stopping() const {
    ReaderMutexLock lock(&mu_);
    return stopping_;
  }
  absl::Duration NextBackoff(absl::Duration backoff) const {
    return std::min(backoff * 2, stubs_->options.max_reconnect_backoff);
  }

  const std::shared_ptr<EtcdStubs> stubs_;
  mutable Mutex mu_;
  CondVar cv_;  // stopping_ set, or a subclass's state changed

 private:
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

class KeepAliveRunner : public StreamRunner {
 public:
  KeepAliveRunner(std::shared_ptr<EtcdStubs> stubs, int64_t lease_id,
                  std::function<void(const absl::Status&)> on_lost)
      : StreamRunner(std::move(stubs)), lease_id_(lease_id), on_lost_(std::move(on_lost)) {
    StartThread();
  }
  ~KeepAliveRunner() override { StopAndJoin(); }

  int64_t lease_id() const { return lease_id_; }
  absl::Time last_renewed() const {
    ReaderMutexLock lock(&mu_);
    return last_renewed_;
  }

 private:
  void Run() override {
    absl::Duration backoff = kMinStreamBackoff;
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(lease_id_);
    while (true) {
      std::unique_ptr<grpc::ClientContext> context = OpenContext();
      if (context == nullptr) return;
      auto stream = stubs_->lease->LeaseKeepAlive(context.get());
      bool lost = false;
      etcdserverpb::LeaseKeepAliveResponse response;
      while (stream->Write(request) && stream->Read(&response)) {
        if (response.ttl() <= 0) {
          lost = true;
          break;
        }
        backoff = kMinStreamBackoff;
        {
          MutexLock lock(&mu_);
          last_renewed_ = absl::Now();
        }
        // A third of the TTL leaves two more tries before the lease would expire.
        const absl::Duration interval =
            std::max(absl::Seconds(response.ttl()) / 3, absl::Milliseconds(100));
        if (!SleepUnlessStopping(interval)) break;
      }
      CloseStream(context.get(), stream.get());
      if (lost) {
        if (on_lost_) {
          on_lost_(absl::NotFoundError(absl::StrCat(
              "KeepAlive ", LeaseName(lease_id_), ": etcd at ", stubs_->options.endpoint,
              " says the lease no longer exists (expired or revoked)")));
        }
        return;
      }
      if (!SleepUnlessStopping(backoff)) return;
      backoff = NextBackoff(backoff);
    }
  }

  const int64_t lease_id_;
  const std::function<void(const absl::Status&)> on_lost_;
  absl::Time last_renewed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

class WatchRunner : public StreamRunner {
 public:
  WatchRunner(std::shared_ptr<EtcdStubs> stubs, absl::string_view prefix, int64_t start_revision,
              std::function<void(const WatchEvent&)> on_event,
              std::function<void(const absl::Status&)> on_error)
      : StreamRunner(std::move(stubs)),
        prefix_(prefix),
        on_event_(std::move(on_event)),
        on_error_(std::move(on_error)),
        next_revision_(start_revision) {
    StartThread();
  }
  ~WatchRunner() override { StopAndJoin(); }

  // OK once etcd confirmed the watch; the reason it failed before that; UNAVAILABLE when neither
  // happened within `timeout`.
  absl::Status WaitUntilCreated(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (phase_ == Phase::kStarting) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::UnavailableError(absl::StrCat(Name(), ": etcd at ", stubs_->options.endpoint,
                                                   " unavailable: no answer within ",
                                                   absl::FormatDuration(timeout)));
      }
      cv_.WaitWithTimeout(&mu_, left);
    }
    return failure_;
  }

  int64_t next_revision() const {
    ReaderMutexLock lock(&mu_);
    return next_revision_;
  }

 private:
  enum class Phase { kStarting, kCreated, kFailed };

  std::string Name() const { return absl::StrCat("Watch ", Quoted(prefix_)); }

  void Run() override {
    const auto [key, range_end] = PrefixRange(prefix_);
    absl::Duration backoff = kMinStreamBackoff;
    while (true) {
      std::unique_ptr<grpc::ClientContext> context = OpenContext();
      if (context == nullptr) return;
      auto stream = stubs_->watch->Watch(context.get());
      etcdserverpb::WatchRequest request;
      etcdserverpb::WatchCreateRequest& create = *request.mutable_create_request();
      create.set_key(key);
      create.set_range_end(range_end);
      create.set_start_revision(next_revision());
      // etcd then reports its revision on a quiet watch now and then (every 10 min by default),
      // which moves next_revision_ along, so that a watch reopened after a long quiet spell does
      // not start below a compaction it has no events from.
      create.set_progress_notify(true);
      absl::Status terminal;
      if (stream->Write(request)) {
        etcdserverpb::WatchResponse response;
        while (terminal.ok() && stream->Read(&response)) {
          terminal = Handle(response);
          backoff = kMinStreamBackoff;
        }
      }
      CloseStream(context.get(), stream.get());
      if (!terminal.ok()) {
        {
          MutexLock lock(&mu_);
          if (phase_ == Phase::kStarting) {
            // Watch() returns it.
            phase_ = Phase::kFailed;
            failure_ = terminal;
            cv_.SignalAll();
            return;
          }
        }
        if (on_error_ && !stopping()) on_error_(terminal);
        return;
      }
      if (!SleepUnlessStopping(backoff)) return;
      backoff = NextBackoff(backoff);
    }
  }

  // Delivers one response's events; not OK when the watch has ended for good.
  absl::Status Handle(const etcdserverpb::WatchResponse& response) {
    if (response.canceled()) {
      const int64_t from = next_revision();
      if (response.compact_revision() != 0) {
        return absl::OutOfRangeError(
            absl::StrCat(Name(), " from revision ", from, ": etcd at ", stubs_->options.endpoint,
                         " has compacted its history up to revision ", response.compact_revision(),
                         "; re-read the prefix and watch from the revision of that read + 1"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat(Name(), ": etcd at ", stubs_->options.endpoint,
                       " cancelled the watch: ", response.cancel_reason()));
    }
    if (response.created()) {
      MutexLock lock(&mu_);
      // From "now": a reopened stream must continue from the revision it was created at.
      if (next_revision_ == 0) next_revision_ = response.header().revision() + 1;
      if (phase_ == Phase::kStarting) {
        phase_ = Phase::kCreated;
        cv_.SignalAll();
      }
      return absl::OkStatus();
    }
    if (response.events_size() == 0) {
      // A progress notification: every change up to header.revision has been sent.
      MutexLock lock(&mu_);
      next_revision_ = std::max(next_revision_, response.header().revision() + 1);
      return absl::OkStatus();
    }
    for (const mvccpb::Event& event : response.events()) {
      WatchEvent out;
      out.type = event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                       : WatchEvent::Type::kPut;
      out.kv = ToKeyValue(event.kv());
      {
        // Before the callback, which may read it; the stream cannot be reopened meanwhile.
        MutexLock lock(&mu_);
        next_revision_ = std::max(next_revision_, out.kv.mod_revision + 1);
      }
      if (on_event_) on_event_(out);
    }
    return absl::OkStatus();
  }

  const std::string prefix_;
  const std::function<void(const WatchEvent&)> on_event_;
  const std::function<void(const absl::Status&)> on_error_;
  int64_t next_revision_ ABSL_GUARDED_BY(mu_);
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kStarting;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

LeaseKeepAlive::LeaseKeepAlive(std::unique_ptr<internal::KeepAliveRunner> runner)
    : runner_(std::move(runner)) {}
LeaseKeepAlive::~LeaseKeepAlive() = default;
int64_t LeaseKeepAlive::lease_id() const { return runner_->lease_id(); }
absl::Time LeaseKeepAlive::last_renewed() const { return runner_->last_renewed(); }

EtcdWatch::EtcdWatch(std::unique_ptr<internal::WatchRunner> runner) : runner_(std::move(runner)) {}
EtcdWatch::~EtcdWatch() = default;
int64_t EtcdWatch::next_revision() const { return runner_->next_revision(); }

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdClientOptions options) {
  TESSERA_RETURN_IF_ERROR(internal::ValidateEndpoint(options.endpoint));
  if (options.call_timeout <= absl::ZeroDuration() ||
      options.max_reconnect_backoff <= absl::ZeroDuration() ||
      options.keepalive_time <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd client for ", options.endpoint,
                     ": call_timeout, max_reconnect_backoff and keepalive_time must be > 0"));
  }
  grpc::ChannelArguments args;
  // gRPC's default backoff grows to 2 minutes, which a call would wait out after etcd is back.
  const int max_backoff_ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options.max_reconnect_backoff)));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, max_backoff_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  // Without this gRPC stops pinging after two pings with no data sent, i.e. on a quiet watch.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(-1);  // a prefix read is one message however large

  auto stubs = std::make_shared<internal::EtcdStubs>();
  stubs->options = options;
  stubs->channel = grpc::CreateCustomChannel(
      options.endpoint,
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(),
      args);
  stubs->kv = etcdserverpb::KV::NewStub(stubs->channel);
  stubs->lease = etcdserverpb::Lease::NewStub(stubs->channel);
  stubs->watch = etcdserverpb::Watch::NewStub(stubs->channel);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(stubs)));
}

EtcdClient::EtcdClient(EtcdClientOptions options, std::shared_ptr<internal::EtcdStubs> stubs)
    : options_(std::move(options)), stubs_(std::move(stubs)) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::optional<KeyValue>> EtcdClient::Get(absl::string_view key) {
  const std::string what = absl::StrCat("Get ", internal::Quoted(key));
  TESSERA_RETURN_IF_ERROR(internal::CheckKey(key, what));
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::RangeResponse response;
  TESSERA_RETURN_IF_ERROR(
      internal::Unary(*stubs_, what, /*retry_unavailable=*/true, [&](grpc::ClientContext* context) {
        return stubs_->kv->Range(context, request, &response);
      }));
  if (response.kvs_size() == 0) return std::optional<KeyValue>();
  return std::optional<KeyValue>(internal::ToKeyValue(response.kvs(0)));
}

absl::StatusOr<RangeResult> EtcdClient::GetPrefix(absl::string_view prefix) {
  const std::string what = absl::StrCat("GetPrefix ", internal::Quoted(prefix));
  const auto [key, range_end] = internal::PrefixRange(prefix);
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  etcdserverpb::RangeResponse response;
  TESSERA_RETURN_IF_ERROR(
      internal::Unary(*stubs_, what, /*retry_unavailable=*/true, [&](grpc::ClientContext* context) {
        return stubs_->kv->Range(context, request, &response);
      }));
  RangeResult result;
  result.revision = response.header().revision();
  result.kvs.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) result.kvs.push_back(internal::ToKeyValue(kv));
  return result;
}

absl::StatusOr<int64_t> EtcdClient::Put(absl::string_view key, absl::string_view value,
                                        int64_t lease) {
  const std::string what = absl::StrCat("Put ", internal::Quoted(key));
  TESSERA_RETURN_IF_ERROR(internal::CheckKey(key, what));
  etcdserverpb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  TESSERA_RETURN_IF_ERROR(internal::Unary(
      *stubs_, what, /*retry_unavailable=*/false,
      [&](grpc::ClientContext* context) { return stubs_->kv->Put(context, request, &response); }));
  return response.header().revision();
}

absl::StatusOr<int64_t> EtcdClient::Delete(absl::string_view key) {
  const std::string what = absl::StrCat("Delete ", internal::Quoted(key));
  TESSERA_RETURN_IF_ERROR(internal::CheckKey(key, what));
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::DeleteRangeResponse response;
  TESSERA_RETURN_IF_ERROR(internal::Unary(
      *stubs_, what, /*retry_unavailable=*/false, [&](grpc::ClientContext* context) {
        return stubs_->kv->DeleteRange(context, request, &response);
      }));
  return response.deleted();
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(absl::string_view prefix) {
  const std::string what = absl::StrCat("DeletePrefix ", internal::Quoted(prefix));
  const auto [key, range_end] = internal::PrefixRange(prefix);
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  etcdserverpb::DeleteRangeResponse response;
  TESSERA_RETURN_IF_ERROR(internal::Unary(
      *stubs_, what, /*retry_unavailable=*/false, [&](grpc::ClientContext* context) {
        return stubs_->kv->DeleteRange(context, request, &response);
      }));
  return response.deleted();
}

absl::StatusOr<bool> EtcdClient::CreateIfAbsent(
    absl::Span<const std::pair<std::string, std::string>> kvs, int64_t lease) {
  if (kvs.empty()) return absl::InvalidArgumentError("CreateIfAbsent: no keys");
  const std::string what =
      absl::StrCat("CreateIfAbsent ", internal::Quoted(kvs[0].first),
                   kvs.size() > 1 ? absl::StrCat(" and ", kvs.size() - 1, " more") : "");
  std::set<absl::string_view> seen;
  etcdserverpb::TxnRequest request;
  for (const auto& [key, value] : kvs) {
    TESSERA_RETURN_IF_ERROR(internal::CheckKey(key, what));
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": key ", internal::Quoted(key), " given twice"));
    }
    // A key that does not exist has create_revision 0.
    etcdserverpb::Compare& compare = *request.add_compare();
    compare.set_result(etcdserverpb::Compare::EQUAL);
    compare.set_target(etcdserverpb::Compare::CREATE);
    compare.set_key(key);
    compare.set_create_revision(0);
    etcdserverpb::PutRequest& put = *request.add_success()->mutable_request_put();
    put.set_key(key);
    put.set_value(value);
    put.set_lease(lease);
  }
  etcdserverpb::TxnResponse response;
  TESSERA_RETURN_IF_ERROR(internal::Unary(
      *stubs_, what, /*retry_unavailable=*/false,
      [&](grpc::ClientContext* context) { return stubs_->kv->Txn(context, request, &response); }));
  return response.succeeded();
}

absl::StatusOr<bool> EtcdClient::CompareAndSwap(absl::string_view key,
                                                int64_t expected_mod_revision,
                                                absl::string_view value, int64_t lease) {
  const std::string what = absl::StrCat("CompareAndSwap ", internal::Quoted(key));
  TESSERA_RETURN_IF_ERROR(internal::CheckKey(key, what));
  if (expected_mod_revision < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected mod_revision ", expected_mod_revision, " is negative"));
  }
  etcdserverpb::TxnRequest request;
  // etcd compares a missing key's mod_revision as 0.
  etcdserverpb::Compare& compare = *request.add_compare();
  compare.set_result(etcdserverpb::Compare::EQUAL);
  compare.set_target(etcdserverpb::Compare::MOD);
  compare.set_key(std::string(key));
  compare.set_mod_revision(expected_mod_revision);
  etcdserverpb::PutRequest& put = *request.add_success()->mutable_request_put();
  put.set_key(std::string(key));
  put.set_value(std::string(value));
  put.set_lease(lease);
  etcdserverpb::TxnResponse response;
  TESSERA_RETURN_IF_ERROR(internal::Unary(
      *stubs_, what, /*retry_unavailable=*/false,
      [&](grpc::ClientContext* context) { return stubs_->kv->Txn(context, request, &response); }));
  return response.succeeded();
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(int64_t ttl_seconds) {
  const std::string what = absl::StrCat("GrantLease of ", ttl_seconds, " s");
  if (ttl_seconds < 1) return absl::InvalidArgumentError(absl::StrCat(what, ": TTL must be ≥ 1"));
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl_seconds);
  etcdserverpb::LeaseGrantResponse response;
  TESSERA_RETURN_IF_ERROR(internal::Unary(
      *stubs_, what, /*retry_unavailable=*/false, [&](grpc::ClientContext* context) {
        return stubs_->lease->LeaseGrant(context, request, &response);
      }));
  if (!response.error().empty() || response.id() == 0) {
    return absl::InternalError(absl::StrCat(what, " on etcd at ", options_.endpoint,
                                            ": no lease granted: ", response.error()));
  }
  return response.id();
}

absl::Status EtcdClient::RevokeLease(int64_t lease_id) {
  const std::string what = absl::StrCat("RevokeLease ", internal::LeaseName(lease_id));
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseRevokeResponse response;
  return internal::Unary(*stubs_, what, /*retry_unavailable=*/false,
                         [&](grpc::ClientContext* context) {
                           return stubs_->lease->LeaseRevoke(context, request, &response);
                         });
}

std::unique_ptr<LeaseKeepAlive> EtcdClient::KeepAlive(
    int64_t lease_id, std::function<void(const absl::Status&)> on_lost) {
  return std::unique_ptr<LeaseKeepAlive>(new LeaseKeepAlive(
      std::make_unique<internal::KeepAliveRunner>(stubs_, lease_id, std::move(on_lost))));
}

absl::StatusOr<std::unique_ptr<EtcdWatch>> EtcdClient::Watch(
    absl::string_view prefix, int64_t start_revision,
    std::function<void(const WatchEvent&)> on_event,
    std::function<void(const absl::Status&)> on_error) {
  if (start_revision < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Watch ", internal::Quoted(prefix), ": start revision ", start_revision, " is negative"));
  }
  auto runner = std::make_unique<internal::WatchRunner>(stubs_, prefix, start_revision,
                                                        std::move(on_event), std::move(on_error));
  TESSERA_RETURN_IF_ERROR(runner->WaitUntilCreated(options_.call_timeout));
  return std::unique_ptr<EtcdWatch>(new EtcdWatch(std::move(runner)));
}

}  // namespace tessera::cluster
