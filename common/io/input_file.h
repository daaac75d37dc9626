// Reading a file a user names (a --model or --data path) under a size limit: only a regular file
// is read, and its size is checked before the first byte is, so that /dev/zero, a FIFO or a huge
// file is an error instead of a read that blocks or runs out of memory.
#ifndef PIPETRAIN_COMMON_IO_INPUT_FILE_H_
#define PIPETRAIN_COMMON_IO_INPUT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::io {

// Whether ReadInputFile decompresses a file that starts with the gzip magic bytes.
enum class InputCompression { kNone, kGzipDetected };

// Returns the contents of the file at `path` (symbolic links followed), decompressed if
// `compression` is kGzipDetected and the file is gzip-compressed. `max_bytes` bounds the file's
// size and, for a gzip file, its decompressed size. Errors: NOT_FOUND if it does not exist;
// INVALID_ARGUMENT naming the path and what it is when it is not a regular file (a directory, a
// character or block device such as /dev/zero, a FIFO, a socket); RESOURCE_EXHAUSTED naming the
// path, its size and `max_bytes` when it is larger (checked before reading; decompressed sizes
// while decompressing); DATA_LOSS for a corrupt gzip stream; others by errno. Every message starts
// with `what` (e.g. "model spec file: '/dev/zero' is a character device, not a regular file").
// Thread-safe.
absl::StatusOr<std::string> ReadInputFile(absl::string_view what, const std::string& path,
                                          int64_t max_bytes, InputCompression compression);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_INPUT_FILE_H_
