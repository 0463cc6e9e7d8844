// Snapshots of cluster collections through a router: the router's SnapshotStore
// (ServiceContext::snapshots), so the AdminService's snapshot handlers serve it unchanged.
//
// - Create: the router holds the collection's writes (Router::WritesOf, exclusively) while one
//   serving replica of every shard snapshots itself (ShardService.CreateReplicaSnapshot, all at
//   once through CallTargets): every shard is at one cut of this router's acknowledged writes.
//   With several routers writing the same collection, the cut would need a fence in etcd that
//   every router's writes wait on (not done: each router's own writes are cut consistently). The
//   snapshot is recorded in etcd under /tessera/snapshots/<id> (ClusterSnapshot JSON: schema,
//   replicas per shard, per shard the node and its local snapshot id); List, Get and Delete read
//   it there.
// - Archive (download): version 1 of the format (tessera/snapshot.h, whose SnapshotArchiveReader
//   and EncodeSnapshotArchiveHead frame it) whose manifest is a cluster manifest, and whose files
//   are the shards' own archives, streamed in shard order from the nodes that hold them:
//     tessera-cluster-snapshot 1 / id / collection / created_unix_micros / cut_micros /
//     replicas <n> / schema <base64 of the CollectionSchema> / shard <i> <archive bytes> (each)
//   A shard's archive carries its own CRC-32s, which the nodes verify as they restore it.
// - Restore (from an archive, or by id: the same archive piped from the nodes): placed like a
//   create (a CREATING key in etcd, replica r of shard s on live node (h + s + r) mod n), each
//   shard's archive streamed to every replica of it (ShardService.RestoreReplicaSnapshot), then
//   the key made READY; on any failure the restored replicas are dropped and the key deleted.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/cluster/router.h"
#include "server/cluster/shard_service.h"
#include "server/convert.h"
#include "server/log.h"
#include "tessera/document.h"
#include "tessera/status_macros.h"
#include "tessera/wire/status.h"

