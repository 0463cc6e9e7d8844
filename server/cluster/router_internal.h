// What the router's files share (server/cluster/router*.cc): names of shards and etcd keys,
// which failures another replica may not have, and the cluster key on a shard call. Internal to
// the router.
#ifndef TESSERA_SERVER_CLUSTER_ROUTER_INTERNAL_H_
#define TESSERA_SERVER_CLUSTER_ROUTER_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/cluster/cluster_state.h"

namespace tessera::cluster {

// The shards 0 … n - 1.
inline std::vector<uint32_t> AllShards(uint32_t n) {
  std::vector<uint32_t> shards(n);
  for (uint32_t s = 0; s < n; ++s) shards[s] = s;
  return shards;
}

// A failure that another replica may not have: try the next one.
inline bool Retryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

// A call to a shard node: with `key` as the API key when there is one.
inline std::unique_ptr<grpc::ClientContext> WithKey(std::unique_ptr<grpc::ClientContext> context,
                                                    const std::string& key) {
  if (!key.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", key));
  return context;
}

inline std::string CollectionKey(const std::string& name) {
  return absl::StrCat(kCollectionsPrefix, name);
}

inline uint32_t ShardCount(const v1::ClusterCollection& collection) {
  return static_cast<uint32_t>(collection.shards_size());
}

// "shard 2 of collection 'papers'".
inline std::string ShardName(const std::string& collection, uint32_t shard) {
  return absl::StrCat("shard ", shard, " of collection '", collection, "'");
}

// Collection `name` as etcd holds it now, when it is in `state`; nullopt otherwise (absent, in
// another state, or unreadable: the caller's pass tries again later).
inline std::optional<CollectionEntry> ReadIn(const ClusterState& cluster, const std::string& name,
                                             v1::ClusterCollection::State state) {
  absl::StatusOr<std::optional<CollectionEntry>> read = cluster.ReadFromEtcd(name);
  if (!read.ok() || !read->has_value() || (*read)->collection.state() != state) {
    return std::nullopt;
  }
  return *std::move(*read);
}

}  // namespace tessera::cluster

#endif  // TESSERA_SERVER_CLUSTER_ROUTER_INTERNAL_H_
