#include "server/cluster/shard_service.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/convert.h"
#include "server/log.h"
#include "server/request_handlers.h"
#include "server/services.h"
#include "tessera/document.h"
#include "tessera/status_macros.h"

namespace tessera::server {
namespace {

constexpr absl::string_view kReplicaSeparator = ".shard-";

// One replica addressed by a request: its cluster name and shard, and its local name.
struct Replica {
  std::string collection;
  uint32_t shard = 0;
  std::string local;

  // `message` with the local name replaced by the cluster one, as the public API would say it
  // (quoted whole, or cut short by QuotedForMessage).
  std::string Rewrite(absl::string_view message) const {
    return absl::StrReplaceAll(message,
                               {{absl::StrCat("'", local, "'"), absl::StrCat("'", collection, "'")},
                                {QuotedForMessage(local), QuotedForMessage(collection)}});
  }
  absl::Status Rewrite(const absl::Status& status) const {
    if (status.ok()) return status;
    return absl::Status(status.code(), Rewrite(status.message()));
  }
};

absl::StatusOr<Replica> ReplicaOf(const std::string& collection, uint32_t shard) {
  if (collection.empty()) return absl::InvalidArgumentError("collection: empty name");
  if (shard >= kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard, ", expected 0 … ", kMaxShards - 1));
  }
  return Replica{collection, shard, ReplicaName(collection, shard)};
}

absl::StatusOr<std::shared_ptr<Collection>> FindReplica(const ServiceContext* context,
                                                        const Replica& replica) {
  absl::StatusOr<std::shared_ptr<Collection>> collection =
      context->engine->GetCollection(replica.local);
  if (!collection.ok()) return replica.Rewrite(collection.status());
  return collection;
}

absl::Status RunSearch(const ServiceContext* context, const grpc::CallbackServerContext& call,
                       const v1::ShardSearchRequest& shard_request,
                       v1::ShardSearchResponse* response) {
  const v1::SearchRequest& request = shard_request.search();
  TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                           ReplicaOf(request.collection(), shard_request.shard()));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection, FindReplica(context, replica));
  absl::StatusOr<SearchResult> result = SearchCollection(
      context, call, *collection, request, shard_request.whole_shards(),
      shard_request.has_sparse_statistics() ? &shard_request.sparse_statistics() : nullptr);
  if (!result.ok()) return replica.Rewrite(result.status());
  ShardSearchResultToProto(*result, response);
  return absl::OkStatus();
}

absl::Status RunUpsert(const ServiceContext* context, WriteGate* gate,
                       const v1::ShardUpsertRequest& request, v1::UpsertResponse* response) {
  TESSERA_ASSIGN_OR_RETURN(const Replica replica, ReplicaOf(request.collection(), request.shard()));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection, FindReplica(context, replica));
  TESSERA_RETURN_IF_ERROR(gate->BeginWrite(replica.local, replica.collection));
  absl::Cleanup end_write = [&] { gate->EndWrite(replica.local); };
  return UpsertDocuments(
      context, *collection, request.documents(), response,
      [&replica](absl::string_view message) { return replica.Rewrite(message); });
}

}  // namespace

std::string ReplicaName(absl::string_view collection, uint32_t shard) {
  return absl::StrCat(collection, kReplicaSeparator, shard);
}

std::optional<std::pair<std::string, uint32_t>> ParseReplicaName(absl::string_view local_name) {
  const size_t at = local_name.rfind(kReplicaSeparator);
  if (at == absl::string_view::npos || at == 0) return std::nullopt;
  const absl::string_view digits = local_name.substr(at + kReplicaSeparator.size());
  uint32_t shard = 0;
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(digits, &shard) || shard >= kMaxShards) {
    return std::nullopt;
  }
  return std::make_pair(std::string(local_name.substr(0, at)), shard);
}