namespace tessera::cluster {
namespace {

using server::Log;
using wire::FromGrpcStatus;

constexpr absl::string_view kSnapshotsPrefix = "/tessera/snapshots/";
constexpr uint32_t kMaxManifestBytes = 1u << 20;
constexpr size_t kChunkBytes = size_t{1} << 20;

std::string SnapshotKey(const std::string& id) { return absl::StrCat(kSnapshotsPrefix, id); }

std::string NewId(const std::string& collection) {
  static std::atomic<uint32_t> counter{0};
  const uint32_t salt =
      static_cast<uint32_t>(absl::ToUnixNanos(absl::Now())) ^ (counter.fetch_add(1) * 0x9e3779b9u);
  return absl::StrCat(collection, "@",
                      absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone()), "-",
                      absl::StrFormat("%08x", salt));
}

// The snapshot's manifest as the handlers show it: one "file" per shard, its archive.
SnapshotManifest ManifestOf(const v1::ClusterSnapshot& snapshot) {
  SnapshotManifest manifest;
  manifest.id = snapshot.info().id();
  manifest.collection = snapshot.info().collection();
  manifest.created_unix_micros = snapshot.info().created_unix_micros();
  manifest.num_shards = snapshot.shards_size();
  manifest.cut_micros = static_cast<int64_t>(snapshot.info().cut_seconds() * 1e6);
  for (int s = 0; s < snapshot.shards_size(); ++s) {
    SnapshotFile file;
    file.path = absl::StrFormat("shard-%03d.tsnap", s);
    file.size = static_cast<int64_t>(snapshot.shards(s).archive_bytes());
    manifest.files.push_back(file);
  }
  return manifest;
}

std::string EncodeClusterManifest(const v1::ClusterSnapshot& snapshot) {
  std::string text = "tessera-cluster-snapshot 1\n";
  absl::StrAppend(&text, "id ", snapshot.info().id(), "\n");
  absl::StrAppend(&text, "collection ", snapshot.info().collection(), "\n");
  absl::StrAppend(&text, "created_unix_micros ", snapshot.info().created_unix_micros(), "\n");
  absl::StrAppend(&text, "cut_micros ", static_cast<int64_t>(snapshot.info().cut_seconds() * 1e6),
                  "\n");
  absl::StrAppend(&text, "replicas ", snapshot.replicas(), "\n");
  absl::StrAppend(&text, "schema ", absl::Base64Escape(snapshot.schema().SerializeAsString()),
                  "\n");
  for (int s = 0; s < snapshot.shards_size(); ++s) {
    absl::StrAppend(&text, "shard ", s, " ", snapshot.shards(s).archive_bytes(), "\n");
  }
  return text;
}

absl::StatusOr<v1::ClusterSnapshot> DecodeClusterManifest(absl::string_view text) {
  const auto bad = [](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("cluster snapshot archive: manifest: ", why));
  };
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != "tessera-cluster-snapshot 1") {
    return bad(
        "not headed by \"tessera-cluster-snapshot 1\" (a standalone server's snapshot is restored "
        "on a standalone server)");
  }
  v1::ClusterSnapshot snapshot;
  bool has_schema = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<absl::string_view> fields = absl::StrSplit(lines[i], ' ');
    const absl::string_view key = fields[0];
    int64_t number = 0;
    if (key == "id" && fields.size() == 2) {
      snapshot.mutable_info()->set_id(std::string(fields[1]));
    } else if (key == "collection" && fields.size() == 2) {
      snapshot.mutable_info()->set_collection(std::string(fields[1]));
    } else if (key == "created_unix_micros" && fields.size() == 2 &&
               absl::SimpleAtoi(fields[1], &number)) {
      snapshot.mutable_info()->set_created_unix_micros(number);
    } else if (key == "cut_micros" && fields.size() == 2 && absl::SimpleAtoi(fields[1], &number)) {
      snapshot.mutable_info()->set_cut_seconds(static_cast<double>(number) / 1e6);
    } else if (key == "replicas" && fields.size() == 2 && absl::SimpleAtoi(fields[1], &number) &&
               number >= 1 && number <= 64) {
      snapshot.set_replicas(static_cast<uint32_t>(number));
    } else if (key == "schema" && fields.size() == 2) {
      std::string bytes;
      if (!absl::Base64Unescape(fields[1], &bytes) ||
          !snapshot.mutable_schema()->ParseFromString(bytes)) {
        return bad("the schema line does not decode");
      }
      has_schema = true;
    } else if (key == "shard" && fields.size() == 3 && absl::SimpleAtoi(fields[1], &number) &&
               number == snapshot.shards_size()) {
      uint64_t bytes = 0;
      // An archive's size is an int64 in the framing (tessera/snapshot.h).
      if (!absl::SimpleAtoi(fields[2], &bytes) ||
          bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(absl::StrCat("line ", i + 1, " ", QuotedForMessage(lines[i])));
      }
      snapshot.add_shards()->set_archive_bytes(bytes);
    } else {
      return bad(absl::StrCat("line ", i + 1, " ", QuotedForMessage(lines[i])));
    }
  }
  if (!has_schema || snapshot.shards_size() == 0 || snapshot.replicas() == 0 ||
      snapshot.shards_size() != static_cast<int>(snapshot.schema().num_shards())) {
    return bad("schema, replicas or shards missing");
  }
  snapshot.mutable_info()->set_num_shards(static_cast<uint32_t>(snapshot.shards_size()));
  return snapshot;
}

}  // namespace

class RouterSnapshots final : public SnapshotStore {
 public:
  explicit RouterSnapshots(Router* router) : router_(router) {}

