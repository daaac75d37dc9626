#include "client/cli/interrupt.h"

#include <csignal>

namespace pipetrain::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
int g_depth = 0;  // live scopes (one thread).

void OnSignal(int /*sig*/) { g_interrupted = 1; }

}  // namespace

InterruptScope::InterruptScope() : outermost_(g_depth++ == 0) {
  if (outermost_) g_interrupted = 0;
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

}  // namespace pipetrain::cli
