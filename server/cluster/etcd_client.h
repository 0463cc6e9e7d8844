// A small synchronous client for etcd's v3 gRPC API, the store of the cluster's metadata
// (collection schemas, the shard map, node registrations held by leases; DESIGN §7). It covers
// what the router and shard roles need: reads of a key or a prefix, writes, deletes, two
// transactions (create-if-absent, compare-and-swap), leases kept alive on a thread of their own,
// and prefix watches that resume where they left off when the stream breaks.
//
// Every call and every stream share one gRPC channel to one endpoint, plaintext or TLS (see
// EtcdClientOptions::credentials). A call waits for the channel to connect until its deadline (as
// etcd's clientv3 does): while etcd cannot be reached each call returns UNAVAILABLE when its
// deadline passes, and one made while etcd comes back within it succeeds. Connection attempts are
// at most `max_reconnect_backoff` apart. A connection that cannot be set up because the transport
// security does not match (plaintext against a TLS etcd, a certificate the other side does not
// accept) counts as etcd not being reachable: UNAVAILABLE when the deadline passes.
//
// Error messages name the operation, the key and the endpoint:
//   "Get 'cluster/schemas/papers': etcd at 10.0.0.5:2379 unavailable: cannot connect within 5s".
#ifndef TESSERA_SERVER_CLUSTER_ETCD_CLIENT_H_
#define TESSERA_SERVER_CLUSTER_ETCD_CLIENT_H_

#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tessera::cluster {

namespace internal {
struct EtcdStubs;
class KeepAliveRunner;
class WatchRunner;
}  // namespace internal

struct EtcdClientOptions {
  std::string endpoint;  // "HOST:PORT" of an etcd member's client URL
  // How to reach that URL. Null: plaintext, for an http:// URL. For an https:// one, TLS
  // credentials that trust the CA of etcd's --cert-file and, when etcd runs with
  // --client-cert-auth, present a client certificate signed by its --trusted-ca-file's CA
  // (server/credentials.h: NewClusterChannelCredentials makes them from PEM files). The name
  // verified against etcd's certificate is the endpoint's HOST.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  absl::Duration call_timeout = absl::Seconds(5);  // deadline of every unary call; > 0
  // Longest wait between two connection attempts while etcd is unreachable (gRPC's default
  // grows to 2 minutes); > 0.
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // HTTP/2 pings on a connection with open calls, so that a watch or keepalive stream on a dead
  // connection (a peer gone without a TCP reset) fails within keepalive_time + 5 s and resumes.
  // etcd refuses pings more often than its --grpc-keepalive-min-time (default 5 s).
  absl::Duration keepalive_time = absl::Seconds(10);
};

// One key as etcd stores it. Revisions are the store's: every write transaction increments it.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // revision of the write that created the key
  int64_t mod_revision = 0;  // revision of the key's last write (of its deletion in a delete event)
  int64_t version = 0;       // writes since the key was created, 1 for the first
  int64_t lease = 0;         // lease the key is attached to, 0 for none
};

struct RangeResult {
  std::vector<KeyValue> kvs;  // ascending by key (bytewise)
  // The store's revision this read saw: a Watch from revision + 1 misses no later change.
  int64_t revision = 0;
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  // kPut: the key as written. kDelete: only key and mod_revision (the deletion's revision) are
  // set. A lease that expires deletes its keys: a kDelete each.
  KeyValue kv;
};

// Renews one lease until destroyed (see EtcdClient::KeepAlive). Thread-safe.
class LeaseKeepAlive {
 public:
  // Stops renewing and joins the thread; does not revoke the lease, which then expires after its
  // TTL.
  ~LeaseKeepAlive();
  LeaseKeepAlive(const LeaseKeepAlive&) = delete;
  LeaseKeepAlive& operator=(const LeaseKeepAlive&) = delete;

  int64_t lease_id() const;
  // When etcd last confirmed a renewal; absl::InfinitePast() before the first.
  absl::Time last_renewed() const;

 private:
  friend class EtcdClient;
  explicit LeaseKeepAlive(std::unique_ptr<internal::KeepAliveRunner> runner);
  std::unique_ptr<internal::KeepAliveRunner> runner_;
};

// A running prefix watch (see EtcdClient::Watch). Thread-safe.
class EtcdWatch {
 public:
  // Cancels the stream and joins the thread: no callback runs after it returns. Must not be
  // called from the watch's own callbacks.
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // The revision the next delivered event will have at least: the last delivered event's
  // revision + 1, or the start revision.
  int64_t next_revision() const;

 private:
  friend class EtcdClient;
  explicit EtcdWatch(std::unique_ptr<internal::WatchRunner> runner);
  std::unique_ptr<internal::WatchRunner> runner_;
};

