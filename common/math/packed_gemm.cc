#include "common/math/packed_gemm.h"

#include <algorithm>
#include <memory>
#include <new>

#include "common/math/tree_sum.h"

namespace pipetrain::math {

// The product in Eigen's terms: res (m x n, column-major) = lhs (m x k) * rhs (k x n,
// column-major). Eigen evaluates a row-major destination as its transpose, so y = x W^T is
// y^T = W x^T (lhs W, row-major) and dx = dy W is dx^T = W^T dy^T (lhs W^T, column-major).
class PackedWeightAccess {
 public:
  using Index = Eigen::Index;
  using Traits = Eigen::internal::gebp_traits<float, float>;
  // The destination and kernel of Eigen's column-major GEMM (GeneralMatrixMatrix.h).
  using ResMapper =
      Eigen::internal::blas_data_mapper<float, Index, Eigen::ColMajor, Eigen::Unaligned, 1>;
  using Gebp = Eigen::internal::gebp_kernel<float, float, Index, ResMapper, Traits::mr, Traits::nr,
                                            false, false>;

  struct Blocking {
    Index kc, mc, nc;
  };

  // The blocking Eigen's product of these sizes uses (GeneralMatrixMatrix.h: scaleAndAddTo).
  static Blocking EigenBlocking(Index m, Index n, Index k) {
    Eigen::internal::gemm_blocking_space<Eigen::ColMajor, float, float, Eigen::Dynamic,
                                         Eigen::Dynamic, Eigen::Dynamic, 1, false>
        blocking(m, n, k, 1, true);
    return {blocking.kc(), std::min(m, blocking.mc()), std::min(n, blocking.nc())};
  }

  // Whether Eigen evaluates `dst (n x m as the caller sees it) = product with depth k` with its
  // sequential blocked GEMM (and not a lazy coefficient product, a GEMV or several threads).
  static bool EigenRunsSequentialGemm(Index m, Index n, Index k) {
    if (m <= 1 || n <= 1 || k <= 0) return false;
    if (k + m + n < EIGEN_GEMM_TO_COEFFBASED_THRESHOLD) return false;
    return Eigen::nbThreads() == 1;
  }

  // Size in floats of block (i2, k2): kc x mc, rounded to whole packets so every block starts
  // aligned (the kernel loads the packed lhs with aligned loads).
  static Index BlockFloats(const Blocking& b) {
    constexpr Index kAlign = EIGEN_MAX_ALIGN_BYTES / sizeof(float);
    const Index n = b.kc * b.mc;
    return kAlign > 1 ? (n + kAlign - 1) / kAlign * kAlign : n;
  }

  // Packs lhs (m x k, storage `Order`, outer stride `stride`) for `b` into *p unless it holds it.
  // False if the memory for it cannot be had (*p then holds nothing).
  template <int Order>
  static bool Pack(const float* lhs, Index stride, Index m, Index k, const Blocking& b,
                   PackedWeight* p) {
    if (p->valid_ && p->source_ == lhs && p->rows_ == m && p->depth_ == k && p->kc_ == b.kc &&
        p->mc_ == b.mc) {
      return true;
    }
    p->valid_ = false;
    const Index row_blocks = (m + b.mc - 1) / b.mc;
    const Index depth_blocks = (k + b.kc - 1) / b.kc;
    try {
      p->data_.resize(static_cast<size_t>(row_blocks * depth_blocks * BlockFloats(b)));
    } catch (const std::bad_alloc&) {
      p->data_ = {};
      return false;
    }
    using Mapper = Eigen::internal::const_blas_data_mapper<float, Index, Order>;
    Eigen::internal::gemm_pack_lhs<float, Index, Mapper, Traits::mr, Traits::LhsProgress,
                                   typename Traits::LhsPacket4Packing, Order>
        pack_lhs;
    const Mapper map(lhs, stride);
    float* block = p->data_.data();
    for (Index i2 = 0; i2 < m; i2 += b.mc) {
      const Index actual_mc = std::min(i2 + b.mc, m) - i2;
      for (Index k2 = 0; k2 < k; k2 += b.kc) {
        const Index actual_kc = std::min(k2 + b.kc, k) - k2;
        pack_lhs(block, map.getSubMapper(i2, k2), actual_kc, actual_mc);
        block += BlockFloats(b);
      }
    }
    p->source_ = lhs;
    p->rows_ = m;
    p->depth_ = k;
    p->kc_ = b.kc;
    p->mc_ = b.mc;
    p->valid_ = true;
    return true;
  }

