// The AdminService's snapshot RPCs over the node's SnapshotStore (tessera/snapshot.h): create,
// list and delete as unary calls on the admission's workers; DownloadSnapshot streams the archive
// a chunk per message; RestoreSnapshot takes one (or names a snapshot on this server) and
// restores it into a new collection. On a router the store is the cluster's
// (server/cluster/router_snapshots.h); a shard node serves the same reactors to routers through
// its ShardService (NewSnapshotDownload, NewSnapshotRestore).
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/log.h"
#include "server/request_handlers.h"
#include "server/services.h"
#include "tessera/status_macros.h"
#include "tessera/wire/status.h"

namespace tessera::server {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;

absl::Status NeedStore(const ServiceContext* context) {
  if (context->snapshots != nullptr) return absl::OkStatus();
  return absl::UnimplementedError("this server has no snapshot store");
}

}  // namespace

void SnapshotInfoToProto(const SnapshotManifest& manifest, v1::SnapshotInfo* out) {
  out->set_id(manifest.id);
  out->set_collection(manifest.collection);
  out->set_created_unix_micros(manifest.created_unix_micros);
  out->set_num_shards(static_cast<uint32_t>(manifest.num_shards));
  out->set_files(manifest.files.size());
  out->set_bytes(static_cast<uint64_t>(manifest.total_bytes()));
  out->set_cut_seconds(static_cast<double>(manifest.cut_micros) / 1e6);
}

