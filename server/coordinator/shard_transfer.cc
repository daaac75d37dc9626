#include "server/coordinator/shard_transfer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/confined_path.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/util/status_macros.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {

ShardUpload::~ShardUpload() { Abandon(); }

void ShardUpload::Abandon() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (!part_.empty()) unlink(part_.c_str());
  part_.clear();
}

absl::Status ShardUpload::Begin(const v1::StateChunk& c) {
  auto it = target_.files.find(c.file());
  if (it == target_.files.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint file '", c.file(), "' is not one of this worker's layers (or came twice)"));
  }
  if (c.offset() != 0 || c.first_layer() != it->second.first_layer ||
      c.last_layer() != it->second.last_layer || c.bytes() < 0 || c.bytes() > kMaxFileBytes ||
      !io::IsSha256Hex(c.sha256())) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.file(), ": the first chunk must carry offset 0, the layers [", it->second.first_layer,
        ", ", it->second.last_layer, "), a size in [0, 2^40] and a SHA-256 in hex"));
  }
  current_ = it->second;
  current_.sha256 = c.sha256();
  current_.bytes = c.bytes();
  target_.files.erase(it);
  part_ = io::JoinPath(target_.staging, current_.file + ".part");
  fd_ = open(part_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) {
    const std::string error = strerror(errno);
    part_.clear();
    return absl::UnavailableError(absl::StrCat("cannot create ", target_.staging, "/",
                                               current_.file, ".part: ", error,
                                               " (the checkpoint was abandoned?)"));
  }
  offset_ = 0;
  digest_.emplace();
  return absl::OkStatus();
}

absl::Status ShardUpload::Write(const v1::StateChunk& c) {
  if (fd_ < 0) PT_RETURN_IF_ERROR(Begin(c));
  if (c.file() != current_.file || c.offset() != offset_ ||
      offset_ + static_cast<int64_t>(c.data().size()) > current_.bytes) {
    return absl::DataLossError(absl::StrCat(
        current_.file, ": chunk of '", c.file(), "' at offset ", c.offset(), " (", c.data().size(),
        " bytes) does not continue the ", offset_, " of ", current_.bytes, " bytes received"));
  }
  if (before_write_ != nullptr) before_write_(part_);
  for (size_t done = 0; done < c.data().size();) {
    const ssize_t n = pwrite(fd_, c.data().data() + done, c.data().size() - done,
                             static_cast<off_t>(offset_ + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("writing ", part_, ": ", strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  PT_RETURN_IF_ERROR(digest_->Update(c.data()));
  offset_ += static_cast<int64_t>(c.data().size());
  if (offset_ < current_.bytes) return absl::OkStatus();
  return Complete();
}

absl::Status ShardUpload::Complete() {
  // The file is complete: durable, as announced, then under its name.
  const bool synced = fsync(fd_) == 0;
  const int sync_errno = errno;
  close(fd_);
  fd_ = -1;
  if (!synced) {
    return absl::UnavailableError(absl::StrCat("fsync ", part_, ": ", strerror(sync_errno)));
  }
  PT_ASSIGN_OR_RETURN(const io::FileDigest digest, digest_->Finish());
  if (digest.sha256 != current_.sha256) {
    return absl::DataLossError(absl::StrCat(current_.file, ": received bytes have SHA-256 ",
                                            digest.sha256, ", the worker announced ",
                                            current_.sha256));
  }
  const std::string final_path = io::JoinPath(target_.staging, current_.file);
  if (rename(part_.c_str(), final_path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("rename ", part_, " -> ", final_path, ": ", strerror(errno)));
  }
  part_.clear();
  PT_RETURN_IF_ERROR(io::SyncDirectory(target_.staging));
  ++files_;
  bytes_ += current_.bytes;
  return absl::OkStatus();
}

absl::Status ShardUpload::Finish() const {
  if (fd_ < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(current_.file, ": the upload ended after ", offset_,
                                          " of ", current_.bytes, " bytes"));
}

ShardDownload::~ShardDownload() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<bool> ShardDownload::Next(v1::StateChunk* chunk) {
  while (index_ < files_.size() && fd_ >= 0 && offset_ >= files_[index_].shard.bytes) {
    close(fd_);
    fd_ = -1;
    ++index_;
  }
  if (index_ == files_.size()) return false;
  const StateFile& f = files_[index_];
  chunk->Clear();
  chunk->set_file(f.shard.file);
  if (fd_ < 0) {
    // Confined to the checkpoint's directory: a link in it leads nowhere outside.
    PT_ASSIGN_OR_RETURN(fd_, io::OpenConfinedFile(f.dir, f.shard.file));
    offset_ = 0;
    chunk->set_first_layer(f.shard.first_layer);
    chunk->set_last_layer(f.shard.last_layer);
    chunk->set_sha256(f.shard.sha256);
    chunk->set_bytes(f.shard.bytes);
  }
  const int64_t n = std::min(kChunkBytes, f.shard.bytes - offset_);
  std::string* data = chunk->mutable_data();
  data->resize(static_cast<size_t>(n));
  if (pread(fd_, data->data(), static_cast<size_t>(n), offset_) != n) {
    return absl::DataLossError(
        absl::StrCat(f.path, ": shorter than the ", f.shard.bytes,
                     " bytes its manifest names (changed since it was verified?)"));
  }
  chunk->set_offset(offset_);
  offset_ += n;
  return true;
}

}  // namespace pipetrain::coordinator