  absl::StatusOr<SnapshotManifest> Create(const std::string& collection) override;
  absl::StatusOr<std::vector<SnapshotManifest>> List(const std::string& collection) const override;
  absl::StatusOr<SnapshotManifest> Get(const std::string& id) const override {
    TESSERA_ASSIGN_OR_RETURN(const v1::ClusterSnapshot snapshot, Read(id));
    return ManifestOf(snapshot);
  }
  absl::Status Delete(const std::string& id) override;
  absl::StatusOr<std::unique_ptr<SnapshotArchive>> OpenArchive(const std::string& id,
                                                               size_t chunk_bytes) const override;
  std::unique_ptr<SnapshotRestore> NewRestore(const std::string& new_name) override;
  absl::StatusOr<SnapshotManifest> RestoreLocal(const std::string& id,
                                                const std::string& new_name) override;

  absl::StatusOr<v1::ClusterSnapshot> Read(const std::string& id) const {
    if (id.find('@') == std::string::npos || id.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot id ", QuotedForMessage(id),
                       ", expected <collection>@<time>-<hex> as CreateSnapshot returns it"));
    }
    const std::string key = SnapshotKey(id);
    TESSERA_ASSIGN_OR_RETURN(const std::optional<KeyValue> kv, router_->state_->etcd()->Get(key));
    if (!kv.has_value()) {
      return absl::NotFoundError(absl::StrCat("snapshot ", QuotedForMessage(id), " not found"));
    }
    v1::ClusterSnapshot snapshot;
    TESSERA_RETURN_IF_ERROR(FromJson(key, kv->value, &snapshot));
    return snapshot;
  }

  Router* router() const { return router_; }

 private:
  Router* const router_;
};

absl::StatusOr<SnapshotManifest> RouterSnapshots::Create(const std::string& collection) {
  Router* const r = router_;
  std::vector<std::pair<uint32_t, std::string>> targets;
  std::vector<v1::ShardSnapshotRequest> requests;
  std::vector<v1::ShardSnapshotResponse> responses;
  std::vector<absl::Status> statuses;
  v1::ClusterSnapshot snapshot;
  {
    MutexLock writes(r->WritesOf(collection));
    const auto start = absl::Now();
    TESSERA_ASSIGN_OR_RETURN(const CollectionEntry entry, r->ReadyCollection(collection));
    const uint32_t shards = static_cast<uint32_t>(entry.collection.shards_size());
    for (uint32_t s = 0; s < shards; ++s) {
      const v1::ShardPlacement& placement = entry.collection.shards(static_cast<int>(s));
      const std::vector<std::string> order = r->ReadOrder(placement);
      if (order.empty()) {
        return absl::UnavailableError(absl::StrCat("shard ", s, " of collection '", collection,
                                                   "': no serving replica to snapshot"));
      }
      targets.emplace_back(s, order.front());
    }
    requests.resize(targets.size());
    responses.resize(targets.size());
    statuses = r->CallTargets(
        targets, absl::Now() + r->options_.shard_call_timeout, [&](size_t i) -> Router::MakeCall {
          requests[i].set_collection(collection);
          requests[i].set_shard(targets[i].first);
          return [&, i](v1::ShardService::Stub* stub) {
            return UnaryCall(stub, &v1::ShardService::Stub::AsyncCreateReplicaSnapshot,
                             &requests[i], &responses[i]);
          };
        });
    snapshot.mutable_info()->set_cut_seconds(absl::ToDoubleSeconds(absl::Now() - start));
    *snapshot.mutable_schema() = entry.collection.schema();
    snapshot.set_replicas(static_cast<uint32_t>(entry.collection.shards(0).replicas_size()));
  }
  absl::Status failed;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!statuses[i].ok() && failed.ok()) {
      failed = absl::Status(
          statuses[i].code(),
          absl::StrCat("shard ", targets[i].first, " of collection '", collection, "' on node '",
                       targets[i].second, "': ", statuses[i].message()));
    }
  }
  const auto undo = [&] {
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!statuses[i].ok()) continue;
      absl::StatusOr<v1::ShardService::Stub*> stub = r->StubOf(targets[i].second);
      if (!stub.ok()) continue;
      v1::DeleteSnapshotRequest request;
      request.set_id(responses[i].snapshot().id());
      v1::DeleteSnapshotResponse response;
      (*stub)->DeleteReplicaSnapshot(r->ShardCall(r->options_.shard_call_timeout).get(), request,
                                     &response);
    }
  };
  if (!failed.ok()) {
    undo();
    return failed;
  }
  const std::string id = NewId(collection);
  snapshot.mutable_info()->set_id(id);
  snapshot.mutable_info()->set_collection(collection);
  snapshot.mutable_info()->set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
  snapshot.mutable_info()->set_num_shards(static_cast<uint32_t>(targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) {
    v1::ReplicaSnapshot* shard = snapshot.add_shards();
    shard->set_node_id(targets[i].second);
    shard->set_local_id(responses[i].snapshot().id());
    shard->set_archive_bytes(responses[i].archive_bytes());
  }
  const absl::StatusOr<bool> recorded =
      r->state_->etcd()->CreateIfAbsent({{SnapshotKey(id), ToJson(snapshot)}});
  if (!recorded.ok() || !*recorded) {
    undo();
    return recorded.ok() ? absl::AbortedError(absl::StrCat("snapshot id ", id, " taken"))
                         : recorded.status();
  }
  return ManifestOf(snapshot);
}

