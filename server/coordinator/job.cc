#include "server/coordinator/job.h"

#include <algorithm>

namespace pipetrain::coordinator {

void OperationBook::Reset(int ranks) {
  step = -1;
  assigned.assign(ranks, false);
  runs_sent.assign(ranks, 0);
  runs_answered.assign(ranks, 0);
  reports.assign(ranks, std::nullopt);
  saved.assign(ranks, false);
  error = absl::OkStatus();
}

std::vector<int> OperationBook::UnansweredRanks() const {
  std::vector<int> ranks;
  for (size_t rank = 0; rank < runs_sent.size(); ++rank) {
    if (runs_answered[rank] < runs_sent[rank]) ranks.push_back(static_cast<int>(rank));
  }
  return ranks;
}

std::vector<int> OperationBook::RanksWithoutReport() const {
  std::vector<int> ranks;
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    if (!reports[rank].has_value()) ranks.push_back(static_cast<int>(rank));
  }
  return ranks;
}

bool OperationBook::AllAssigned() const {
  return std::all_of(assigned.begin(), assigned.end(), [](bool b) { return b; });
}

bool OperationBook::AllReported() const { return RanksWithoutReport().empty(); }

bool OperationBook::AllSaved() const {
  return std::all_of(saved.begin(), saved.end(), [](bool b) { return b; });
}

bool CommitBook::AllCommitted() const {
  return std::all_of(committed.begin(), committed.end(), [](bool b) { return b; });
}

std::vector<int> CommitBook::Unconfirmed() const {
  std::vector<int> ranks;
  for (size_t rank = 0; rank < committed.size(); ++rank) {
    if (!committed[rank]) ranks.push_back(static_cast<int>(rank));
  }
  return ranks;
}

}  // namespace pipetrain::coordinator