// Thread-safe. Keys and values are arbitrary bytes; a key must not be empty.
class EtcdClient {
 public:
  // INVALID_ARGUMENT for an endpoint that is not HOST:PORT or a non-positive duration. Does not
  // contact etcd: the first call connects.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(EtcdClientOptions options);
  // Watches and keepalives made by this client may outlive it.
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::string& endpoint() const { return options_.endpoint; }

  // Every call below is one linearizable etcd request with deadline `call_timeout` (a read that
  // fails with UNAVAILABLE is tried again within it). It returns UNAVAILABLE when etcd cannot be
  // reached or does not answer within the deadline (a write may still have been applied: one that
  // failed so is in doubt), INVALID_ARGUMENT for an empty key, and otherwise what etcd answers,
  // with the gRPC code as the absl code.

  // The key, or nullopt when it does not exist.
  absl::StatusOr<std::optional<KeyValue>> Get(absl::string_view key);
  // Every key that starts with `prefix` ("" for all keys), in one read.
  absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix);

  // Writes the key, attached to `lease` when not 0 (NOT_FOUND when that lease does not exist).
  // Returns the revision of the write (the key's new mod_revision).
  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value, int64_t lease = 0);
  // Return the number of keys deleted (0 when none existed).
  absl::StatusOr<int64_t> Delete(absl::string_view key);
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix);

  // Writes every pair, all attached to `lease` when not 0, only if none of the keys exists, in
  // one transaction. True when it wrote them, false (and wrote nothing) when any key existed.
  // INVALID_ARGUMENT for no pairs or a repeated key; etcd refuses more than its --max-txn-ops
  // (default 128) with INVALID_ARGUMENT.
  absl::StatusOr<bool> CreateIfAbsent(absl::Span<const std::pair<std::string, std::string>> kvs,
                                      int64_t lease = 0);
  // Writes `value` to `key` only if the key's mod_revision is `expected_mod_revision` (0: only if
  // the key does not exist). True when it wrote.
  absl::StatusOr<bool> CompareAndSwap(absl::string_view key, int64_t expected_mod_revision,
                                      absl::string_view value, int64_t lease = 0);

  // A new lease of `ttl_seconds` (≥ 1; etcd raises a TTL below its minimum, 1.5 election
  // timeouts, to that minimum). Returns its id (never 0).
  absl::StatusOr<int64_t> GrantLease(int64_t ttl_seconds);
  // Ends the lease now, deleting its keys. NOT_FOUND when it does not exist (expired, revoked).
  absl::Status RevokeLease(int64_t lease_id);

  // Renews `lease_id` on a thread of its own over a LeaseKeepAlive stream, every third of the
  // lease's TTL, until the returned object is destroyed. A broken stream is reopened (after at
  // most `max_reconnect_backoff`) for as long as it takes. `on_lost` runs once, on that thread,
  // with NOT_FOUND when etcd answers that the lease no longer exists (it expired, e.g. while etcd
  // was out of reach for longer than the TTL, or was revoked); renewing then stops. While etcd is
  // out of reach nothing is reported: last_renewed() says how long it has been. A connection that
  // dies silently is noticed by the channel's pings (keepalive_time + 5 s): give leases a longer
  // TTL, so that renewals resume on a new connection in time.
  std::unique_ptr<LeaseKeepAlive> KeepAlive(int64_t lease_id,
                                            std::function<void(const absl::Status&)> on_lost);

  // Watches every key under `prefix` from `start_revision` (≥ 1: events at that revision and
  // later, so RangeResult::revision + 1 continues a read; 0: from the revision at which the watch
  // is created). `on_event` runs on the watch's thread for each put and delete, one at a time, in
  // revision order (the events of one transaction in their order in it), each exactly once: when
  // the stream breaks (etcd restarts, the connection drops) the watch reopens it from the
  // revision after the last delivered event. `on_error` runs at most once, on that thread, when
  // the watch ends for good: OUT_OF_RANGE when the revision to continue from has been compacted
  // away (the caller must re-read with GetPrefix and watch again), or the reason etcd cancelled
  // it. Either callback may be empty.
  //
  // Returns once etcd has confirmed the watch: events written after that are delivered. Returns
  // UNAVAILABLE when no confirmation arrives within `call_timeout`.
  absl::StatusOr<std::unique_ptr<EtcdWatch>> Watch(
      absl::string_view prefix, int64_t start_revision,
      std::function<void(const WatchEvent&)> on_event,
      std::function<void(const absl::Status&)> on_error = nullptr);

 private:
  EtcdClient(EtcdClientOptions options, std::shared_ptr<internal::EtcdStubs> stubs);

  const EtcdClientOptions options_;
  // Shared with the keepalive and watch threads.
  const std::shared_ptr<internal::EtcdStubs> stubs_;
};

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_ETCD_CLIENT_H_
