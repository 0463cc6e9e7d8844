// A router's view of the cluster metadata in etcd (DESIGN §7), kept current by a watch:
//   /tessera/nodes/<node_id>        NodeRegistration JSON, under the node's lease: a node is live
//                                   while its key exists (a lost node's key expires with its
//                                   lease, within its 10 s TTL);
//   /tessera/collections/<name>     ClusterCollection JSON: schema, state and shard map.
// Values are the JSON form of the messages in proto/tessera/v1/shard.proto, so `etcdctl get
// --prefix /tessera/` reads them. Every change to the shard map is a transaction on the
// collection's key (create-if-absent, compare-and-swap on its revision), so concurrent routers
// never overwrite each other.
#ifndef TESSERA_SERVER_CLUSTER_CLUSTER_STATE_H_
#define TESSERA_SERVER_CLUSTER_CLUSTER_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/cluster/etcd_client.h"
#include "tessera/base/mutex.h"
#include "tessera/v1/shard.pb.h"

namespace tessera::cluster {

inline constexpr absl::string_view kNodesPrefix = "/tessera/nodes/";
inline constexpr absl::string_view kCollectionsPrefix = "/tessera/collections/";

struct LiveNode {
  std::string id;
  std::string address;
};

// A collection's metadata and the revision of its key, for compare-and-swap.
struct CollectionEntry {
  v1::ClusterCollection collection;
  int64_t mod_revision = 0;
};

// The JSON the keys hold (protobuf's JSON mapping); INVALID_ARGUMENT naming the key otherwise.
std::string ToJson(const google::protobuf::Message& message);
absl::Status FromJson(absl::string_view key, absl::string_view json,
                      google::protobuf::Message* message);

// Thread-safe.
class ClusterState {
 public:
  // Reads every key under /tessera/ and watches from there. `etcd` outlives the state.
  static absl::StatusOr<std::unique_ptr<ClusterState>> Start(EtcdClient* etcd);
  ~ClusterState();
  ClusterState(const ClusterState&) = delete;
  ClusterState& operator=(const ClusterState&) = delete;

  // Live shard nodes, by id.
  std::vector<LiveNode> LiveNodes() const;
  // The address of a live node; nullopt when it is not registered.
  std::optional<std::string> AddressOf(const std::string& node_id) const;

  // The collection in any state. A name this view does not hold is read from etcd before it is
  // called unknown, so a collection another router created a moment ago is found.
  absl::StatusOr<std::optional<CollectionEntry>> Lookup(const std::string& name);
  // The collection as etcd holds it now, not as this view last saw it: what a compare-and-swap on
  // its revision must start from. DATA_LOSS for a value that does not parse.
  absl::StatusOr<std::optional<CollectionEntry>> ReadFromEtcd(const std::string& name) const;
  // The names of the collections in `state` (READY: the ones clients see), sorted.
  std::vector<std::string> CollectionsIn(v1::ClusterCollection::State state) const;

  // Blocks until the view reflects etcd's revision `revision` (e.g. the router's own write), or
  // `timeout` passes.
  void WaitForRevision(int64_t revision, absl::Duration timeout) const;

  EtcdClient* etcd() const { return etcd_; }

 private:
  explicit ClusterState(EtcdClient* etcd) : etcd_(etcd) {}
  // Replaces the view with a fresh read and watches from its revision.
  absl::Status Resync();
  void Apply(const WatchEvent& event);
  void ResyncLoop();

  EtcdClient* const etcd_;
  mutable Mutex mu_;
  mutable CondVar changed_;
  std::map<std::string, LiveNode> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CollectionEntry> collections_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;  // the last revision applied
  bool watch_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<EtcdWatch> watch_;  // replaced only by Start and the resync thread
  std::thread resync_thread_;
};

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_CLUSTER_STATE_H_
