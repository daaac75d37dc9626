// The math of one instruction-set level: factories of the layers and losses whose code was
// compiled for that level, and the process-wide Eigen settings of that level's copy of Eigen.
//
// Every floating-point translation unit of the layers and losses (and Eigen's templates they
// instantiate) is compiled once per level of BuiltIsas() and linked into the binary as one
// object per level whose symbols are all local except its entry function, so two levels never
// share a function (docs/performance.md, "Instruction sets"). A Layer or Loss made by
// KernelsFor(isa) runs only that level's code, through its virtual functions. Objects cross
// between levels only through the Layer and Loss interfaces, whose matrices are unaligned maps.
#ifndef PIPETRAIN_COMMON_MATH_KERNELS_H_
#define PIPETRAIN_COMMON_MATH_KERNELS_H_

#include <cstdint>
#include <memory>

#include "common/math/isa.h"
#include "common/math/layer.h"
#include "common/math/llama_block.h"
#include "common/math/loss.h"

namespace pipetrain::math {

// The layer and loss factories of one level; the arguments are those of the layer classes'
// constructors (linear.h, activations.h, layer_norm.h, rms_norm.h, embedding.h,
// transformer_block.h, llama_block.h, loss.h).
// Immutable and thread-safe; the objects live for the whole process.
class Kernels {
 public:
  virtual ~Kernels() = default;

  // The level this code was compiled for.
  virtual Isa isa() const = 0;

  virtual std::unique_ptr<Layer> MakeLinear(int64_t in_features, int64_t out_features,
                                            bool bias) const = 0;
  virtual std::unique_ptr<Layer> MakeRelu(int64_t features) const = 0;
  virtual std::unique_ptr<Layer> MakeGelu(int64_t features) const = 0;
  virtual std::unique_ptr<Layer> MakeLayerNorm(int64_t features, float eps) const = 0;
  virtual std::unique_ptr<Layer> MakeRmsNorm(int64_t features, float eps) const = 0;
  virtual std::unique_ptr<Layer> MakeEmbedding(int64_t vocab_size, int64_t dim, int64_t context,
                                               bool position_table) const = 0;
  virtual std::unique_ptr<Layer> MakeTransformerBlock(int64_t dim, int64_t heads, int64_t context,
                                                      int64_t mlp_ratio) const = 0;
  virtual std::unique_ptr<Layer> MakeLlamaBlock(const LlamaBlockConfig& config) const = 0;
  virtual std::unique_ptr<Loss> MakeSoftmaxCrossEntropy() const = 0;
  virtual std::unique_ptr<Loss> MakeMse() const = 0;

  // Pins this level's GEMM blocking (PinEigenBlockingForReproducibility) and sets its Eigen
  // thread count to `threads` (>= 1). Each level has its own copy of Eigen's process-wide
  // settings, so whoever runs a level's layers calls this first. Process-wide for this level; not
  // thread-safe against concurrent products of this level.
  virtual void ConfigureEigen(int threads) const = 0;

  // This level's float32 GEMM rate in GFLOP/s on the calling thread with one Eigen thread:
  // 256x256x256 products repeated for about `seconds`; restores the thread count. > 0.
  virtual double MeasureGemmGflops(double seconds) const = 0;
};

// The kernels of `isa`, which must be one of BuiltIsas() (ParseIsa checks names). The caller
// must make sure this CPU runs `isa` (CpuSupportsIsa) before running its layers. Thread-safe.
const Kernels& KernelsFor(Isa isa);

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_KERNELS_H_
