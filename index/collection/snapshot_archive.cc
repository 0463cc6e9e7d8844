// The snapshot archive's framing (tessera/snapshot.h, version 1): its head, its end marker and the
// reader of both and of the entries between them, for a standalone snapshot's archive
// (snapshot.cc) and a cluster snapshot's (server/cluster/router_snapshots.cc) alike.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "index/common/crc32.h"
#include "index/common/little_endian.h"
#include "tessera/snapshot.h"
#include "tessera/status_macros.h"

namespace tessera {
namespace {

constexpr absl::string_view kArchiveMagic = "TSNAPv1\n";
constexpr absl::string_view kArchiveEndMarker = "TSNAPEND";
constexpr size_t kManifestHeaderBytes = 8;  // length, CRC-32

}  // namespace

std::string EncodeSnapshotArchiveHead(absl::string_view manifest_text) {
  std::string head(kArchiveMagic);
  char header[kManifestHeaderBytes];
  internal::StoreLittleEndian32(header, static_cast<uint32_t>(manifest_text.size()));
  internal::StoreLittleEndian32(header + 4, internal::Crc32(manifest_text));
  head.append(header, kManifestHeaderBytes);
  head.append(manifest_text.data(), manifest_text.size());
  return head;
}

absl::string_view SnapshotArchiveEndMarker() { return kArchiveEndMarker; }

absl::Status SnapshotArchiveReader::Add(absl::string_view bytes) {
  if (!status_.ok()) return status_;
  status_ = Consume(bytes);
  return status_;
}

absl::Status SnapshotArchiveReader::Finish() const {
  if (!status_.ok()) return status_;
  switch (state_) {
    case State::kMagic:
    case State::kManifestHeader:
    case State::kManifest:
      return absl::DataLossError("snapshot archive truncated in its manifest");
    case State::kEntries: {
      const SnapshotArchiveEntry& entry = entries_[entry_];
      return absl::DataLossError(absl::StrCat("snapshot archive truncated in file '", entry.name,
                                              "' (", entry_read_, " of ", entry.size, " bytes)"));
    }
    case State::kEndMarker:
      return absl::DataLossError("snapshot archive truncated before its end marker");
    case State::kEnded:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

bool SnapshotArchiveReader::Fill(absl::string_view* bytes, size_t want) {
  const size_t take = std::min(bytes->size(), want - buffer_.size());
  buffer_.append(bytes->data(), take);
  bytes->remove_prefix(take);
  return buffer_.size() == want;
}

absl::Status SnapshotArchiveReader::Consume(absl::string_view bytes) {
  while (!bytes.empty()) {
    switch (state_) {
      case State::kMagic:
        if (!Fill(&bytes, kArchiveMagic.size())) break;
        if (buffer_ != kArchiveMagic) {
          return absl::DataLossError(
              "snapshot archive: it does not start with TSNAPv1 (not a Tessera snapshot archive, "
              "or another version)");
        }
        buffer_.clear();
        state_ = State::kManifestHeader;
        break;
      case State::kManifestHeader:
        if (!Fill(&bytes, kManifestHeaderBytes)) break;
        manifest_bytes_ = internal::LoadLittleEndian32(buffer_.data());
        manifest_crc_ = internal::LoadLittleEndian32(buffer_.data() + 4);
        if (manifest_bytes_ > max_manifest_bytes_) {
          return absl::DataLossError(absl::StrCat("snapshot archive: manifest of ", manifest_bytes_,
                                                  " bytes, expected at most ",
                                                  max_manifest_bytes_));
        }
        buffer_.clear();
        state_ = State::kManifest;
        break;
      case State::kManifest:
        if (!Fill(&bytes, manifest_bytes_)) break;
        TESSERA_RETURN_IF_ERROR(TakeManifest());
        break;
      case State::kEntries:
        TESSERA_RETURN_IF_ERROR(TakeEntryBytes(&bytes));
        break;
      case State::kEndMarker:
        if (!Fill(&bytes, kArchiveEndMarker.size())) break;
        if (buffer_ != kArchiveEndMarker) {
          return absl::DataLossError(
              "snapshot archive: its end marker is wrong (bytes after the last file)");
        }
        buffer_.clear();
        state_ = State::kEnded;
        break;
      case State::kEnded:
        return absl::DataLossError(
            absl::StrCat("snapshot archive: ", bytes.size(), " bytes after its end marker"));
    }
  }
  return absl::OkStatus();
}

absl::Status SnapshotArchiveReader::TakeManifest() {
  if (internal::Crc32(buffer_) != manifest_crc_) {
    return absl::DataLossError("snapshot archive: the manifest fails its CRC-32");
  }
  TESSERA_ASSIGN_OR_RETURN(entries_, handler_->OnManifest(buffer_));
  buffer_.clear();
  for (const SnapshotArchiveEntry& entry : entries_) {
    if (entry.size < 0) {
      return absl::DataLossError(absl::StrCat("snapshot archive: file '", entry.name, "' of ",
                                              entry.size, " bytes, expected at least 0"));
    }
  }
  entry_ = 0;
  return BeginEntries();
}

absl::Status SnapshotArchiveReader::BeginEntries() {
  while (entry_ < entries_.size()) {
    TESSERA_RETURN_IF_ERROR(handler_->OnEntryBegin(entry_));
    entry_read_ = 0;
    entry_crc_ = 0;
    state_ = State::kEntries;
    if (entries_[entry_].size > 0) return absl::OkStatus();
    TESSERA_RETURN_IF_ERROR(EndEntry());
  }
  state_ = State::kEndMarker;
  return absl::OkStatus();
}

absl::Status SnapshotArchiveReader::TakeEntryBytes(absl::string_view* bytes) {
  const SnapshotArchiveEntry& entry = entries_[entry_];
  const size_t take = static_cast<size_t>(
      std::min<int64_t>(static_cast<int64_t>(bytes->size()), entry.size - entry_read_));
  const absl::string_view data = bytes->substr(0, take);
  bytes->remove_prefix(take);
  if (entry.crc32.has_value()) entry_crc_ = internal::Crc32(data, entry_crc_);
  TESSERA_RETURN_IF_ERROR(handler_->OnEntryBytes(entry_, data));
  entry_read_ += static_cast<int64_t>(take);
  if (entry_read_ < entry.size) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(EndEntry());
  return BeginEntries();
}

absl::Status SnapshotArchiveReader::EndEntry() {
  const SnapshotArchiveEntry& entry = entries_[entry_];
  if (entry.crc32.has_value() && entry_crc_ != *entry.crc32) {
    return absl::DataLossError(
        absl::StrCat("snapshot file '", entry.name, "': CRC-32 ",
                     absl::StrFormat("%08x", entry_crc_), ", the manifest says ",
                     absl::StrFormat("%08x", *entry.crc32), " (the snapshot is corrupt)"));
  }
  TESSERA_RETURN_IF_ERROR(handler_->OnEntryEnd(entry_));
  ++entry_;
  return absl::OkStatus();
}

}  // namespace tessera