grpc::ServerUnaryReactor* ShardServiceImpl::Info(grpc::CallbackServerContext* call,
                                                 const v1::ShardInfoRequest*,
                                                 v1::ShardInfoResponse* response) {
  return Serve(context_, call, "ShardService/Info", 0, [this, response]() -> absl::Status {
    std::vector<std::pair<std::string, uint32_t>> replicas;
    for (const std::string& name : context_->engine->ListCollections()) {
      if (auto replica = ParseReplicaName(name)) replicas.push_back(*std::move(replica));
    }
    std::sort(replicas.begin(), replicas.end());
    response->set_node_id(node_id_);
    for (const auto& [collection, shard] : replicas) {
      v1::ShardReplica* out = response->add_replicas();
      out->set_collection(collection);
      out->set_shard(shard);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShardServiceImpl::CreateCollection(
    grpc::CallbackServerContext* call, const v1::ShardCreateCollectionRequest* request,
    v1::ShardCreateCollectionResponse* response) {
  return Serve(
      context_, call, "ShardService/CreateCollection", 0,
      [this, request, response]() -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(const CollectionSchema schema, SchemaFromProto(request->schema()));
        // The cluster schema first, so that a bad one gets the public API's message.
        TESSERA_RETURN_IF_ERROR(ValidateSchema(schema));
        TESSERA_ASSIGN_OR_RETURN(const Replica replica, ReplicaOf(schema.name, request->shard()));
        if (replica.shard >= static_cast<uint32_t>(schema.num_shards)) {
          return absl::InvalidArgumentError(absl::StrCat("shard ", replica.shard, ", collection '",
                                                         schema.name, "' has ", schema.num_shards,
                                                         " shards"));
        }
        if (schema.name.size() > kMaxClusterCollectionName) {
          return absl::InvalidArgumentError(absl::StrCat(
              "collection name '", schema.name, "': ", schema.name.size(),
              " characters, a sharded collection's name has at most ", kMaxClusterCollectionName));
        }
        CollectionSchema local = schema;
        local.name = replica.local;
        local.num_shards = 1;
        absl::StatusOr<std::shared_ptr<Collection>> collection =
            context_->engine->CreateCollection(local);
        if (!collection.ok()) return replica.Rewrite(collection.status());
        SchemaToProto((*collection)->schema(), response->mutable_schema());
        response->mutable_schema()->set_name(schema.name);
        response->mutable_schema()->set_num_shards(static_cast<uint32_t>(schema.num_shards));
        Log("info", "replica created",
            {{"collection", schema.name}, {"shard", std::to_string(replica.shard)}});
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ShardServiceImpl::DropCollection(
    grpc::CallbackServerContext* call, const v1::ShardDropCollectionRequest* request,
    v1::ShardDropCollectionResponse*) {
  return Serve(context_, call, "ShardService/DropCollection", 0, [this, request]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                             ReplicaOf(request->collection(), request->shard()));
    TESSERA_RETURN_IF_ERROR(replica.Rewrite(context_->engine->DropCollection(replica.local)));
    Log("info", "replica dropped",
        {{"collection", replica.collection}, {"shard", std::to_string(replica.shard)}});
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShardServiceImpl::Upsert(grpc::CallbackServerContext* call,
                                                   const v1::ShardUpsertRequest* request,
                                                   v1::UpsertResponse* response) {
  return Serve(
      context_, call, "ShardService/Upsert", static_cast<int64_t>(request->ByteSizeLong()),
      [this, request, response] { return RunUpsert(context_, &gate_, *request, response); });
}

grpc::ServerUnaryReactor* ShardServiceImpl::Delete(grpc::CallbackServerContext* call,
                                                   const v1::ShardDeleteRequest* request,
                                                   v1::DeleteResponse* response) {
  return Serve(context_, call, "ShardService/Delete", static_cast<int64_t>(request->ByteSizeLong()),
               [this, request, response]() -> absl::Status {
                 TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                                          ReplicaOf(request->collection(), request->shard()));
                 TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                                          FindReplica(context_, replica));
                 TESSERA_RETURN_IF_ERROR(gate_.BeginWrite(replica.local, replica.collection));
                 absl::Cleanup end_write = [&] { gate_.EndWrite(replica.local); };
                 if (request->has_filter()) {
                   TESSERA_ASSIGN_OR_RETURN(const Filter filter,
                                            FilterFromProto(request->filter()));
                   absl::StatusOr<int64_t> deleted = collection->DeleteMatching(filter);
                   if (!deleted.ok()) return replica.Rewrite(deleted.status());
                   response->set_deleted(static_cast<uint64_t>(*deleted));
                   return absl::OkStatus();
                 }
                 const std::vector<std::string> ids(request->ids().begin(), request->ids().end());
                 absl::StatusOr<std::vector<bool>> existed = collection->Delete(ids);
                 if (!existed.ok()) return replica.Rewrite(existed.status());
                 for (bool e : *existed) response->add_existed(e);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* ShardServiceImpl::Get(grpc::CallbackServerContext* call,
                                                const v1::ShardGetRequest* request,
                                                v1::GetResponse* response) {
  return Serve(context_, call, "ShardService/Get", 0, [this, request, response]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                             ReplicaOf(request->collection(), request->shard()));
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                             FindReplica(context_, replica));
    GetOptions options;
    options.stored_bytes = true;
    absl::StatusOr<StoredDocument> document = collection->Get(request->id(), options);
    if (!document.ok()) return replica.Rewrite(document.status());
    StoredDocumentToProto(*std::move(document), response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ShardServiceImpl::GetSparseStatistics(
    grpc::CallbackServerContext* call, const v1::ShardSparseStatisticsRequest* request,
    v1::SparseStatistics* response) {
  return Serve(context_, call, "ShardService/GetSparseStatistics", 0,
               [this, request, response]() -> absl::Status {
                 TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                                          ReplicaOf(request->collection(), request->shard()));
                 TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                                          FindReplica(context_, replica));
                 const std::vector<uint32_t> terms(request->terms().begin(),
                                                   request->terms().end());
                 SparseStatisticsToProto(collection->SparseStatisticsOf(terms), response);
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* ShardServiceImpl::Count(grpc::CallbackServerContext* call,
                                                  const v1::ShardCountRequest* request,
                                                  v1::CountResponse* response) {
  return Serve(context_, call, "ShardService/Count", 0,
               [this, request, response]() -> absl::Status {
                 TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                                          ReplicaOf(request->collection(), request->shard()));
                 TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                                          FindReplica(context_, replica));
                 TESSERA_ASSIGN_OR_RETURN(const Filter filter, FilterFromProto(request->filter()));
                 absl::StatusOr<int64_t> count = collection->Count(filter);
                 if (!count.ok()) return replica.Rewrite(count.status());
                 response->set_count(static_cast<uint64_t>(*count));
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* ShardServiceImpl::Scroll(grpc::CallbackServerContext* call,
                                                   const v1::ShardScrollRequest* request,
                                                   v1::ScrollResponse* response) {
  return Serve(
      context_, call, "ShardService/Scroll", 0, [this, request, response]() -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                                 ReplicaOf(request->scroll().collection(), request->shard()));
        TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                                 FindReplica(context_, replica));
        TESSERA_ASSIGN_OR_RETURN(const ScrollOptions options,
                                 ScrollOptionsFromProto(request->scroll()));
        absl::StatusOr<ScrollPage> page = collection->Scroll(options);
        if (!page.ok()) return replica.Rewrite(page.status());
        ScrollPageToProto(*std::move(page), response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ShardServiceImpl::Search(grpc::CallbackServerContext* call,
                                                   const v1::ShardSearchRequest* request,
                                                   v1::ShardSearchResponse* response) {
  return Serve(
      context_, call, "Search", static_cast<int64_t>(request->ByteSizeLong()),
      [this, call, request, response] { return RunSearch(context_, *call, *request, response); });
}

grpc::ServerUnaryReactor* ShardServiceImpl::Stats(grpc::CallbackServerContext* call,
                                                  const v1::ShardStatsRequest* request,
                                                  v1::GetCollectionResponse* response) {
  return Serve(context_, call, "ShardService/Stats", 0,
               [this, request, response]() -> absl::Status {
                 TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                                          ReplicaOf(request->collection(), request->shard()));
                 TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                                          FindReplica(context_, replica));
                 SchemaToProto(collection->schema(), response->mutable_schema());
                 response->mutable_schema()->set_name(replica.collection);
                 StatsToProto(collection->Stats(), response->mutable_stats());
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* ShardServiceImpl::Flush(grpc::CallbackServerContext* call,
                                                  const v1::ShardFlushRequest* request,
                                                  v1::ShardFlushResponse*) {
  return Serve(context_, call, "ShardService/Flush", 0, [this, request]() -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                             ReplicaOf(request->collection(), request->shard()));
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Collection> collection,
                             FindReplica(context_, replica));
    return replica.Rewrite(collection->Snapshot());
  });
}

grpc::ServerUnaryReactor* ShardServiceImpl::CopyReplica(grpc::CallbackServerContext* call,
                                                        const v1::ShardCopyRequest* request,
                                                        v1::ShardCopyResponse* response) {
  return Serve(
      context_, call, "ShardService/CopyReplica", 0, [this, request, response]() -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                                 ReplicaOf(request->collection(), request->shard()));
        TESSERA_RETURN_IF_ERROR(FindReplica(context_, replica).status());
        if (request->target_address().empty()) {
          return absl::InvalidArgumentError("target_address: empty");
        }
        const auto start = std::chrono::steady_clock::now();
        TESSERA_RETURN_IF_ERROR(gate_.Close(replica.local, replica.collection));
        absl::Cleanup reopen = [&] { gate_.Open(replica.local); };
        v1::ShardReplica named;
        named.set_collection(replica.collection);
        named.set_shard(replica.shard);
        TESSERA_RETURN_IF_ERROR(replica.Rewrite(
            SendReplicaCopy(context_->engine, replica.local, named, request->target_address(),
                            context_->cluster_credentials, context_->cluster_key, response)));
        response->set_seconds(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        Log("info", "replica copied",
            {{"collection", replica.collection},
             {"shard", std::to_string(replica.shard)},
             {"target", request->target_address()},
             {"bytes", std::to_string(response->bytes())},
             {"seconds", std::to_string(response->seconds())}});
        return absl::OkStatus();
      });
}

grpc::ServerReadReactor<v1::ShardImportChunk>* ShardServiceImpl::ImportReplica(
    grpc::CallbackServerContext* call, v1::ShardImportResponse*) {
  return NewImportReactor(context_, call,
                          [](const v1::ShardReplica& named) -> absl::StatusOr<std::string> {
                            TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                                                     ReplicaOf(named.collection(), named.shard()));
                            return replica.local;
                          });
}

namespace {

absl::Status NeedSnapshots(const ServiceContext* context) {
  if (context->snapshots != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError("this node has no snapshot store");
}

}  // namespace

grpc::ServerUnaryReactor* ShardServiceImpl::CreateReplicaSnapshot(
    grpc::CallbackServerContext* call, const v1::ShardSnapshotRequest* request,
    v1::ShardSnapshotResponse* response) {
  return Serve(context_, call, "ShardService/CreateReplicaSnapshot", 0,
               [this, request, response]() -> absl::Status {
                 TESSERA_RETURN_IF_ERROR(NeedSnapshots(context_));
                 TESSERA_ASSIGN_OR_RETURN(const Replica replica,
                                          ReplicaOf(request->collection(), request->shard()));
                 TESSERA_RETURN_IF_ERROR(FindReplica(context_, replica).status());
                 absl::StatusOr<SnapshotManifest> manifest =
                     context_->snapshots->Create(replica.local);
                 if (!manifest.ok()) return replica.Rewrite(manifest.status());
                 SnapshotInfoToProto(*manifest, response->mutable_snapshot());
                 // The archive's length: head (magic, length, CRC), manifest, files, trailer
                 // (tessera/snapshot.h).
                 response->set_archive_bytes(8 + 4 + 4 + EncodeSnapshotManifest(*manifest).size() +
                                             static_cast<uint64_t>(manifest->total_bytes()) + 8);
                 Log("info", "replica snapshot created",
                     {{"collection", replica.collection},
                      {"shard", std::to_string(replica.shard)},
                      {"snapshot", manifest->id}});
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* ShardServiceImpl::DeleteReplicaSnapshot(
    grpc::CallbackServerContext* call, const v1::DeleteSnapshotRequest* request,
    v1::DeleteSnapshotResponse*) {
  return Serve(context_, call, "ShardService/DeleteReplicaSnapshot", 0,
               [this, request]() -> absl::Status {
                 TESSERA_RETURN_IF_ERROR(NeedSnapshots(context_));
                 return context_->snapshots->Delete(request->id());
               });
}

grpc::ServerWriteReactor<v1::SnapshotChunk>* ShardServiceImpl::DownloadReplicaSnapshot(
    grpc::CallbackServerContext*, const v1::DownloadSnapshotRequest* request) {
  return NewSnapshotDownload(context_, *request, "ShardService/DownloadReplicaSnapshot");
}

grpc::ServerReadReactor<v1::RestoreSnapshotRequest>* ShardServiceImpl::RestoreReplicaSnapshot(
    grpc::CallbackServerContext* call, v1::RestoreSnapshotResponse* response) {
  return NewSnapshotRestore(context_, call, response, "ShardService/RestoreReplicaSnapshot",
                            [](const std::string& name) -> absl::Status {
                              if (ParseReplicaName(name).has_value()) return absl::OkStatus();
                              return absl::InvalidArgumentError(absl::StrCat(
                                  "new_collection ", QuotedForMessage(name),
                                  ": not a replica's name (\"<collection>.shard-<i>\")"));
                            });
}

}  // namespace tessera::server
