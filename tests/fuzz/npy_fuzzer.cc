// libFuzzer target: the .npy header parser (common/io/npy ParseNpyHeader), which reads the
// untrusted npy: data files. Any input is parsed without reading outside it; an accepted header
// is consistent (a known little-endian dtype, C order, a shape whose data exactly fills the rest
// of the input), and every refusal names its source.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/io/npy.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pipetrain::io::NpyHeader> h = pipetrain::io::ParseNpyHeader(bytes, "fuzz.npy");
  if (!h.ok()) {
    PT_FUZZ_CHECK(h.status().code() == absl::StatusCode::kInvalidArgument);
    PT_FUZZ_CHECK(h.status().message().find("fuzz.npy") == 0);
    return 0;
  }
  PT_FUZZ_CHECK(h->major_version >= 1 && h->major_version <= 3 && h->minor_version == 0);
  PT_FUZZ_CHECK(h->kind == 'f' || h->kind == 'i' || h->kind == 'u' || h->kind == 'b');
  PT_FUZZ_CHECK(h->item_bytes == 1 || h->item_bytes == 2 || h->item_bytes == 4 ||
                h->item_bytes == 8);
  PT_FUZZ_CHECK(h->descr.size() >= 2 && (h->descr[0] != '>' || h->item_bytes == 1));
  PT_FUZZ_CHECK(h->data_offset >= 10 && h->data_offset <= static_cast<int64_t>(size));
  int64_t elements = 1;
  for (int64_t d : h->shape) {
    PT_FUZZ_CHECK(d >= 0);
    elements *= d;  // cannot overflow: elements x item_bytes fits in the input
  }
  PT_FUZZ_CHECK(elements == h->elements);
  PT_FUZZ_CHECK(h->data_offset + elements * h->item_bytes == static_cast<int64_t>(size));
  PT_FUZZ_CHECK(!pipetrain::io::NpyDtypeName(*h).empty());
  return 0;
}
