// Dense float32 row-major matrices: the one tensor type of pipetrain's numerics.
//
// Every activation, gradient and target crossing a layer (or the wire) is a 2-D row-major float32
// matrix [rows, features]. For token models a row is one token: a micro-batch of b samples of
// context T has b*T rows. Token ids and class labels travel as exactly representable floats.
#ifndef PIPETRAIN_COMMON_MATH_TENSOR_H_
#define PIPETRAIN_COMMON_MATH_TENSOR_H_

#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::math {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<Matrix>;
using ConstMatrixMap = Eigen::Map<const Matrix>;
using RowVector = Eigen::Matrix<float, 1, Eigen::Dynamic, Eigen::RowMajor>;

// A view of `m` as a mutable / read-only map.
inline MatrixMap AsMap(Matrix& m) { return MatrixMap(m.data(), m.rows(), m.cols()); }
inline ConstMatrixMap AsConstMap(const Matrix& m) {
  return ConstMatrixMap(m.data(), m.rows(), m.cols());
}

// A row-major float32 parameter or state tensor with a name and shape (safetensors-compatible).
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major; size == product of shape.
};

// Number of elements of a shape (1 for a scalar shape {}).
inline int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_TENSOR_H_