namespace {

void InfoToProto(const SnapshotManifest& manifest, v1::SnapshotInfo* out) {
  SnapshotInfoToProto(manifest, out);
}

absl::Status CheckNotEmpty(absl::string_view field, const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
  return absl::OkStatus();
}

void Record(const ServiceContext* context, const char* method, Clock::time_point start,
            const absl::Status& status) {
  context->metrics->RecordRpc(
      method, absl::StatusCodeToString(status.code()),
      std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  if (!status.ok() && !absl::IsNotFound(status) && !absl::IsInvalidArgument(status) &&
      !absl::IsAlreadyExists(status)) {
    Log("warning", "rpc failed",
        {{"method", method},
         {"code", absl::StatusCodeToString(status.code())},
         {"message", std::string(status.message())}});
  }
}

class DownloadReactor final : public grpc::ServerWriteReactor<v1::SnapshotChunk> {
 public:
  DownloadReactor(const ServiceContext* context, const v1::DownloadSnapshotRequest& request,
                  const char* method)
      : context_(context), method_(method), start_(Clock::now()) {
    absl::Status status = NeedStore(context_);
    if (status.ok()) status = CheckNotEmpty("id", request.id());
    if (status.ok()) {
      absl::StatusOr<std::unique_ptr<SnapshotArchive>> archive =
          context_->snapshots->OpenArchive(request.id(), kChunkBytes);
      if (archive.ok()) {
        archive_ = *std::move(archive);
      } else {
        status = archive.status();
      }
    }
    if (!status.ok()) {
      Done(status);
      return;
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Done(absl::CancelledError("the client stopped reading the snapshot"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    absl::StatusOr<std::string> piece = archive_->Next();
    if (!piece.ok()) {
      Done(piece.status());
      return;
    }
    if (piece->empty()) {
      Done(absl::OkStatus());
      return;
    }
    chunk_.set_data(*std::move(piece));
    StartWrite(&chunk_);
  }

  void Done(const absl::Status& status) {
    Record(context_, method_, start_, status);
    Finish(wire::ToGrpcStatus(status));
  }

  const ServiceContext* context_;
  const char* const method_;
  const Clock::time_point start_;
  std::unique_ptr<SnapshotArchive> archive_;
  v1::SnapshotChunk chunk_;
};

class RestoreReactor final : public grpc::ServerReadReactor<v1::RestoreSnapshotRequest> {
 public:
  RestoreReactor(const ServiceContext* context, grpc::CallbackServerContext* call,
                 v1::RestoreSnapshotResponse* response, const char* method,
                 std::function<absl::Status(const std::string&)> check_name)
      : context_(context),
        call_(call),
        response_(response),
        method_(method),
        check_name_(std::move(check_name)),
        start_(Clock::now()) {
    const absl::Status status = NeedStore(context_);
    if (!status.ok()) {
      Done(status);
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished (or the call broke)
      Done(call_->IsCancelled() ? absl::CancelledError("restore cancelled") : Install());
      return;
    }
    const absl::Status taken = Take();
    if (!taken.ok()) {
      Done(taken);
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Take() {
    if (first_) {
      first_ = false;
      new_name_ = request_.new_collection();
      snapshot_id_ = request_.snapshot_id();
      TESSERA_RETURN_IF_ERROR(CheckNotEmpty("new_collection", new_name_));
      if (check_name_) TESSERA_RETURN_IF_ERROR(check_name_(new_name_));
      if (snapshot_id_.empty()) restore_ = context_->snapshots->NewRestore(new_name_);
    } else if (!request_.new_collection().empty() || !request_.snapshot_id().empty()) {
      return absl::InvalidArgumentError(
          "new_collection and snapshot_id: only the stream's first message may set them");
    }
    if (!request_.data().empty()) {
      if (restore_ == nullptr) {
        return absl::InvalidArgumentError(
            "data: a restore of snapshot_id takes no archive bytes (set one or the other)");
      }
      TESSERA_RETURN_IF_ERROR(restore_->Add(request_.data()));
    }
    return absl::OkStatus();
  }

  absl::Status Install() {
    if (first_) return absl::InvalidArgumentError("new_collection: the stream sent no message");
    absl::StatusOr<SnapshotManifest> manifest =
        restore_ != nullptr ? restore_->Finish()
                            : context_->snapshots->RestoreLocal(snapshot_id_, new_name_);
    TESSERA_RETURN_IF_ERROR(manifest.status());
    InfoToProto(*manifest, response_->mutable_snapshot());
    Log("info", "snapshot restored", {{"snapshot", manifest->id}, {"collection", new_name_}});
    return absl::OkStatus();
  }

  void Done(const absl::Status& status) {
    Record(context_, method_, start_, status);
    restore_.reset();  // its staging files go now, not when the reactor is deleted
    Finish(wire::ToGrpcStatus(status));
  }

  const ServiceContext* context_;
  grpc::CallbackServerContext* call_;
  v1::RestoreSnapshotResponse* response_;
  const char* const method_;
  const std::function<absl::Status(const std::string&)> check_name_;
  const Clock::time_point start_;
  v1::RestoreSnapshotRequest request_;
  bool first_ = true;
  std::string new_name_;
  std::string snapshot_id_;
  std::unique_ptr<SnapshotRestore> restore_;
};

}  // namespace

grpc::ServerWriteReactor<v1::SnapshotChunk>* NewSnapshotDownload(
    const ServiceContext* context, const v1::DownloadSnapshotRequest& request, const char* method) {
  return new DownloadReactor(context, request, method);
}

grpc::ServerReadReactor<v1::RestoreSnapshotRequest>* NewSnapshotRestore(
    const ServiceContext* context, grpc::CallbackServerContext* call,
    v1::RestoreSnapshotResponse* response, const char* method,
    std::function<absl::Status(const std::string&)> check_name) {
  return new RestoreReactor(context, call, response, method, std::move(check_name));
}

grpc::ServerUnaryReactor* AdminServiceImpl::CreateSnapshot(grpc::CallbackServerContext* call,
                                                           const v1::CreateSnapshotRequest* request,
                                                           v1::CreateSnapshotResponse* response) {
  return Serve(context_, call, "CreateSnapshot", 0, [this, request, response]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(NeedStore(context_));
    TESSERA_RETURN_IF_ERROR(CheckNotEmpty("collection", request->collection()));
    TESSERA_ASSIGN_OR_RETURN(const SnapshotManifest manifest,
                             context_->snapshots->Create(request->collection()));
    InfoToProto(manifest, response->mutable_snapshot());
    Log("info", "snapshot created",
        {{"collection", manifest.collection},
         {"snapshot", manifest.id},
         {"bytes", std::to_string(manifest.total_bytes())},
         {"cut_ms", std::to_string(manifest.cut_micros / 1000)}});
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListSnapshots(grpc::CallbackServerContext* call,
                                                          const v1::ListSnapshotsRequest* request,
                                                          v1::ListSnapshotsResponse* response) {
  return Serve(context_, call, "ListSnapshots", 0, [this, request, response]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(NeedStore(context_));
    TESSERA_RETURN_IF_ERROR(CheckNotEmpty("collection", request->collection()));
    TESSERA_ASSIGN_OR_RETURN(const std::vector<SnapshotManifest> manifests,
                             context_->snapshots->List(request->collection()));
    for (const SnapshotManifest& manifest : manifests) {
      InfoToProto(manifest, response->add_snapshots());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminServiceImpl::DeleteSnapshot(grpc::CallbackServerContext* call,
                                                           const v1::DeleteSnapshotRequest* request,
                                                           v1::DeleteSnapshotResponse*) {
  return Serve(context_, call, "DeleteSnapshot", 0, [this, request]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(NeedStore(context_));
    TESSERA_RETURN_IF_ERROR(CheckNotEmpty("id", request->id()));
    TESSERA_RETURN_IF_ERROR(context_->snapshots->Delete(request->id()));
    Log("info", "snapshot deleted", {{"snapshot", request->id()}});
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::SnapshotChunk>* AdminServiceImpl::DownloadSnapshot(
    grpc::CallbackServerContext*, const v1::DownloadSnapshotRequest* request) {
  return new DownloadReactor(context_, *request, "DownloadSnapshot");
}

grpc::ServerReadReactor<v1::RestoreSnapshotRequest>* AdminServiceImpl::RestoreSnapshot(
    grpc::CallbackServerContext* call, v1::RestoreSnapshotResponse* response) {
  return new RestoreReactor(context_, call, response, "RestoreSnapshot", nullptr);
}

}  // namespace tessera::server
