// The npy: data sets: a table of features and targets from two NumPy .npy files
// (docs/data.md, "npy"). Internal to common/io: users open them through OpenDataset("npy:...").
#ifndef PIPETRAIN_COMMON_IO_NPY_DATASET_H_
#define PIPETRAIN_COMMON_IO_NPY_DATASET_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/dataset.h"

namespace pipetrain::io {

// Opens "npy:`arg`". `arg` is FEATURES,TARGETS (two paths separated by the only comma) or a
// directory holding x.npy (features) and y.npy (targets). Features: float32, shape [N, F] (or
// [N]: F = 1), finite. Targets when options.regression_targets is 0 (a class-label loss): int64 or
// int32 labels in [0, 2^24), shape [N] or [N, 1]; else float32 targets [N, K] (or [N]: K = 1),
// finite. C order, little-endian (ParseNpyHeader). Rows are held out as csv's (every 5th).
// Errors: INVALID_ARGUMENT naming the file and what was found (dtype, shape, the row and column
// of a bad value, differing row counts, a spec that is neither form); NOT_FOUND for a missing
// file; RESOURCE_EXHAUSTED beyond options.max_file_bytes or options.max_samples rows.
absl::StatusOr<std::unique_ptr<Dataset>> OpenNpyDataset(absl::string_view arg,
                                                        const DatasetOptions& options);

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_NPY_DATASET_H_
