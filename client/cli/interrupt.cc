#include "client/cli/interrupt.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <csignal>
#include <utility>

namespace pipetrain::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
int g_depth = 0;  // live scopes (one thread).
// A pipe the handler writes a byte to, so that an InterruptWatcher's thread wakes up (created by
// the first scope, kept for the process's life; non-blocking, so a full pipe never blocks the
// handler).
int g_wake[2] = {-1, -1};

void OnSignal(int /*sig*/) {
  const int saved = errno;
  g_interrupted = 1;
  if (g_wake[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = write(g_wake[1], &byte, 1);
  }
  errno = saved;
}

// Reads whatever is in the non-blocking pipe end `fd`.
void Drain(int fd) {
  char buf[64];
  while (read(fd, buf, sizeof buf) > 0) {
  }
}

}  // namespace

InterruptScope::InterruptScope() : outermost_(g_depth++ == 0) {
  if (outermost_) {
    g_interrupted = 0;
    if (g_wake[0] < 0 && pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) g_wake[0] = g_wake[1] = -1;
    if (g_wake[0] >= 0) Drain(g_wake[0]);  // bytes of an earlier scope's signals.
  }
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

InterruptScope::~InterruptScope() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  --g_depth;
}

bool InterruptScope::Interrupted() { return g_interrupted != 0; }

InterruptWatcher::InterruptWatcher(std::function<void()> on_interrupt)
    : on_interrupt_(std::move(on_interrupt)) {
  if (pipe2(stop_, O_CLOEXEC) != 0) stop_[0] = stop_[1] = -1;
  thread_ = std::thread([this] { Loop(); });
}

InterruptWatcher::~InterruptWatcher() {
  if (stop_[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = write(stop_[1], &byte, 1);
  }
  thread_.join();
  for (int fd : stop_) {
    if (fd >= 0) close(fd);
  }
}

void InterruptWatcher::Loop() {
  for (;;) {
    if (InterruptScope::Interrupted()) {
      on_interrupt_();
      return;
    }
    // Without the pipes (pipe2 failed) there is nothing to wait on: the command is not
    // interruptible this way.
    if (stop_[0] < 0 || g_wake[0] < 0) return;
    pollfd fds[2] = {{stop_[0], POLLIN, 0}, {g_wake[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if ((fds[0].revents & (POLLIN | POLLHUP)) != 0) return;  // the destructor.
    if ((fds[1].revents & POLLIN) != 0) Drain(g_wake[0]);
  }
}

}  // namespace pipetrain::cli
