// The tokens: data sets: a pre-tokenized corpus as nanoGPT's prepare.py writes it, a flat file of
// little-endian uint16 (or uint32) token ids, for next-token prediction with the samples of a text
// data set (docs/data.md, "tokens"). Internal to common/io: users open them through
// OpenDataset("tokens:...").
#ifndef PIPETRAIN_COMMON_IO_TOKEN_CORPUS_H_
#define PIPETRAIN_COMMON_IO_TOKEN_CORPUS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/dataset.h"

namespace pipetrain::io {

// Opens "tokens:`arg`": `arg` is PATH, PATH:uint16 or PATH:uint32 (the id type; uint16 by
// default, as nanoGPT writes). PATH is a file, whose last tenth (in tokens) is held out, or a
// directory holding train.bin (the training part) and val.bin (the held-out part), nanoGPT's
// layout. Files are memory-mapped, not read: they must not change while the data set is open
// (a file truncated meanwhile faults the process). Sample i of a part is the window of
// context + 1 ids starting at token i: inputs ids [i, i + context), targets ids
// [i + 1, i + context + 1), as a text data set's. Every id must be below options.vocab_size
// (the model's vocabulary; when 0, ids must be below 2^24 and the vocabulary is the largest id
// + 1), checked when the data set is opened. Errors: INVALID_ARGUMENT for a bad spec or context,
// a file whose size is not a whole number of ids, an id out of range (naming the file, the id,
// its token index and byte offset) or a training part shorter than context + 1 ids; NOT_FOUND for
// a missing file; RESOURCE_EXHAUSTED for more windows than options.max_samples.
absl::StatusOr<std::unique_ptr<Dataset>> OpenTokenCorpus(absl::string_view arg,
                                                         const DatasetOptions& options);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_TOKEN_CORPUS_H_
