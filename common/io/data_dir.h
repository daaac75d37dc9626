// Where the bundled data sets (digits, text) are found at run time. Never a compiled-in
// source-tree path: an installed pipetrain finds them relative to its own binary, a build tree
// through the `share/pipetrain/data` link CMake makes in the build directory, and anyone can point
// elsewhere with $PIPETRAIN_DATA_DIR or `--data-dir DIR` (docs/data.md, docs/deploy.md).
#ifndef PIPETRAIN_COMMON_IO_DATA_DIR_H_
#define PIPETRAIN_COMMON_IO_DATA_DIR_H_

#include <string>

namespace pipetrain::io {

// Environment variable naming the bundled data directory; it wins over the binary's location.
inline constexpr char kDataDirEnv[] = "PIPETRAIN_DATA_DIR";

// Path of the bundled data relative to the directory holding an installed binary (bin/ beside
// share/, as `cmake --install` lays them out).
inline constexpr char kDataDirFromBinary[] = "../share/pipetrain/data";

// The directory holding the running executable (from /proc/self/exe), without a trailing slash;
// "" if it cannot be determined. Thread-safe.
std::string ExecutableDirectory();

// The bundled data directory given the value of $PIPETRAIN_DATA_DIR (`env`, nullptr or "" when
// unset) and the executable's directory: `env` if set, else `executable_dir` +
// "/../share/pipetrain/data" (or the relative kDataDirFromBinary if `executable_dir` is empty).
// Pure: checks nothing on disk; a missing directory shows up as NOT_FOUND naming the file when a
// data set is opened.
std::string ResolveDataDir(const char* env, const std::string& executable_dir);

// ResolveDataDir with the process's $PIPETRAIN_DATA_DIR and ExecutableDirectory(). Thread-safe
// as long as nobody calls setenv concurrently.
std::string DefaultDataDir();

}  // namespace pipetrain::io

#endif  // PIPETRAIN_COMMON_IO_DATA_DIR_H_