absl::StatusOr<std::vector<SnapshotManifest>> RouterSnapshots::List(
    const std::string& collection) const {
  TESSERA_ASSIGN_OR_RETURN(const RangeResult range, router_->state_->etcd()->GetPrefix(absl::StrCat(
                                                        kSnapshotsPrefix, collection, "@")));
  std::vector<SnapshotManifest> manifests;
  for (const KeyValue& kv : range.kvs) {
    v1::ClusterSnapshot snapshot;
    TESSERA_RETURN_IF_ERROR(FromJson(kv.key, kv.value, &snapshot));
    if (snapshot.info().collection() != collection) continue;
    manifests.push_back(ManifestOf(snapshot));
  }
  std::sort(manifests.begin(), manifests.end(),
            [](const SnapshotManifest& a, const SnapshotManifest& b) {
              return a.created_unix_micros < b.created_unix_micros;
            });
  return manifests;
}

absl::Status RouterSnapshots::Delete(const std::string& id) {
  TESSERA_ASSIGN_OR_RETURN(const v1::ClusterSnapshot snapshot, Read(id));
  for (int s = 0; s < snapshot.shards_size(); ++s) {
    const v1::ReplicaSnapshot& shard = snapshot.shards(s);
    TESSERA_ASSIGN_OR_RETURN(v1::ShardService::Stub* const stub, router_->StubOf(shard.node_id()));
    v1::DeleteSnapshotRequest request;
    request.set_id(shard.local_id());
    v1::DeleteSnapshotResponse response;
    const absl::Status status = FromGrpcStatus(stub->DeleteReplicaSnapshot(
        router_->ShardCall(router_->options_.shard_call_timeout).get(), request, &response));
    if (!status.ok() && !absl::IsNotFound(status)) {
      return absl::Status(
          status.code(), absl::StrCat("snapshot ", QuotedForMessage(id), " shard ", s, " on node '",
                                      shard.node_id(), "': ", status.message()));
    }
  }
  return router_->state_->etcd()->Delete(SnapshotKey(id)).status();
}

// The cluster archive: head and cluster manifest, then each shard's archive as its node streams
// it (one stream at a time), then the trailer.
class ClusterArchive final : public SnapshotArchive {
 public:
  ClusterArchive(RouterSnapshots* store, v1::ClusterSnapshot snapshot)
      : store_(store), snapshot_(std::move(snapshot)), manifest_(ManifestOf(snapshot_)) {}
  ~ClusterArchive() override {
    if (context_ != nullptr) context_->TryCancel();
    if (reader_ != nullptr) reader_->Finish().ok();
  }

  const SnapshotManifest& manifest() const override { return manifest_; }

