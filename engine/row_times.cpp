// specwatch_cpu::row_times(x, weight): one bf16 row x [1, in] times a bf16 weight [out, in]^T, the
// products of the plain decode step (engine/kernels.py builds this once per machine, -O3 -march=native).
//
// A decode step streams every weight once for one row, so the product is a matrix-vector one and
// its speed is how fast the weight is read. Inductor's bf16 reduction (engine/decoder.py `_row_times`)
// widens x and each weight row to float32 again for every output and adds after a separate multiply;
// here four weight rows share one pass over x, each with its own sum in flight, and where the CPU has
// a bf16 dot product (AVX512-BF16) bf16 x meets the bf16 weight in it, 32 products an instruction
// into float32 sums. Sums are float32 throughout, as in the reduction; only their order differs.
// (float32 models keep the reduction: it streamed their weights faster than this kernel's float
// path did.)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int kRows = 4;  // weight rows a pass

inline float widen(uint16_t bf16) {
  uint32_t bits = uint32_t(bf16) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// in[from..in) of n weight rows, in plain C++ that the compiler vectorises: the tail of the AVX-512
// paths and, on other CPUs, the whole product
void dot_rest(const uint16_t* w, const float* x, int64_t from, int64_t in, int n, float* out) {
  for (int r = 0; r < n; ++r) {
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = from; i < in; ++i) sum += x[i] * widen(w[r * in + i]);
    out[r] += sum;
  }
}

#if defined(__AVX512F__)
template <int N>
void dot(const uint16_t* w, const float* x, const uint16_t* x_bf16, int64_t in, float* out) {
  __m512 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
  const int64_t main = in / 32 * 32;
  for (int64_t i = 0; i < main; i += 32) {
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x_bf16 + i);
    for (int r = 0; r < N; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(w + r * in + i), xv);
  }
#else
  const int64_t main = in / 16 * 16;
  for (int64_t i = 0; i < main; i += 16) {
    const __m512 xv = _mm512_loadu_ps(x + i);
    for (int r = 0; r < N; ++r) {
      const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * in + i));
      const __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
      acc[r] = _mm512_fmadd_ps(xv, wv, acc[r]);
    }
  }
#endif
  for (int r = 0; r < N; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
  dot_rest(w, x, main, in, N, out);
}
#else
template <int N>
void dot(const uint16_t* w, const float* x, const uint16_t*, int64_t in, float* out) {
  for (int r = 0; r < N; ++r) out[r] = 0.f;
  dot_rest(w, x, 0, in, N, out);
}
#endif

void row_times_into(const uint16_t* w, const float* x, const uint16_t* x_bf16, int64_t in, int64_t out_features,
                    c10::BFloat16* out) {
  const int64_t blocks = (out_features + kRows - 1) / kRows;
  at::parallel_for(0, blocks, 16, [&](int64_t first, int64_t last) {
    float sums[kRows];
    for (int64_t block = first; block < last; ++block) {
      const int64_t row = block * kRows;
      const int n = static_cast<int>(std::min<int64_t>(kRows, out_features - row));
      if (n == kRows) {
        dot<kRows>(w + row * in, x, x_bf16, in, sums);
      } else {
        for (int r = 0; r < n; ++r) dot<1>(w + (row + r) * in, x, x_bf16, in, sums + r);
      }
      for (int r = 0; r < n; ++r) out[row + r] = c10::BFloat16(sums[r]);  // rounded to nearest even
    }
  });
}

at::Tensor row_times(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.scalar_type() == at::kBFloat16,
              "row_times: weight must be a contiguous bfloat16 [out, in] matrix");
  const int64_t in = weight.size(1);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(0) == 1 && x.size(1) == in,
              "row_times: x must be bfloat16 [1, in]");
  const at::Tensor row = x.contiguous();
  const auto* x_bf16 = reinterpret_cast<const uint16_t*>(row.const_data_ptr());
  std::vector<float> x_float(in);
  for (int64_t i = 0; i < in; ++i) x_float[i] = widen(x_bf16[i]);
  at::Tensor out = at::empty({1, weight.size(0)}, row.options());
  row_times_into(reinterpret_cast<const uint16_t*>(weight.const_data_ptr()), x_float.data(), x_bf16, in,
                 weight.size(0), out.mutable_data_ptr<c10::BFloat16>());
  return out;
}

}  // namespace

TORCH_LIBRARY(specwatch_cpu, m) { m.def("row_times(Tensor x, Tensor weight) -> Tensor"); }
TORCH_LIBRARY_IMPL(specwatch_cpu, CPU, m) { m.impl("row_times", &row_times); }
