// A shard node's registration in etcd (DESIGN §7): what makes a `--role shard` node visible to
// routers, which watch the keys (server/cluster/cluster_state.h). It writes one key,
//   /tessera/nodes/<node_id>  =  {"address":"HOST:PORT","role":"shard","state":"serving"}
// attached to a lease of kNodeLeaseSeconds that a keepalive renews (every third of the TTL) for
// as long as the registration lives. When etcd reports the lease lost (it expired while etcd was
// out of reach for longer than its TTL, or it was revoked), a thread of the registration writes
// the key again under a new lease, every second until that succeeds. Destroying the registration
// (the node's shutdown, before it drains) deletes the key and revokes the lease, so that routers
// stop choosing the node at once; a node that dies without that leaves its key to expire with the
// lease, within the TTL.
#ifndef TESSERA_SERVER_CLUSTER_NODE_REGISTRATION_H_
#define TESSERA_SERVER_CLUSTER_NODE_REGISTRATION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/cluster/etcd_client.h"
#include "tessera/base/mutex.h"

namespace tessera::cluster {

inline constexpr int64_t kNodeLeaseSeconds = 10;

// The key and value a shard node registers (see the file comment).
std::string NodeKey(absl::string_view node_id);
std::string NodeValue(absl::string_view address);

// Thread-safe: its state is its own thread's and the keepalive's, under its lock.
class NodeRegistration {
 public:
  // Grants the lease and writes NodeKey(node_id) = NodeValue(address): the node is visible to
  // routers when this returns. The etcd client's error (UNAVAILABLE while etcd is out of reach)
  // otherwise, with nothing left registered (a lease granted for a key that could not be written
  // is revoked).
  static absl::StatusOr<std::unique_ptr<NodeRegistration>> Start(std::unique_ptr<EtcdClient> etcd,
                                                                 absl::string_view node_id,
                                                                 absl::string_view address);
  // Stops re-registering, deletes the key and revokes the lease (best effort, logged: the lease
  // expires anyway).
  ~NodeRegistration();
  NodeRegistration(const NodeRegistration&) = delete;
  NodeRegistration& operator=(const NodeRegistration&) = delete;

  const std::string& key() const { return key_; }

 private:
  NodeRegistration(std::unique_ptr<EtcdClient> etcd, std::string key, std::string value)
      : etcd_(std::move(etcd)), key_(std::move(key)), value_(std::move(value)) {}

  // Grants a lease, writes the key under it and keeps it alive.
  absl::Status RegisterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers again whenever the lease is lost, until stopped.
  void Loop();

  const std::unique_ptr<EtcdClient> etcd_;
  const std::string key_;
  const std::string value_;
  Mutex mu_;
  CondVar cv_;  // signalled when lost_ or stop_ is set
  std::unique_ptr<LeaseKeepAlive> keepalive_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // runs Loop(); not joinable when Start failed
};

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_NODE_REGISTRATION_H_