  absl::StatusOr<std::string> Next() override {
    if (!started_) {
      started_ = true;
      return EncodeSnapshotArchiveHead(EncodeClusterManifest(snapshot_));
    }
    while (shard_ < snapshot_.shards_size()) {
      const v1::ReplicaSnapshot& shard = snapshot_.shards(shard_);
      if (reader_ == nullptr) {
        TESSERA_ASSIGN_OR_RETURN(v1::ShardService::Stub* const stub,
                                 store_->router()->StubOf(shard.node_id()));
        context_ = store_->router()->ShardCall(store_->router()->options_.copy_timeout);
        v1::DownloadSnapshotRequest request;
        request.set_id(shard.local_id());
        reader_ = stub->DownloadReplicaSnapshot(context_.get(), request);
        sent_ = 0;
      }
      if (reader_->Read(&chunk_)) {
        sent_ += chunk_.data().size();
        return std::move(*chunk_.mutable_data());
      }
      const absl::Status status = FromGrpcStatus(reader_->Finish());
      reader_.reset();
      context_.reset();
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("shard ", shard_, " (node '",
                                                        shard.node_id(), "'): ", status.message()));
      }
      if (sent_ != shard.archive_bytes()) {
        return absl::DataLossError(
            absl::StrCat("shard ", shard_, " (node '", shard.node_id(), "'): its archive has ",
                         sent_, " bytes, the snapshot says ", shard.archive_bytes()));
      }
      ++shard_;
    }
    if (!ended_) {
      ended_ = true;
      return std::string(SnapshotArchiveEndMarker());
    }
    return std::string();
  }

 private:
  RouterSnapshots* const store_;
  const v1::ClusterSnapshot snapshot_;
  const SnapshotManifest manifest_;
  bool started_ = false;
  bool ended_ = false;
  int shard_ = 0;
  uint64_t sent_ = 0;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReader<v1::SnapshotChunk>> reader_;
  v1::SnapshotChunk chunk_;
};

// Restores a cluster archive (read by SnapshotArchiveReader, whose entries are the shards'
// archives): placement and a CREATING key once the manifest has arrived, each shard's archive
// streamed to every replica of its shard, READY at Finish. Undone on failure.
class ClusterRestore final : public SnapshotRestore, private SnapshotArchiveReader::Handler {
 public:
  ClusterRestore(Router* router, std::string new_name)
      : router_(router), new_name_(std::move(new_name)), reader_(this, kMaxManifestBytes) {}
  ~ClusterRestore() override {
    if (!done_) Undo();
  }

  absl::Status Add(absl::string_view bytes) override {
    if (!error_.ok()) return error_;
    error_ = reader_.Add(bytes);
    return error_;
  }

  absl::StatusOr<SnapshotManifest> Finish() override {
    TESSERA_RETURN_IF_ERROR(error_);
    if (!reader_.ended()) {
      if (reader_.current_entry().has_value()) {
        // The nodes say where their archive was cut (DATA_LOSS naming the file).
        const absl::Status cut = CloseShard();
        if (!cut.ok()) return cut;
      }
      return reader_.Finish();
    }
    v1::ClusterCollection collection = placed_;
    collection.set_state(v1::ClusterCollection::READY);
    const std::string key = absl::StrCat(kCollectionsPrefix, new_name_);
    TESSERA_ASSIGN_OR_RETURN(const std::optional<KeyValue> kv, router_->state_->etcd()->Get(key));
    if (!kv.has_value()) {
      return absl::AbortedError(absl::StrCat("collection '", new_name_, "' was dropped meanwhile"));
    }
    TESSERA_ASSIGN_OR_RETURN(const bool ready, router_->state_->etcd()->CompareAndSwap(
                                                   key, kv->mod_revision, ToJson(collection)));
    if (!ready) {
      return absl::AbortedError(absl::StrCat("collection '", new_name_, "' changed meanwhile"));
    }
    done_ = true;
    router_->WaitUntilSeen(key);
    Log("info", "cluster snapshot restored",
        {{"snapshot", snapshot_.info().id()}, {"collection", new_name_}});
    return ManifestOf(snapshot_);
  }

