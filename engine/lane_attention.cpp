// specwatch_cpu::lane_attention(q, keys, values, bounds): the attention of a batched decode round over the
// slots' float32 KV cache pool, each sequence against its own lane's prefix (engine/kernels.py builds it, a
// library of its own, for AVX512F: no bf16 here; engine/decoder.py `_lane_attention` is the torch path it
// replaces).
//
// A round's sequences hold prefixes of different lengths and 1-9 new rows each. torch's fused kernel takes
// one length and one row count a call, so the torch path pads lanes to a common length under a mask or calls
// once per run of similar lanes: on the 2-core AVX512-BF16 EPYC 8 slots spent 16 ms a round in attention
// (~4 calls a layer). Here each (sequence, key head) is one task over exactly its own keys: the scores of
// all its rows and query heads, an exact two-pass softmax and the weighted sum of values, in float32 FMAs,
// the prefix read once per task while it sits in cache.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>
#include <immintrin.h>

#include "vector_math.h"
#if !defined(__AVX512F__)
#error "lane_attention needs AVX512F (engine/kernels.py builds it with -mavx512f, only where the CPU has it)"
#endif

namespace {

using specwatch_cpu::exp16;

struct Task {
  int64_t lane, start, rows, first_row, kv_head;
};

// softmax of scores[0..length) in place, scaled; returns nothing: scores become probabilities
void softmax(float* scores, int64_t length, float scale) {
  __m512 top = _mm512_set1_ps(-3.4e38f);
  int64_t j = 0;
  for (; j + 16 <= length; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(scores + j));
  float best = _mm512_reduce_max_ps(top);
  for (; j < length; ++j) best = std::max(best, scores[j]);
  const __m512 shift = _mm512_set1_ps(best * scale), scales = _mm512_set1_ps(scale);
  __m512 sums = _mm512_setzero_ps();
  for (j = 0; j < length; j += 16) {
    const __mmask16 live = length - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (length - j)) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(live, scores + j);
    const __m512 p = _mm512_maskz_mov_ps(live, exp16(_mm512_fmsub_ps(s, scales, shift)));
    sums = _mm512_add_ps(sums, p);
    _mm512_mask_storeu_ps(scores + j, live, p);
  }
  const float inverse = 1.f / _mm512_reduce_add_ps(sums);
  for (j = 0; j < length; ++j) scores[j] *= inverse;
}

// one sequence's rows, the query heads of one key head, over that head's keys in the sequence's lane
template <int DIM>
void attend(const Task& task, const float* q, const float* keys, const float* values, float* out, int64_t heads,
            int64_t group, int64_t max_len, float scale) {
  constexpr int VECS = DIM / 16;
  const float* k = keys + ((task.lane * (heads / group) + task.kv_head) * max_len) * DIM;
  const float* v = values + ((task.lane * (heads / group) + task.kv_head) * max_len) * DIM;
  const int64_t longest = task.start + task.rows;
  std::vector<float> scores(size_t(group * longest));
  for (int64_t r = 0; r < task.rows; ++r) {
    const int64_t length = task.start + r + 1;  // row r sits at position start + r and sees keys 0 .. start + r
    const float* row_q = q + ((task.first_row + r) * heads + task.kv_head * group) * DIM;
    for (int64_t j = 0; j < length; ++j) {  // each key once for all the group's heads
      __m512 key[VECS];
      for (int c = 0; c < VECS; ++c) key[c] = _mm512_loadu_ps(k + j * DIM + 16 * c);
      for (int64_t h = 0; h < group; ++h) {
        __m512 acc = _mm512_mul_ps(key[0], _mm512_loadu_ps(row_q + h * DIM));
        for (int c = 1; c < VECS; ++c) acc = _mm512_fmadd_ps(key[c], _mm512_loadu_ps(row_q + h * DIM + 16 * c), acc);
        scores[h * longest + j] = _mm512_reduce_add_ps(acc);
      }
    }
    for (int64_t h = 0; h < group; ++h) softmax(scores.data() + h * longest, length, scale);
    float* row_out = out + ((task.first_row + r) * heads + task.kv_head * group) * DIM;
    for (int64_t h0 = 0; h0 < group; h0 += 4) {  // at most 4 heads' sums in registers at a time
      const int64_t hs = std::min<int64_t>(4, group - h0);
      __m512 acc[4][VECS];
      for (int64_t h = 0; h < hs; ++h)
        for (int c = 0; c < VECS; ++c) acc[h][c] = _mm512_setzero_ps();
      for (int64_t j = 0; j < length; ++j) {
        __m512 value[VECS];
        for (int c = 0; c < VECS; ++c) value[c] = _mm512_loadu_ps(v + j * DIM + 16 * c);
        for (int64_t h = 0; h < hs; ++h) {
          const __m512 p = _mm512_set1_ps(scores[(h0 + h) * longest + j]);
          for (int c = 0; c < VECS; ++c) acc[h][c] = _mm512_fmadd_ps(p, value[c], acc[h][c]);
        }
      }
      for (int64_t h = 0; h < hs; ++h)
        for (int c = 0; c < VECS; ++c) _mm512_storeu_ps(row_out + (h0 + h) * DIM + 16 * c, acc[h][c]);
    }
  }
}