  // Packs lhs (m x k) into *p again with the blocking *p was last packed with, if *p was packed
  // for an lhs of these sizes and does not hold it now.
  template <int Order>
  static void Repack(const float* lhs, Index stride, Index m, Index k, PackedWeight* p) {
    if (p->rows_ != m || p->depth_ != k || p->kc_ == 0 || p->mc_ == 0) return;
    Pack<Order>(lhs, stride, m, k, Blocking{p->kc_, p->mc_, 0}, p);
  }

  // res = packed lhs * rhs: Eigen's sequential GEMM loop with the lhs blocks taken from `p`.
  static void Multiply(PackedWeight& p, const Blocking& b, const float* rhs, Index rhs_stride,
                       Index n, float* res, Index res_stride) {
    using RhsMapper = Eigen::internal::const_blas_data_mapper<float, Index, Eigen::ColMajor>;
    Eigen::internal::gemm_pack_rhs<float, Index, RhsMapper, Traits::nr, Eigen::ColMajor> pack_rhs;
    Gebp gebp;
    const RhsMapper rhs_map(rhs, rhs_stride);
    ResMapper res_map(res, res_stride, 1);
    const Index m = p.rows_;
    const Index k = p.depth_;
    float* block_b = p.rhs_block_.data();
    const bool pack_rhs_once = b.mc != m && b.kc == k && b.nc == n;
    const float* block_a = p.data_.data();
    for (Index i2 = 0; i2 < m; i2 += b.mc) {
      const Index actual_mc = std::min(i2 + b.mc, m) - i2;
      for (Index k2 = 0; k2 < k; k2 += b.kc) {
        const Index actual_kc = std::min(k2 + b.kc, k) - k2;
        for (Index j2 = 0; j2 < n; j2 += b.nc) {
          const Index actual_nc = std::min(j2 + b.nc, n) - j2;
          if (!pack_rhs_once || i2 == 0) {
            pack_rhs(block_b, rhs_map.getSubMapper(k2, j2), actual_kc, actual_nc);
          }
          gebp(res_map.getSubMapper(i2, j2), block_a, block_b, actual_mc, actual_kc, actual_nc,
               1.0f);
        }
        block_a += BlockFloats(b);
      }
    }
  }

