#include "server/cluster/replica_copy.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/log.h"
#include "tessera/base/errno_status.h"
#include "tessera/status_macros.h"
#include "tessera/wire/status.h"

namespace tessera::server {
namespace {

namespace fs = std::filesystem;

constexpr size_t kChunkBytes = 1 << 20;

// A fresh directory name under `parent`.
std::string FreshDirectory(const std::string& parent, absl::string_view stem) {
  return absl::StrCat(parent, "/", stem, ".",
                      std::chrono::steady_clock::now().time_since_epoch().count());
}

// A path a copy may hold: relative, "/"-separated, without "." or ".." components.
bool IsSafeRelativePath(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

class ImportReactor final : public grpc::ServerReadReactor<v1::ShardImportChunk> {
 public:
  ImportReactor(const ServiceContext* context, grpc::CallbackServerContext* call,
                std::function<absl::StatusOr<std::string>(const v1::ShardReplica&)> local_name)
      : context_(context), call_(call), local_name_(std::move(local_name)) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the sender finished (or the call broke)
      Done(call_->IsCancelled() ? absl::CancelledError("copy cancelled") : Install());
      return;
    }
    const absl::Status written = Take();
    if (!written.ok()) {
      Done(written);
      return;
    }
    StartRead(&chunk_);
  }

  void OnDone() override {
    CloseFile().IgnoreError();
    if (!dir_.empty()) {
      std::error_code ignored;
      fs::remove_all(dir_, ignored);  // a copy that did not make it in
    }
    delete this;
  }

 private:
  absl::Status Take() {
    if (local_.empty()) {
      TESSERA_ASSIGN_OR_RETURN(local_, local_name_(chunk_.replica()));
      dir_ = FreshDirectory(context_->engine->StagingDirectory(), "incoming");
    }
    if (chunk_.path() != path_) {
      TESSERA_RETURN_IF_ERROR(CloseFile());
      if (!IsSafeRelativePath(chunk_.path())) {
        return absl::InvalidArgumentError(
            absl::StrCat("path '", chunk_.path(), "': expected a relative path without '..'"));
      }
      path_ = chunk_.path();
      const fs::path file = fs::path(dir_) / path_;
      std::error_code error;
      fs::create_directories(file.parent_path(), error);
      fd_ = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd_ < 0) return ErrnoStatus(errno, "cannot create", file.string());
    }
    const std::string& data = chunk_.data();
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0) return ErrnoStatus(errno, "cannot write", path_);
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  // Durable before the copy is swapped in: RocksDB does not sync files it finds at open.
  absl::Status CloseFile() {
    if (fd_ < 0) return absl::OkStatus();
    absl::Status status;
    if (::fsync(fd_) != 0) status = ErrnoStatus(errno, "cannot fsync", path_);
    ::close(fd_);
    fd_ = -1;
    return status;
  }

  absl::Status Install() {
    TESSERA_RETURN_IF_ERROR(CloseFile());
    if (local_.empty()) return absl::InvalidArgumentError("empty copy");
    TESSERA_RETURN_IF_ERROR(context_->engine->RestoreCollection(local_, dir_));
    Log("info", "replica copy installed", {{"collection", local_}});
    dir_.clear();  // moved into the engine
    return absl::OkStatus();
  }

  void Done(const absl::Status& status) {
    context_->metrics->RecordRpc("ShardService/ImportReplica",
                                 absl::StatusCodeToString(status.code()), 0);
    if (!status.ok()) {
      Log("warning", "replica copy refused",
          {{"collection", local_}, {"error", std::string(status.message())}});
    }
    Finish(wire::ToGrpcStatus(status));
  }

  const ServiceContext* context_;
  grpc::CallbackServerContext* call_;
  const std::function<absl::StatusOr<std::string>(const v1::ShardReplica&)> local_name_;
  v1::ShardImportChunk chunk_;
  std::string local_;
  std::string dir_;
  std::string path_;
  int fd_ = -1;
};

}  // namespace

absl::Status WriteGate::BeginWrite(const std::string& collection, absl::string_view shown_name) {
  MutexLock lock(&mu_);
  if (closed_.count(collection) > 0) {
    return absl::AbortedError(absl::StrCat("collection '", shown_name,
                                           "': this replica is being copied to a returning "
                                           "replica; writes resume when the copy is in place"));
  }
  ++writers_[collection];
  return absl::OkStatus();
}

void WriteGate::EndWrite(const std::string& collection) {
  MutexLock lock(&mu_);
  if (--writers_[collection] == 0) {
    writers_.erase(collection);
    idle_.SignalAll();
  }
}

absl::Status WriteGate::Close(const std::string& collection, absl::string_view shown_name) {
  MutexLock lock(&mu_);
  if (!closed_.insert(collection).second) {
    return absl::AbortedError(
        absl::StrCat("collection '", shown_name, "': a copy of this replica is already running"));
  }
  while (writers_.count(collection) > 0) idle_.Wait(&mu_);
  return absl::OkStatus();
}

void WriteGate::Open(const std::string& collection) {
  MutexLock lock(&mu_);
  closed_.erase(collection);
}

absl::Status SendReplicaCopy(Engine* engine, const std::string& local,
                             const v1::ShardReplica& replica, const std::string& target_address,
                             const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                             const std::string& cluster_key, v1::ShardCopyResponse* response) {
  const std::string dir = FreshDirectory(engine->StagingDirectory(), "outgoing");
  TESSERA_RETURN_IF_ERROR(engine->CheckpointCollection(local, dir));
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  auto stub = v1::ShardService::NewStub(grpc::CreateChannel(target_address, credentials));
  grpc::ClientContext context;
  if (!cluster_key.empty())
    context.AddMetadata("authorization", absl::StrCat("Bearer ", cluster_key));
  v1::ShardImportResponse imported;
  std::unique_ptr<grpc::ClientWriter<v1::ShardImportChunk>> writer =
      stub->ImportReplica(&context, &imported);
  absl::Status status;
  bool first = true;
  std::vector<char> buffer(kChunkBytes);
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      status = absl::InternalError(absl::StrCat("cannot read ", file.string()));
      break;
    }
    bool sent_any = false;
    while (status.ok()) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const auto n = static_cast<size_t>(in.gcount());
      if (n == 0 && sent_any) break;
      v1::ShardImportChunk chunk;
      if (first) *chunk.mutable_replica() = replica;
      first = false;
      chunk.set_path(fs::relative(file, dir).generic_string());
      chunk.set_data(buffer.data(), n);
      if (!writer->Write(chunk)) status = absl::UnavailableError("the target closed the stream");
      sent_any = true;
      response->set_bytes(response->bytes() + n);
      if (n < buffer.size()) break;
    }
    if (!status.ok()) break;
    response->set_files(response->files() + 1);
  }
  writer->WritesDone();
  const absl::Status finished = wire::FromGrpcStatus(writer->Finish());
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  if (!finished.ok()) {
    return absl::Status(finished.code(),
                        absl::StrCat("copy to ", target_address, ": ", finished.message()));
  }
  return status;
}

grpc::ServerReadReactor<v1::ShardImportChunk>* NewImportReactor(
    const ServiceContext* context, grpc::CallbackServerContext* call,
    std::function<absl::StatusOr<std::string>(const v1::ShardReplica&)> local_name) {
  return new ImportReactor(context, call, std::move(local_name));
}

}  // namespace tessera::server