at::Tensor lane_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                          const at::Tensor& bounds) {
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 4 && values.sizes() == keys.sizes(),
              "lane_attention: q [rows, heads, dim], keys and values [lane, kv head, position, dim]");
  for (const at::Tensor* t : {&q, &keys, &values})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(), "lane_attention: contiguous float32");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t lanes = keys.size(0), kv_heads = keys.size(1), max_len = keys.size(2);
  TORCH_CHECK(keys.size(3) == dim && kv_heads > 0 && heads % kv_heads == 0,
              "lane_attention: same head dim, query heads a multiple of key heads");
  TORCH_CHECK(dim == 64 || dim == 128, "lane_attention: head dim 64 or 128");
  TORCH_CHECK(bounds.dim() == 2 && bounds.size(1) == 3 && bounds.scalar_type() == at::kLong,
              "lane_attention: bounds int64 [sequences, 3]: lane, start, rows");
  const at::Tensor spans = bounds.contiguous();
  const int64_t* span = spans.const_data_ptr<int64_t>();
  std::vector<Task> tasks;
  int64_t row = 0;
  for (int64_t s = 0; s < spans.size(0); ++s) {
    const int64_t lane = span[3 * s], start = span[3 * s + 1], n = span[3 * s + 2];
    TORCH_CHECK(0 <= lane && lane < lanes && start >= 0 && n >= 1 && start + n <= max_len,
                "lane_attention: a sequence outside the pool (lane ", lane, ", positions ", start, "+", n, ")");
    for (int64_t h = 0; h < kv_heads; ++h) tasks.push_back({lane, start, n, row, h});
    row += n;
  }
  TORCH_CHECK(row == rows, "lane_attention: bounds cover ", row, " rows, q holds ", rows);
  // dealt from both ends of the order by cost, so that the threads' contiguous shares cost about the same
  std::sort(tasks.begin(), tasks.end(),
            [](const Task& a, const Task& b) { return a.rows * (a.start + a.rows) > b.rows * (b.start + b.rows); });
  std::vector<Task> dealt;
  for (size_t i = 0, j = tasks.size(); i < j;) {
    dealt.push_back(tasks[i++]);
    if (i < j) dealt.push_back(tasks[--j]);
  }
  at::Tensor out = at::empty_like(q);
  const float scale = 1.f / std::sqrt(float(dim));
  const float *qs = q.const_data_ptr<float>(), *ks = keys.const_data_ptr<float>(), *vs = values.const_data_ptr<float>();
  float* outs = out.mutable_data_ptr<float>();
  at::parallel_for(0, int64_t(dealt.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      if (dim == 64)
        attend<64>(dealt[i], qs, ks, vs, outs, heads, heads / kv_heads, max_len, scale);
      else
        attend<128>(dealt[i], qs, ks, vs, outs, heads, heads / kv_heads, max_len, scale);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specwatch_cpu, m) {
  m.def("lane_attention(Tensor q, Tensor keys, Tensor values, Tensor bounds) -> Tensor");
}
TORCH_LIBRARY_IMPL(specwatch_cpu, CPU, m) { m.impl("lane_attention", &lane_attention); }