  // res (m x n) = lhs * rhs with lhs packed in `p` (storage `Order`); false if there is no `p`,
  // Eigen would not run its sequential GEMM here or the packing's memory is missing (the caller
  // then runs Eigen's expression).
  template <int Order>
  static bool Run(const float* lhs, Index lhs_stride, Index m, Index k, const float* rhs,
                  Index rhs_stride, Index n, MatrixMap res, PackedWeight* p) {
    if (p == nullptr || !EigenRunsSequentialGemm(m, n, k)) return false;
    const Blocking b = EigenBlocking(m, n, k);
    if (!Pack<Order>(lhs, lhs_stride, m, k, b, p)) return false;
    const size_t rhs_floats = static_cast<size_t>(b.kc * b.nc);
    if (p->rhs_block_.size() < rhs_floats) {
      try {
        p->rhs_block_.resize(rhs_floats);
      } catch (const std::bad_alloc&) {
        return false;
      }
    }
    res.setZero();
    Multiply(*p, b, rhs, rhs_stride, n, res.data(), res.outerStride());
    return true;
  }
};

namespace {

// Floats from Eigen's aligned allocator (the kernel loads packed blocks with aligned loads),
// uninitialised. Throws std::bad_alloc.
struct AlignedFloats {
  explicit AlignedFloats(size_t n)
      : data(static_cast<float*>(Eigen::internal::aligned_malloc(n * sizeof(float)))) {}
  ~AlignedFloats() { Eigen::internal::aligned_free(data); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data;
};

// Bytes of gw one pass of AccumulateDyTx keeps in cache while it adds every term to it: a
// fraction of a 512 KiB - 2 MiB L2 that leaves room for the terms' packed operands.
constexpr Eigen::Index kAccumulateBlockBytes = 128 * 1024;

// AccumulateDyTx where the terms share one shape and Eigen runs their product as its sequential
// GEMM with one depth block; false, having changed nothing, elsewhere. In Eigen's terms each term
// is gw^T (in x out, column-major) += x_t^T (in x r: x's storage read column-major) * dy_t (r x
// out, row-major), the operands Eigen's product for a row-major destination passes to its
// column-major GEMM. Each element of gw receives the terms' kernel results in term order, as from
// the products one after another.
bool AccumulateDyTxBlocked(absl::Span<const DyTxTerm> terms, MatrixMap gw) {
  using Index = Eigen::Index;
  using Traits = PackedWeightAccess::Traits;
  if (terms.size() < 2) return false;
  const Index m = gw.cols();
  const Index n = gw.rows();
  const Index k = terms[0].x.rows();
  for (const DyTxTerm& t : terms) {
    if (t.x.rows() != k || t.dy.rows() != k || t.x.cols() != m || t.dy.cols() != n) return false;
  }
  if (!PackedWeightAccess::EigenRunsSequentialGemm(m, n, k)) return false;
  const PackedWeightAccess::Blocking b = PackedWeightAccess::EigenBlocking(m, n, k);
  // Several depth blocks would interleave the terms' partial sums differently: run the terms.
  if (b.kc < k) return false;
  const Index lhs_floats = PackedWeightAccess::BlockFloats(b);
  const Index rhs_floats = PackedWeightAccess::BlockFloats({k, b.nc, 0});
  const size_t count = terms.size();
  std::unique_ptr<AlignedFloats> lhs_blocks, rhs_blocks;
  try {
    lhs_blocks = std::make_unique<AlignedFloats>(count * static_cast<size_t>(lhs_floats));
    rhs_blocks = std::make_unique<AlignedFloats>(count * static_cast<size_t>(rhs_floats));
  } catch (const std::bad_alloc&) {
    return false;
  }
  using LhsMapper = Eigen::internal::const_blas_data_mapper<float, Index, Eigen::ColMajor>;
  using RhsMapper = Eigen::internal::const_blas_data_mapper<float, Index, Eigen::RowMajor>;
  using ResMapper = PackedWeightAccess::ResMapper;
  Eigen::internal::gemm_pack_lhs<float, Index, LhsMapper, Traits::mr, Traits::LhsProgress,
                                 typename Traits::LhsPacket4Packing, Eigen::ColMajor>
      pack_lhs;
  Eigen::internal::gemm_pack_rhs<float, Index, RhsMapper, Traits::nr, Eigen::RowMajor> pack_rhs;
  PackedWeightAccess::Gebp gebp;
  ResMapper res(gw.data(), gw.outerStride(), 1);
  // Columns of gw^T per pass: whole panels of Traits::nr, so that every column is computed by the
  // same path of the kernel (a full panel, or one of the last few single columns) as in Eigen's
  // call over the whole block, and the packed columns of a pass start at a panel.
  const Index pass_cols =
      std::max<Index>(Traits::nr, kAccumulateBlockBytes / static_cast<Index>(sizeof(float)) /
                                      std::max<Index>(1, b.mc) / Traits::nr * Traits::nr);
  for (Index i2 = 0; i2 < m; i2 += b.mc) {
    const Index actual_mc = std::min(i2 + b.mc, m) - i2;
    for (size_t t = 0; t < count; ++t) {
      pack_lhs(lhs_blocks->data + t * lhs_floats,
               LhsMapper(terms[t].x.data(), terms[t].x.outerStride()).getSubMapper(i2, 0), k,
               actual_mc);
    }
    for (Index j2 = 0; j2 < n; j2 += b.nc) {
      const Index actual_nc = std::min(j2 + b.nc, n) - j2;
      for (size_t t = 0; t < count; ++t) {
        pack_rhs(rhs_blocks->data + t * rhs_floats,
                 RhsMapper(terms[t].dy.data(), terms[t].dy.outerStride()).getSubMapper(0, j2), k,
                 actual_nc);
      }
      for (Index c = 0; c < actual_nc; c += pass_cols) {
        const Index cols = std::min(c + pass_cols, actual_nc) - c;
        for (size_t t = 0; t < count; ++t) {
          gebp(res.getSubMapper(i2, j2 + c), lhs_blocks->data + t * lhs_floats,
               rhs_blocks->data + t * rhs_floats + c * k, actual_mc, k, cols, 1.0f);
        }
      }
    }
  }
  return true;
}

// Bytes of one slot of AccumulateDyTxNodeBlocked's tree: a block of gw and the log2(leaves) + 1
// slots of its tree stay in L2 while every term's update is added to them.
constexpr Eigen::Index kNodeBlockBytes = 32 * 1024;

// The packed operands and tree slots of AccumulateDyTxNodeBlocked for one block of gw^T.
struct NodePass {
  const float* lhs_blocks;  // term t's packed x^T block at t * lhs_floats.
  Eigen::Index lhs_floats;
  const float* rhs_blocks;  // term t's packed dy block at t * rhs_floats.
  Eigen::Index rhs_floats;
  Eigen::Index k;  // depth: the micro-batches' rows.
  int64_t leaf_size;
  int64_t leaves;
  float* slots;  // slot s at s * slot_floats.
  Eigen::Index slot_floats;
};

// Columns [c, c + cols) of the block: the node's tree evaluated in the slots (mc x cols each,
// column-major, stride mc), its root added to gw^T's block at `res` (column-major, stride
// `res_stride`).
void AddNodePass(const NodePass& p, Eigen::Index mc, Eigen::Index c, Eigen::Index cols, float* res,
                 Eigen::Index res_stride) {
  using ResMapper = PackedWeightAccess::ResMapper;
  PackedWeightAccess::Gebp gebp;
  const Eigen::Index floats = mc * cols;
  auto slot = [&](int s) { return p.slots + s * p.slot_floats; };
  auto add_term = [&](float* dst, int64_t t) {
    gebp(ResMapper(dst, mc, 1), p.lhs_blocks + t * p.lhs_floats,
         p.rhs_blocks + t * p.rhs_floats + c * p.k, mc, p.k, cols, 1.0f);
  };
  EvaluateTree(
      p.leaves,
      [&](int64_t j, int s) {
        std::fill(slot(s), slot(s) + floats, 0.0f);
        for (int64_t t = j * p.leaf_size; t < (j + 1) * p.leaf_size; ++t) add_term(slot(s), t);
      },
      [&](int64_t j, int s) {
        if (p.leaf_size != 1) return false;
        add_term(slot(s), j);
        return true;
      },
      [&](int s) {
        AddInTreeOrder(absl::MakeConstSpan(slot(s + 1), floats), absl::MakeSpan(slot(s), floats));
      });
  for (Eigen::Index col = 0; col < cols; ++col) {
    AddInTreeOrder(absl::MakeConstSpan(slot(0) + col * mc, mc),
                   absl::MakeSpan(res + col * res_stride, mc));
  }
}

// AccumulateDyTxNode where the terms share one shape, there are at least two, and Eigen runs their
// product as its sequential GEMM with one depth block; false, having changed nothing, elsewhere.
// Eigen's GEMM loop as in AccumulateDyTxBlocked, with every block of gw^T evaluating the node's
// tree in block-sized slots: a leaf is its terms' kernel results added to a zeroed slot in order,
// exactly as the product `leaf = dy^T x` (setZero, then the kernel adds its result) and `leaf +=`
// of the next term compute them; a right leaf of one term is added by the kernel to its left
// sibling directly (the same bits: the kernel adds its result r to the slot once, s + r, and
// s + (0 + r) equals s + r because no slot holds -0, docs/numerics.md); the root is added to gw.
bool AccumulateDyTxNodeBlocked(absl::Span<const DyTxTerm> terms, int64_t leaf_size, MatrixMap gw) {
  using Index = Eigen::Index;
  using Traits = PackedWeightAccess::Traits;
  const size_t count = terms.size();
  if (count < 2) return false;
  const Index m = gw.cols();
  const Index n = gw.rows();
  const Index k = terms[0].x.rows();
  for (const DyTxTerm& t : terms) {
    if (t.x.rows() != k || t.dy.rows() != k || t.x.cols() != m || t.dy.cols() != n) return false;
  }
  if (!PackedWeightAccess::EigenRunsSequentialGemm(m, n, k)) return false;
  const PackedWeightAccess::Blocking b = PackedWeightAccess::EigenBlocking(m, n, k);
  if (b.kc < k) return false;
  const int64_t leaves = static_cast<int64_t>(count) / leaf_size;
  const int slots = TreeSlots(leaves);
  const Index lhs_floats = PackedWeightAccess::BlockFloats(b);
  const Index rhs_floats = PackedWeightAccess::BlockFloats({k, b.nc, 0});
  const Index pass_cols =
      std::max<Index>(Traits::nr, kNodeBlockBytes / static_cast<Index>(sizeof(float)) /
                                      std::max<Index>(1, b.mc) / Traits::nr * Traits::nr);
  const Index slot_floats = b.mc * pass_cols;
  std::unique_ptr<AlignedFloats> lhs_blocks, rhs_blocks, slot_data;
  try {
    lhs_blocks = std::make_unique<AlignedFloats>(count * static_cast<size_t>(lhs_floats));
    rhs_blocks = std::make_unique<AlignedFloats>(count * static_cast<size_t>(rhs_floats));
    slot_data = std::make_unique<AlignedFloats>(static_cast<size_t>(slots * slot_floats));
  } catch (const std::bad_alloc&) {
    return false;
  }
  using LhsMapper = Eigen::internal::const_blas_data_mapper<float, Index, Eigen::ColMajor>;
  using RhsMapper = Eigen::internal::const_blas_data_mapper<float, Index, Eigen::RowMajor>;
  Eigen::internal::gemm_pack_lhs<float, Index, LhsMapper, Traits::mr, Traits::LhsProgress,
                                 typename Traits::LhsPacket4Packing, Eigen::ColMajor>
      pack_lhs;
  Eigen::internal::gemm_pack_rhs<float, Index, RhsMapper, Traits::nr, Eigen::RowMajor> pack_rhs;
  const NodePass pass{lhs_blocks->data, lhs_floats, rhs_blocks->data, rhs_floats, k,
                      leaf_size,        leaves,     slot_data->data,  slot_floats};
  for (Index i2 = 0; i2 < m; i2 += b.mc) {
    const Index mc = std::min(i2 + b.mc, m) - i2;
    for (size_t t = 0; t < count; ++t) {
      pack_lhs(lhs_blocks->data + t * lhs_floats,
               LhsMapper(terms[t].x.data(), terms[t].x.outerStride()).getSubMapper(i2, 0), k, mc);
    }
    for (Index j2 = 0; j2 < n; j2 += b.nc) {
      const Index nc = std::min(j2 + b.nc, n) - j2;
      for (size_t t = 0; t < count; ++t) {
        pack_rhs(rhs_blocks->data + t * rhs_floats,
                 RhsMapper(terms[t].dy.data(), terms[t].dy.outerStride()).getSubMapper(0, j2), k,
                 nc);
      }
      for (Index c = 0; c < nc; c += pass_cols) {
        // Whole panels of Traits::nr per pass, as in AccumulateDyTxBlocked: every column takes the
        // kernel path it takes in Eigen's call over the whole block.
        const Index cols = std::min(c + pass_cols, nc) - c;
        AddNodePass(pass, mc, c, cols, gw.data() + (j2 + c) * gw.outerStride() + i2,
                    gw.outerStride());
      }
    }
  }
  return true;
}

}  // namespace

void ProductXWt(ConstMatrixMap x, ConstMatrixMap w, MatrixMap y, PackedWeight* packed) {
  // y^T (out x r) = W (out x in, row-major) * x^T (in x r, column-major).
  if (!PackedWeightAccess::Run<Eigen::RowMajor>(w.data(), w.outerStride(), w.rows(), w.cols(),
                                                x.data(), x.outerStride(), x.rows(), y, packed)) {
    y.noalias() = x * w.transpose();
  }
}

void ProductDyW(ConstMatrixMap dy, ConstMatrixMap w, MatrixMap dx, PackedWeight* packed) {
  // dx^T (in x r) = W^T (in x out, column-major) * dy^T (out x r, column-major).
  if (!PackedWeightAccess::Run<Eigen::ColMajor>(w.data(), w.outerStride(), w.cols(), w.rows(),
                                                dy.data(), dy.outerStride(), dy.rows(), dx,
                                                packed)) {
    dx.noalias() = dy * w;
  }
}

void RepackXWt(ConstMatrixMap w, PackedWeight* packed) {
  PackedWeightAccess::Repack<Eigen::RowMajor>(w.data(), w.outerStride(), w.rows(), w.cols(),
                                              packed);
}

void RepackDyW(ConstMatrixMap w, PackedWeight* packed) {
  PackedWeightAccess::Repack<Eigen::ColMajor>(w.data(), w.outerStride(), w.cols(), w.rows(),
                                              packed);
}

bool AccumulateDyTx(absl::Span<const DyTxTerm> terms, MatrixMap gw) {
  if (AccumulateDyTxBlocked(terms, gw)) return true;
  for (const DyTxTerm& t : terms) gw.noalias() += t.dy.transpose() * t.x;
  return false;
}

}  // namespace pipetrain::math

namespace pipetrain::math {

bool AccumulateDyTxNode(absl::Span<const DyTxTerm> terms, int64_t leaf_size, MatrixMap gw) {
  const int64_t count = static_cast<int64_t>(terms.size());
  if (leaf_size < 1 || count % leaf_size != 0 || Log2OfPowerOfTwo(count / leaf_size) < 0) {
    return false;
  }
  if (count == 1) {
    // gw + (0 + r) is gw + r: Eigen's product with one depth block adds the kernel's result once.
    using Access = PackedWeightAccess;
    const DyTxTerm& t = terms[0];
    const Eigen::Index k = t.x.rows();
    if (!Access::EigenRunsSequentialGemm(gw.cols(), gw.rows(), k) ||
        Access::EigenBlocking(gw.cols(), gw.rows(), k).kc < k) {
      return false;
    }
    gw.noalias() += t.dy.transpose() * t.x;
    return true;
  }
  return AccumulateDyTxNodeBlocked(terms, leaf_size, gw);
}

}  // namespace pipetrain::math
