// specwatch_cpu::prefill_attention(q, k, v, scale): causal attention of a whole prompt (positions 0..n-1),
// bf16 in and out, the prompt forward's attention (engine/kernels.py builds it, a library of its own, for
// AVX512-BF16).
//
// torch's CPU flash kernel ran a 1,207-token prompt at 13 ms a layer on the 2-core AVX512-BF16 EPYC, in
// float32 or bf16 alike (without AMX it widens bf16 to float32): half of the prompt's forward. Here scores
// and the weighted sum of values are bf16 dot products into float32 sums (AVX512-BF16, 32 products an
// instruction), the softmax is float32 and online (flash attention: per block of 64 keys, the running
// maximum rescales what was summed so far), and nothing of size n x n is ever written.
//
// Layout: keys are repacked so that one 64-byte load holds one pair of head dimensions for 16 keys, values
// so that one load holds 16 dimensions for a pair of keys: the pair the bf16 dot product multiplies. A tile
// of R query rows (the query heads that share a key head, position by position) reuses every load R times.
// Probabilities are rounded to bf16 for the second product, as bf16 flash kernels do.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#include <immintrin.h>

#include "vector_math.h"
#if !defined(__AVX512BF16__)
#error "prefill_attention needs AVX512-BF16 (engine/kernels.py builds it with -mavx512bf16, only where the CPU has it)"
#endif

namespace {

using specwatch_cpu::exp16;

constexpr int64_t KEYS = 64;  // keys a block: four vectors of 16 scores a row
constexpr int64_t TILES_A_TASK = 8;

inline __m512 dot(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }

struct Packed {
  std::vector<uint32_t> keys;    // [kv head][dim pair][key]: (k[key][2p], k[key][2p + 1])
  std::vector<uint32_t> values;  // [kv head][key pair][dim]: (v[2j][d], v[2j + 1][d])
  int64_t padded;                // keys a head, rounded up to a block (padding: zeros, always masked)
};

Packed pack(const uint16_t* k, const uint16_t* v, int64_t kv_heads, int64_t n, int64_t dim) {
  Packed packed{{}, {}, (n + KEYS - 1) / KEYS * KEYS};
  const int64_t pairs = dim / 2, padded = packed.padded;
  packed.keys.assign(kv_heads * pairs * padded, 0);
  packed.values.assign(kv_heads * padded / 2 * dim, 0);
  at::parallel_for(0, kv_heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t h = first; h < last; ++h) {
      const uint16_t *kh = k + h * n * dim, *vh = v + h * n * dim;
      uint32_t* keys = packed.keys.data() + h * pairs * padded;
      uint32_t* values = packed.values.data() + h * padded / 2 * dim;
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t* row = reinterpret_cast<const uint32_t*>(kh + j * dim);
        for (int64_t p = 0; p < pairs; ++p) keys[p * padded + j] = row[p];
        const int shift = (j & 1) * 16;  // the pair's second key goes to the high half
        for (int64_t d = 0; d < dim; ++d) values[(j / 2) * dim + d] |= uint32_t(vh[j * dim + d]) << shift;
      }
    }
  });
  return packed;
}

// One tile: R query rows (same key head) attend over the keys up to their own positions.
template <int DIM, int R>
void tile(const uint32_t* const* query, const int64_t* position, const uint32_t* keys, const uint32_t* values,
          int64_t padded, float scale, c10::BFloat16* const* out) {
  constexpr int PAIRS = DIM / 2, VECS = DIM / 16;
  __m512 acc[R][VECS], total[R];
  float best[R];
  alignas(64) uint32_t probs[R][KEYS / 2];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < VECS; ++c) acc[r][c] = _mm512_setzero_ps();
    total[r] = _mm512_setzero_ps();
    best[r] = -std::numeric_limits<float>::infinity();
  }
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 scales = _mm512_set1_ps(scale), minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t start = 0; start <= position[R - 1]; start += KEYS) {
    __m512 score[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) score[r][c] = _mm512_setzero_ps();
    for (int p = 0; p < PAIRS; ++p) {  // scores: one pair of dimensions for 64 keys at a time
      const uint32_t* row = keys + p * padded + start;
      const __m512i k0 = _mm512_loadu_si512(row), k1 = _mm512_loadu_si512(row + 16);
      const __m512i k2 = _mm512_loadu_si512(row + 32), k3 = _mm512_loadu_si512(row + 48);
      for (int r = 0; r < R; ++r) {
        const __m512i q = _mm512_set1_epi32(int(query[r][p]));
        score[r][0] = dot(score[r][0], k0, q);
        score[r][1] = dot(score[r][1], k1, q);
        score[r][2] = dot(score[r][2], k2, q);
        score[r][3] = dot(score[r][3], k3, q);
      }
    }
    for (int r = 0; r < R; ++r) {  // online softmax: keys past the row's position masked out
      __mmask16 visible[4];
      __m512 top = minus_inf;
      for (int c = 0; c < 4; ++c) {
        const __m512i key = _mm512_add_epi32(lanes, _mm512_set1_epi32(int(start + 16 * c)));
        visible[c] = _mm512_cmple_epi32_mask(key, _mm512_set1_epi32(int(position[r])));
        score[r][c] = _mm512_mask_mul_ps(minus_inf, visible[c], score[r][c], scales);
        top = _mm512_max_ps(top, score[r][c]);
      }
      const float new_best = std::max(best[r], _mm512_reduce_max_ps(top));  // finite: key 0 is in block 0
      if (new_best > best[r]) {
        const __m512 shrink = _mm512_set1_ps(std::exp(best[r] - new_best));
        for (int c = 0; c < VECS; ++c) acc[r][c] = _mm512_mul_ps(acc[r][c], shrink);
        total[r] = _mm512_mul_ps(total[r], shrink);
        best[r] = new_best;
      }
      const __m512 shift = _mm512_set1_ps(new_best);
      __m512 prob[4];
      for (int c = 0; c < 4; ++c) {
        prob[c] = _mm512_maskz_mov_ps(visible[c], exp16(_mm512_sub_ps(score[r][c], shift)));
        total[r] = _mm512_add_ps(total[r], prob[c]);
      }
      _mm512_store_si512(probs[r], (__m512i)_mm512_cvtne2ps_pbh(prob[1], prob[0]));
      _mm512_store_si512(probs[r] + 16, (__m512i)_mm512_cvtne2ps_pbh(prob[3], prob[2]));
    }
    const uint32_t* block = values + start / 2 * DIM;
    for (int t = 0; t < KEYS / 2; ++t) {  // the weighted sum: one pair of keys for all dimensions at a time
      __m512i v[VECS];
      for (int c = 0; c < VECS; ++c) v[c] = _mm512_loadu_si512(block + t * DIM + 16 * c);
      for (int r = 0; r < R; ++r) {
        const __m512i p = _mm512_set1_epi32(int(probs[r][t]));
        for (int c = 0; c < VECS; ++c) acc[r][c] = dot(acc[r][c], v[c], p);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 inverse = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(total[r]));
    for (int c = 0; c < VECS; ++c)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[r] + 16 * c),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][c], inverse)));
  }
}

