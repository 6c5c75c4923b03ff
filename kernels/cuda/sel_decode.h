// Host interface of the selection decode kernels (sel_decode.cu), shared with the binding.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace selgate {

enum class Dtype : int { kHalf = 0, kBFloat16 = 1, kFloat = 2 };

// Launch overrides of the tensor-core kernel (benchmarks sweep them); 0 = the automatic choice.
struct Tune {
  int stages = 0;  // depth of each warp's cp.async ring, 2..6
  int split = 0;   // blocks (one thread-block cluster, SM >= 9.0) sharing a row, 1..4 (verified; see run_mma)
  int warps = 0;   // warps per block, 1..8
  int pdl = 0;     // programmatic dependent launch (SM >= 9.0): 1 on (next grid triggered after the
                   // loop), 2 off, 3 on (triggered right after the wait); automatic: off with per-warp
                   // slabs; with shared slabs 3 where the next grid lands evenly, else 1 (see run_mma)
  int slab = 0;    // keys per warp step of the tensor-core kernel, 16 or 32
  int schedule = 0;  // 1: each warp streams its own slabs; 2: the block's 2 warps share each slab
  int prefetch = 0;  // L2 prefetch before the wait: 1 none, 2 ranges and q, 3 and 4 also keys [0, 64) (lines, bulk)
  int occupancy = 0;  // at most this many blocks per SM (shared memory padded); 0 no cap
};

// One decode call. q [B,1,G,h,Dk], ranges int32/int64 [B,1,G,n,2], positions int32/int64
// [B,1] or null, o [B,1,G,h,Dv] (dtype of v) and lse fp32 [B,1,G,h] are contiguous; k
// [B*G,S_kv,Dk] and v [B*G,S_kv,Dv] have unit inner stride and the row and key strides (in
// elements; bytes a multiple of 16) in k_row, k_key, v_row, v_key: a KV cache narrowed to
// S_kv keys, or K and V rows sharing one buffer, are read in place.
struct DecodeArgs {
  Dtype dtype;
  bool use_mma;  // tensor-core kernel (fp16/bf16 only); otherwise the SIMT kernel
  const void* q;
  const void* k;
  const void* v;
  const void* ranges;
  const void* positions;
  bool ranges_i64, positions_i64;
  void* o;
  float* lse;
  int64_t B, G, h, S_kv;
  int Dk, Dv, n;
  float scale;
  Tune tune;
  int64_t k_row = 0, k_key = 0, v_row = 0, v_key = 0;  // k, v strides (unused by sel_decode_plan)
  // clip: the ranges are taken as given (any order, overlapping, unclamped): each range's start is
  // raised to the furthest end of the ranges before it in (start, slot) order, which leaves them
  // disjoint and covering their union; a row scans its n ranges once per range (n^2 / 32 loads
  // a row), so callers clip few ranges and normalise many. counter: int64 [2] (or null) gets
  // the call's selected keys and kv_bytes times them added.
  bool clip = false;
  int64_t* counter = nullptr;
  int64_t kv_bytes = 0;
};

// What a call launches (reported by benchmarks).
struct DecodePlan {
  int kernel = 0;  // 0 simt, 1 mma
  int slab = 0, stages = 0, split = 0, warps = 0, threads = 0, smem_bytes = 0, blocks_per_sm = 0, schedule = 0;
  int pdl = 0;  // PDL mode launched: 0 off, 1 next grid triggered after the loop, 3 right after the wait
  int prefetch = 1;  // L2 prefetch before the wait (Tune::prefetch); 1 none
  int64_t blocks = 0;
};

// Launches on `stream`; false when it could not (an unsupported configuration or a CUDA error),
// with the reason in `err` (`cap` bytes). The caller raises it: nothing here throws, and no
// std::string crosses this boundary (see sel_decode.cu).
bool sel_decode_launch(const DecodeArgs& args, cudaStream_t stream, char* err, int cap);

// The launch `sel_decode_launch` would make for `args` (pointers unused), in `plan`, without
// launching; false, with the reason in `err`, when it would refuse.
bool sel_decode_plan(const DecodeArgs& args, DecodePlan& plan, char* err, int cap);

}  // namespace selgate
