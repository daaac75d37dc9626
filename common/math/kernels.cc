#include "common/math/kernels.h"

// The entry of each level's object (kernels_variant.cc; common/math/CMakeLists.txt).
extern "C" {
#ifdef PIPETRAIN_ISA_HAVE_GENERIC
const pipetrain::math::Kernels* pipetrain_math_kernels_generic();
#endif
#ifdef PIPETRAIN_ISA_HAVE_X86_64_V3
const pipetrain::math::Kernels* pipetrain_math_kernels_x86_64_v3();
#endif
#ifdef PIPETRAIN_ISA_HAVE_X86_64_V4
const pipetrain::math::Kernels* pipetrain_math_kernels_x86_64_v4();
#endif
}

namespace pipetrain::math {

const Kernels& KernelsFor(Isa isa) {
  switch (isa) {
#ifdef PIPETRAIN_ISA_HAVE_GENERIC
    case Isa::kGeneric:
      return *pipetrain_math_kernels_generic();
#endif
#ifdef PIPETRAIN_ISA_HAVE_X86_64_V3
    case Isa::kX86_64_V3:
      return *pipetrain_math_kernels_x86_64_v3();
#endif
#ifdef PIPETRAIN_ISA_HAVE_X86_64_V4
    case Isa::kX86_64_V4:
      return *pipetrain_math_kernels_x86_64_v4();
#endif
    default:
      break;
  }
  // A level that is not built: a programming error (callers get levels from BuiltIsas, ParseIsa
  // or the negotiation, which only yield built ones). Fall back to the lowest built level.
  return KernelsFor(BuiltIsas().front());
}

}  // namespace pipetrain::math
