// StateDirLock: one coordinator per state directory (--state-dir). Two coordinators on one
// directory would both restore its jobs, and the one whose job ends first would delete the other's
// journal record (docs/recovery.md, "One coordinator per state directory").
//
//   state-dir/
//     coordinator.lock    "pid 4242\nhost node-1\naddress 10.0.0.5:7070\n": the holder
//
// The lock is an exclusive flock(2) on state-dir/coordinator.lock, held through an open file
// description for the life of the StateDirLock (in practice the process's). The kernel releases it
// when the process ends however it ends, SIGKILL included, so a lock file left by a dead process
// never blocks: only a live holder does. The file itself stays (removing it while a coordinator
// runs would let a second one lock a new file); its contents only name the holder for the error
// another coordinator gets.
//
// Thread-safe: SetAddress may be called from any thread.
#ifndef PIPETRAIN_SERVER_COORDINATOR_STATE_DIR_LOCK_H_
#define PIPETRAIN_SERVER_COORDINATOR_STATE_DIR_LOCK_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain::coordinator {

class StateDirLock {
 public:
  // The lock file's name inside the state directory.
  static constexpr char kFileName[] = "coordinator.lock";

  // Creates `state_dir` if missing, locks its lock file (creating it) and records this process as
  // the holder: its pid, host name and `address` (where it serves; may be refined later with
  // SetAddress). Errors: FAILED_PRECONDITION if another live process holds the lock, naming the
  // holder its file records and the lock file; INVALID_ARGUMENT for an empty path; I/O errors
  // naming the path.
  static absl::StatusOr<std::unique_ptr<StateDirLock>> Acquire(const std::string& state_dir,
                                                               const std::string& address);

  // Releases the lock (the lock file stays).
  ~StateDirLock();
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;

  // The lock file's path.
  const std::string& path() const { return path_; }

  // Records `address` as the holder's (e.g. HOST:PORT once a port of 0 was bound). I/O errors
  // naming the file; the lock is held either way.
  absl::Status SetAddress(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  StateDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  // Constant after construction.
  const std::string path_;
  const int fd_;  // the locked open file description; closed by the destructor.

  // Serialises rewrites of the holder record.
  absl::Mutex mu_;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_STATE_DIR_LOCK_H_
