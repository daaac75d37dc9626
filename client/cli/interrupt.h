// SIGINT/SIGTERM as a request to stop: while an InterruptScope lives, the two signals set a flag
// (instead of killing the process) that long-running commands check between steps, so they can
// end their job, stop their daemons and say what happened.
#ifndef PIPETRAIN_CLIENT_CLI_INTERRUPT_H_
#define PIPETRAIN_CLIENT_CLI_INTERRUPT_H_

#include <signal.h>

#include <functional>
#include <thread>

namespace pipetrain::cli {

// Installs the handler (without SA_RESTART, so a blocking read returns EINTR) and clears the
// flag; restores the previous handlers when destroyed. Scopes may nest (the inner one restores
// the outer one's handler). Not thread-safe: create and destroy on one thread.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  // Whether SIGINT or SIGTERM arrived since the outermost live scope was created.
  // Async-signal-safe and thread-safe.
  static bool Interrupted();

 private:
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
  bool outermost_ = false;
};

// Runs `on_interrupt` once, on a thread of its own, when SIGINT or SIGTERM arrives while it lives
// inside an InterruptScope (at once if one arrived already): for a command blocked in a call that
// only another thread can end (`pipetrain watch` cancels its stream). The destructor stops and
// joins the thread (after `on_interrupt` returned, if it ran). Create and destroy it on the
// scope's thread; `on_interrupt` must be thread-safe.
class InterruptWatcher {
 public:
  explicit InterruptWatcher(std::function<void()> on_interrupt);
  ~InterruptWatcher();
  InterruptWatcher(const InterruptWatcher&) = delete;
  InterruptWatcher& operator=(const InterruptWatcher&) = delete;

 private:
  void Loop();

  const std::function<void()> on_interrupt_;
  int stop_[2] = {-1, -1};  // a pipe: the destructor writes to wake the thread.
  std::thread thread_;
};

// The exit status of a command stopped by SIGINT/SIGTERM (128 + SIGINT, as shells report it).
inline constexpr int kInterruptedExitCode = 130;

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_INTERRUPT_H_