template <int DIM, int R>
void attend(const at::Tensor& q, const Packed& packed, int64_t kv_heads, float scale, at::Tensor& out) {
  const int64_t heads = q.size(0), n = q.size(1), group = heads / kv_heads, rows = group * n;
  const int64_t tiles = (rows + R - 1) / R, tasks_a_head = (tiles + TILES_A_TASK - 1) / TILES_A_TASK;
  const int64_t tasks = kv_heads * tasks_a_head;
  const auto* q_data = reinterpret_cast<const uint16_t*>(q.const_data_ptr());
  auto* out_data = out.mutable_data_ptr<c10::BFloat16>();
  // tasks in order of position (later ones cost more: more keys), dealt alternately from both ends so
  // that the threads' contiguous shares of the range cost about the same
  at::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t ordered = i % 2 ? tasks - 1 - i / 2 : i / 2;
      const int64_t h = ordered % kv_heads, chunk = ordered / kv_heads;
      const uint32_t* keys = packed.keys.data() + h * (DIM / 2) * packed.padded;
      const uint32_t* values = packed.values.data() + h * packed.padded / 2 * DIM;
      for (int64_t t = chunk * TILES_A_TASK; t < std::min(tiles, (chunk + 1) * TILES_A_TASK); ++t) {
        const uint32_t* query[R];
        int64_t position[R];
        c10::BFloat16* target[R];
        alignas(64) c10::BFloat16 spill[R][DIM];  // a short last tile's missing rows: its last row again, dropped
        for (int r = 0; r < R; ++r) {
          const int64_t row = std::min(t * R + r, rows - 1);  // rows: position-major, then the group's heads
          const int64_t head = h * group + row % group;
          position[r] = row / group;
          query[r] = reinterpret_cast<const uint32_t*>(q_data + (head * n + position[r]) * DIM);
          target[r] = t * R + r < rows ? out_data + (head * n + position[r]) * DIM : spill[r];
        }
        tile<DIM, R>(query, position, keys, values, packed.padded, scale, target);
      }
    }
  });
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes(),
              "prefill_attention: q [heads, n, dim], k and v [kv heads, n, dim]");
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous(), "prefill_attention: contiguous bfloat16");
  const int64_t heads = q.size(0), n = q.size(1), dim = q.size(2), kv_heads = k.size(0);
  TORCH_CHECK(k.size(1) == n && k.size(2) == dim && kv_heads > 0 && heads % kv_heads == 0 && n > 0,
              "prefill_attention: as many keys as queries, query heads a multiple of key heads");
  TORCH_CHECK(dim == 64 || dim == 128, "prefill_attention: head dim 64 or 128");
  const Packed packed = pack(reinterpret_cast<const uint16_t*>(k.const_data_ptr()),
                             reinterpret_cast<const uint16_t*>(v.const_data_ptr()), kv_heads, n, dim);
  at::Tensor out = at::empty_like(q);
  if (dim == 64)
    attend<64, 4>(q, packed, kv_heads, float(scale), out);
  else
    attend<128, 2>(q, packed, kv_heads, float(scale), out);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specwatch_cpu, m) { m.def("prefill_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor"); }
TORCH_LIBRARY_IMPL(specwatch_cpu, CPU, m) { m.impl("prefill_attention", &prefill_attention); }