 private:
  // The cluster manifest: the collection placed, and the shards' archives as the entries.
  absl::StatusOr<std::vector<SnapshotArchiveEntry>> OnManifest(absl::string_view text) override {
    TESSERA_ASSIGN_OR_RETURN(snapshot_, DecodeClusterManifest(text));
    TESSERA_RETURN_IF_ERROR(Place());
    std::vector<SnapshotArchiveEntry> entries;
    for (const SnapshotFile& file : ManifestOf(snapshot_).files) {
      // Each shard's archive carries its own CRC-32s, which the nodes check.
      entries.push_back(SnapshotArchiveEntry{file.path, file.size, std::nullopt});
    }
    return entries;
  }

  absl::Status OnEntryBegin(size_t shard) override {
    shard_ = static_cast<int>(shard);
    return OpenShard();
  }

  absl::Status OnEntryBytes(size_t, absl::string_view bytes) override { return Send(bytes); }

  absl::Status OnEntryEnd(size_t) override { return CloseShard(); }

  // Placement as CreateCollection's, under a CREATING key.
  absl::Status Place() {
    v1::CollectionSchema renamed = snapshot_.schema();
    renamed.set_name(new_name_);
    TESSERA_ASSIGN_OR_RETURN(const CollectionSchema schema, server::SchemaFromProto(renamed));
    TESSERA_RETURN_IF_ERROR(ValidateSchema(schema));
    if (new_name_.size() > server::kMaxClusterCollectionName) {
      return absl::InvalidArgumentError(
          absl::StrCat("new_collection '", new_name_, "': ", new_name_.size(),
                       " characters, a sharded collection's name has at most ",
                       server::kMaxClusterCollectionName));
    }
    const uint32_t replicas = snapshot_.replicas();
    const std::vector<LiveNode> nodes = router_->state_->LiveNodes();
    if (replicas > nodes.size()) {
      return absl::FailedPreconditionError(absl::StrCat("the snapshot has ", replicas,
                                                        " replicas per shard: needs as many live "
                                                        "shard nodes, ",
                                                        nodes.size(), " live"));
    }
    placed_.set_state(v1::ClusterCollection::CREATING);
    *placed_.mutable_schema() = snapshot_.schema();
    placed_.mutable_schema()->set_name(new_name_);
    const size_t first = static_cast<size_t>(ShardOf(new_name_, static_cast<int>(nodes.size())));
    for (int s = 0; s < snapshot_.shards_size(); ++s) {
      v1::ShardPlacement* placement = placed_.add_shards();
      for (uint32_t r = 0; r < replicas; ++r) {
        placement->add_replicas()->set_node_id(
            nodes[(first + static_cast<size_t>(s) + r) % nodes.size()].id);
      }
    }
    const std::string key = absl::StrCat(kCollectionsPrefix, new_name_);
    TESSERA_ASSIGN_OR_RETURN(const bool reserved,
                             router_->state_->etcd()->CreateIfAbsent({{key, ToJson(placed_)}}));
    if (!reserved) {
      return absl::AlreadyExistsError(absl::StrCat("collection '", new_name_, "' already exists"));
    }
    reserved_ = true;
    return absl::OkStatus();
  }

  struct Stream {
    std::string node;
    std::unique_ptr<grpc::ClientContext> context;
    v1::RestoreSnapshotResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::RestoreSnapshotRequest>> writer;
  };

