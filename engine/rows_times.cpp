// specwatch_cpu::rows_times(x, weight): up to 8 bf16 rows x [n, in] times a bf16 weight [out, in]^T, the
// products of a forward of a few rows (a plain step: 1; a verification: k + 1) on a CPU with AVX512F but
// without AVX512-BF16 (engine/kernels.py builds it, a library of its own; engine/decoder.py `_Matrix` uses it).
//
// A forward of a few rows streams every weight once, so its speed is how fast the weight is read and widened.
// Without the bf16 dot product, each 16 weights are widened to float32 once (a zero-extend and a shift) and
// meet every row in an FMA: a second row costs its FMAs, not a second pass over the weight, where oneDNN's
// packed kernel, widening as well, took about as long again per row. Each row's sums run in the same order
// whatever the number of rows, so a verification scores a token exactly as the plain step would.
// Sums are float32, rounded to bf16 once, as torch's float32 product rounded to bf16.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <immintrin.h>
#if !defined(__AVX512F__)
#error "rows_times needs AVX512F (engine/kernels.py builds it with -mavx512f, only where the CPU has it)"
#endif

namespace {

constexpr int64_t MOST_ROWS = 8;

// 16 bf16 values widened to float32: a bf16 is the top half of a float32
inline __m512 widen16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

inline float widen(uint16_t bf16) {
  uint32_t bits = uint32_t(bf16) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// every row of x (float32 [N, in]) times weight rows [first, last), two sums in flight per row
template <int N>
void rows_into(const uint16_t* w, const float* x, int64_t in, int64_t out_features, int64_t first, int64_t last,
               c10::BFloat16* out) {
  for (int64_t o = first; o < last; ++o) {
    const uint16_t* row = w + o * in;
    __m512 sums[N][2];
    for (int n = 0; n < N; ++n) sums[n][0] = sums[n][1] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= in; i += 32) {
      const __m512 w0 = widen16(row + i), w1 = widen16(row + i + 16);
      for (int n = 0; n < N; ++n) {
        sums[n][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + n * in + i), sums[n][0]);
        sums[n][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + n * in + i + 16), sums[n][1]);
      }
    }
    for (int n = 0; n < N; ++n) {
      float sum = _mm512_reduce_add_ps(_mm512_add_ps(sums[n][0], sums[n][1]));
      for (int64_t j = i; j < in; ++j) sum += widen(row[j]) * x[n * in + j];
      out[n * out_features + o] = c10::BFloat16(sum);
    }
  }
}

using RowsInto = void (*)(const uint16_t*, const float*, int64_t, int64_t, int64_t, int64_t, c10::BFloat16*);
constexpr RowsInto BY_ROWS[MOST_ROWS] = {rows_into<1>, rows_into<2>, rows_into<3>, rows_into<4>,
                                         rows_into<5>, rows_into<6>, rows_into<7>, rows_into<8>};

at::Tensor rows_times(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.scalar_type() == at::kBFloat16,
              "rows_times: weight must be a contiguous bfloat16 [out, in] matrix");
  const int64_t in = weight.size(1), out_features = weight.size(0);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) == in && x.size(0) >= 1 &&
                  x.size(0) <= MOST_ROWS,
              "rows_times: x must be bfloat16 [n, in] with 1 <= n <= ", MOST_ROWS);
  const at::Tensor rows = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({x.size(0), out_features}, x.options());
  const auto* w = reinterpret_cast<const uint16_t*>(weight.const_data_ptr());
  const float* xs = rows.const_data_ptr<float>();
  c10::BFloat16* into = out.mutable_data_ptr<c10::BFloat16>();
  const RowsInto kernel = BY_ROWS[x.size(0) - 1];
  at::parallel_for(0, out_features, 16, [&](int64_t first, int64_t last) {
    kernel(w, xs, in, out_features, first, last, into);
  });
  return out;
}

}  // namespace

// a fragment: each kernel is a library of its own, loaded or not independently of the others
TORCH_LIBRARY_FRAGMENT(specwatch_cpu, m) { m.def("rows_times(Tensor x, Tensor weight) -> Tensor"); }
TORCH_LIBRARY_IMPL(specwatch_cpu, CPU, m) { m.impl("rows_times", &rows_times); }
