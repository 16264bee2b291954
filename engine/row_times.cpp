// specwatch_cpu::row_times(x, weight): one bf16 row x [1, in] times a bf16 weight [out, in]^T, the
// products of the plain decode step (engine/kernels.py builds it, a library of its own, for AVX512-BF16).
//
// A decode step streams every weight once for one row, so the product is a matrix-vector one and
// its speed is how fast the weight is read. Inductor's bf16 reduction (engine/decoder.py `_row_times`)
// widens x and each weight row to float32 again for every output and adds after a separate multiply;
// here bf16 x meets the bf16 weight in the CPU's bf16 dot product (AVX512-BF16), 32 products an
// instruction into float32 sums, each weight row streaming in order with four sums in flight along it
// (four rows a pass, one sum in flight each, read 1.5-2x slower: four streams at once; widening the
// weight to float32 for FMAs instead, 2x slower again).
// Sums are float32 throughout, as in the reduction; only their order differs. (float32 models keep the
// reduction: it streamed their weights faster than a float32 path of this kernel did.)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <immintrin.h>
#if !defined(__AVX512BF16__)
#error "row_times needs AVX512-BF16 (engine/kernels.py builds it with -mavx512bf16, only where the CPU has it)"
#endif

namespace {

inline float widen(uint16_t bf16) {
  uint32_t bits = uint32_t(bf16) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// x[from..in) . w[from..in), the tail of a row beyond a multiple of 32
float dot_rest(const uint16_t* w, const uint16_t* x, int64_t from, int64_t in) {
  float sum = 0.f;
  for (int64_t i = from; i < in; ++i) sum += widen(x[i]) * widen(w[i]);
  return sum;
}

// 32 products an instruction into float32 sums
inline __m512 dot32(__m512 acc, const uint16_t* w, const uint16_t* x) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(w), (__m512bh)_mm512_loadu_si512(x));
}

// one weight row, four sums in flight along it: the row streams in order
float dot_row(const uint16_t* w, const uint16_t* x, int64_t in) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 128 <= in; i += 128) {
    a0 = dot32(a0, w + i, x + i);
    a1 = dot32(a1, w + i + 32, x + i + 32);
    a2 = dot32(a2, w + i + 64, x + i + 64);
    a3 = dot32(a3, w + i + 96, x + i + 96);
  }
  for (; i + 32 <= in; i += 32) a0 = dot32(a0, w + i, x + i);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) + dot_rest(w, x, i, in);
}

void row_times_into(const uint16_t* w, const uint16_t* x, int64_t in, int64_t out_features, c10::BFloat16* out) {
  at::parallel_for(0, out_features, 64, [&](int64_t first, int64_t last) {
    for (int64_t row = first; row < last; ++row) out[row] = c10::BFloat16(dot_row(w + row * in, x, in));
  });
}

at::Tensor row_times(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.scalar_type() == at::kBFloat16,
              "row_times: weight must be a contiguous bfloat16 [out, in] matrix");
  const int64_t in = weight.size(1);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(0) == 1 && x.size(1) == in,
              "row_times: x must be bfloat16 [1, in]");
  const at::Tensor row = x.contiguous();
  at::Tensor out = at::empty({1, weight.size(0)}, row.options());
  row_times_into(reinterpret_cast<const uint16_t*>(weight.const_data_ptr()),
                 reinterpret_cast<const uint16_t*>(row.const_data_ptr()), in, weight.size(0),
                 out.mutable_data_ptr<c10::BFloat16>());
  return out;
}

}  // namespace

// a fragment: each kernel is a library of its own, loaded or not independently of the others
TORCH_LIBRARY_FRAGMENT(specwatch_cpu, m) { m.def("row_times(Tensor x, Tensor weight) -> Tensor"); }
TORCH_LIBRARY_IMPL(specwatch_cpu, CPU, m) { m.impl("row_times", &row_times); }
