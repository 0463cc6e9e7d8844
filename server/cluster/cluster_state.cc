#include "server/cluster/cluster_state.h"

#include <google/protobuf/util/json_util.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace tessera::cluster {
namespace {

using server::Log;

constexpr absl::string_view kPrefix = "/tessera/";

}  // namespace

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // Serialising a message we built cannot fail: it has no Any fields to resolve.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

absl::Status FromJson(absl::string_view key, absl::string_view json,
                      google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // written by a newer version
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), message, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd key '", key, "': not a ",
                                                   message->GetTypeName(), ": ",
                                                   parsed.message().as_string()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ClusterState>> ClusterState::Start(EtcdClient* etcd) {
  auto state = std::unique_ptr<ClusterState>(new ClusterState(etcd));
  const absl::Status synced = state->Resync();
  if (!synced.ok()) return synced;
  state->resync_thread_ = std::thread([s = state.get()] { s->ResyncLoop(); });
  return state;
}

ClusterState::~ClusterState() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  changed_.SignalAll();
  if (resync_thread_.joinable()) resync_thread_.join();
  watch_.reset();
}

absl::Status ClusterState::Resync() {
  watch_.reset();  // no event of the old watch lands after the fresh read
  absl::StatusOr<RangeResult> read = etcd_->GetPrefix(kPrefix);
  if (!read.ok()) return read.status();
  {
    MutexLock lock(&mu_);
    nodes_.clear();
    collections_.clear();
    revision_ = read->revision;
    watch_failed_ = false;
  }
  for (const KeyValue& kv : read->kvs) {
    WatchEvent event;
    event.kv = kv;
    event.kv.mod_revision = read->revision;
    Apply(event);
  }
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch = etcd_->Watch(
      kPrefix, read->revision + 1, [this](const WatchEvent& event) { Apply(event); },
      [this](const absl::Status& status) {
        Log("warning", "etcd watch ended; reading the cluster state again",
            {{"error", std::string(status.message())}});
        MutexLock lock(&mu_);
        watch_failed_ = true;
        changed_.SignalAll();
      });
  if (!watch.ok()) return watch.status();
  watch_ = *std::move(watch);
  return absl::OkStatus();
}

void ClusterState::ResyncLoop() {
  MutexLock lock(&mu_);
  while (!stop_) {
    if (!watch_failed_) {
      changed_.Wait(&mu_);
      continue;
    }
    mu_.Unlock();
    const absl::Status synced = Resync();
    mu_.Lock();
    if (!synced.ok()) {
      Log("warning", "cannot read the cluster state; retrying",
          {{"error", std::string(synced.message())}});
      watch_failed_ = true;
      changed_.WaitWithTimeout(&mu_, absl::Seconds(1));
    }
  }
}

void ClusterState::Apply(const WatchEvent& event) {
  const std::string& key = event.kv.key;
  const bool put = event.type == WatchEvent::Type::kPut;
  MutexLock lock(&mu_);
  if (absl::StartsWith(key, kNodesPrefix)) {
    const std::string id = key.substr(kNodesPrefix.size());
    v1::NodeRegistration registration;
    if (put && FromJson(key, event.kv.value, &registration).ok() &&
        registration.role() == "shard" && !registration.address().empty()) {
      if (nodes_.count(id) == 0) {
        Log("info", "shard node up", {{"node", id}, {"address", registration.address()}});
      }
      nodes_[id] = LiveNode{id, registration.address()};
    } else if (nodes_.erase(id) > 0) {
      Log("warning", "shard node down (its registration is gone)", {{"node", id}});
    }
  } else if (absl::StartsWith(key, kCollectionsPrefix)) {
    const std::string name = key.substr(kCollectionsPrefix.size());
    CollectionEntry entry;
    const absl::Status parsed =
        put ? FromJson(key, event.kv.value, &entry.collection) : absl::NotFoundError("deleted");
    if (parsed.ok()) {
      entry.mod_revision = event.kv.mod_revision;
      collections_[name] = std::move(entry);
    } else {
      if (put)
        Log("warning", "ignoring a collection key", {{"error", std::string(parsed.message())}});
      collections_.erase(name);
    }
  }
  revision_ = std::max(revision_, event.kv.mod_revision);
  changed_.SignalAll();
}

std::vector<LiveNode> ClusterState::LiveNodes() const {
  ReaderMutexLock lock(&mu_);
  std::vector<LiveNode> nodes;
  for (const auto& [id, node] : nodes_) nodes.push_back(node);
  return nodes;
}

std::optional<std::string> ClusterState::AddressOf(const std::string& node_id) const {
  ReaderMutexLock lock(&mu_);
  const auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return std::nullopt;
  return it->second.address;
}

absl::StatusOr<std::optional<CollectionEntry>> ClusterState::Lookup(const std::string& name) {
  {
    ReaderMutexLock lock(&mu_);
    const auto it = collections_.find(name);
    if (it != collections_.end()) return it->second;
  }
  return ReadFromEtcd(name);
}

absl::StatusOr<std::optional<CollectionEntry>> ClusterState::ReadFromEtcd(
    const std::string& name) const {
  const std::string key = absl::StrCat(kCollectionsPrefix, name);
  absl::StatusOr<std::optional<KeyValue>> read = etcd_->Get(key);
  if (!read.ok()) return read.status();
  if (!read->has_value()) return std::nullopt;
  CollectionEntry entry;
  const absl::Status parsed = FromJson(key, (*read)->value, &entry.collection);
  if (!parsed.ok()) return absl::DataLossError(parsed.message());
  entry.mod_revision = (*read)->mod_revision;
  return entry;
}

std::vector<std::string> ClusterState::CollectionsIn(v1::ClusterCollection::State state) const {
  ReaderMutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, entry] : collections_) {
    if (entry.collection.state() == state) names.push_back(name);
  }
  return names;
}

void ClusterState::WaitForRevision(int64_t revision, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  while (revision_ < revision && !stop_) {
    if (changed_.WaitWithTimeout(&mu_, deadline - absl::Now())) break;
  }
}

}  // namespace tessera::cluster