  absl::Status OpenShard() {
    streams_.clear();
    for (const v1::ReplicaPlacement& replica : placed_.shards(shard_).replicas()) {
      auto stream = std::make_unique<Stream>();
      stream->node = replica.node_id();
      TESSERA_ASSIGN_OR_RETURN(v1::ShardService::Stub* const stub,
                               router_->StubOf(replica.node_id()));
      stream->context = router_->ShardCall(router_->options_.copy_timeout);
      stream->writer = stub->RestoreReplicaSnapshot(stream->context.get(), &stream->response);
      v1::RestoreSnapshotRequest first;
      first.set_new_collection(server::ReplicaName(new_name_, static_cast<uint32_t>(shard_)));
      restored_.emplace_back(static_cast<uint32_t>(shard_), replica.node_id());
      if (!stream->writer->Write(first)) TESSERA_RETURN_IF_ERROR(Closed(stream.get()));
      streams_.push_back(std::move(stream));
    }
    return absl::OkStatus();
  }

  absl::Status Send(absl::string_view piece) {
    v1::RestoreSnapshotRequest request;
    request.set_data(std::string(piece));
    for (const auto& stream : streams_) {
      if (!stream->writer->Write(request)) return Closed(stream.get());
    }
    return absl::OkStatus();
  }

  // A replica's stream ended early: its status (the node's error, DATA_LOSS naming a file).
  absl::Status Closed(Stream* stream) {
    absl::Status status = FromGrpcStatus(stream->writer->Finish());
    stream->writer.reset();
    if (status.ok()) status = absl::InternalError("the node ended the restore early");
    return Named(stream->node, status);
  }

  absl::Status Named(const std::string& node, const absl::Status& status) const {
    return absl::Status(status.code(),
                        absl::StrCat("shard ", shard_, " (node '", node, "'): ", status.message()));
  }

  absl::Status CloseShard() {
    absl::Status first;
    for (const auto& stream : streams_) {
      stream->writer->WritesDone();
      const absl::Status status = FromGrpcStatus(stream->writer->Finish());
      stream->writer.reset();
      if (!status.ok() && first.ok()) first = Named(stream->node, status);
    }
    streams_.clear();
    return first;
  }

  void Undo() {
    for (const auto& stream : streams_) {
      if (stream->writer != nullptr) {
        stream->context->TryCancel();
        stream->writer->Finish().ok();
      }
    }
    streams_.clear();
    for (const auto& [shard, node] : restored_) router_->DropReplica(new_name_, shard, node);
    if (reserved_) {
      router_->state_->etcd()->Delete(absl::StrCat(kCollectionsPrefix, new_name_)).IgnoreError();
    }
  }

  Router* const router_;
  const std::string new_name_;
  absl::Status error_;
  SnapshotArchiveReader reader_;
  v1::ClusterSnapshot snapshot_;
  v1::ClusterCollection placed_;
  bool reserved_ = false;
  bool done_ = false;
  int shard_ = 0;  // the shard whose archive is arriving
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<std::pair<uint32_t, std::string>> restored_;  // replicas whose restore began
};

absl::StatusOr<std::unique_ptr<SnapshotArchive>> RouterSnapshots::OpenArchive(const std::string& id,
                                                                              size_t) const {
  TESSERA_ASSIGN_OR_RETURN(v1::ClusterSnapshot snapshot, Read(id));
  return std::make_unique<ClusterArchive>(const_cast<RouterSnapshots*>(this), std::move(snapshot));
}

std::unique_ptr<SnapshotRestore> RouterSnapshots::NewRestore(const std::string& new_name) {
  return std::make_unique<ClusterRestore>(router_, new_name);
}

absl::StatusOr<SnapshotManifest> RouterSnapshots::RestoreLocal(const std::string& id,
                                                               const std::string& new_name) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotArchive> archive, OpenArchive(id, kChunkBytes));
  ClusterRestore restore(router_, new_name);
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(const std::string piece, archive->Next());
    if (piece.empty()) break;
    TESSERA_RETURN_IF_ERROR(restore.Add(piece));
  }
  return restore.Finish();
}

std::unique_ptr<SnapshotStore> NewRouterSnapshots(Router* router) {
  return std::make_unique<RouterSnapshots>(router);
}

}  // namespace tessera::cluster
