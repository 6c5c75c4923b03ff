// NSA selection attention, decode (S = 1): thread blocks per (b, g) row and group of heads.
//
// Both kernels stream the row's selected keys: the row's ranges are clamped to
// [0, min(t+1, S_kv)) and prefix-summed in shared memory once (`begin_row`), every key is
// found by a per-thread cursor that walks those sums forward, and K and V rows travel with
// 16-byte cp.async copies into shared-memory rings (keys past the row's length are
// zero-filled, never read). Scores live in the log2 domain (scale * log2(e) folded in once)
// so the online softmax uses exp2f; accumulation is fp32 throughout and o and lse are
// written once.
//
// - sel_decode_mma (fp16/bf16), tensor cores (mma.sync m16n8k16, heads on the M side), a row's
//   keys cut into 32-key slabs (16 where 32 would not fit), in one of two schedules:
//   - shared slabs (SHARED; automatic from one row per SM when Dk <= Dv, and whenever
//     S_kv <= 256, see run_mma): the block's 2 warps copy each slab into one cp.async ring
//     together (one block barrier per slab), both run the same online softmax over all of its
//     keys, and each accumulates p*V for its half of Dv, so a row is one stream of slabs and
//     its output needs no merge (4-5 ring stages hold the bytes a row needs in flight when
//     there are few rows per SM);
//   - per-warp slabs (automatic otherwise): the slabs are dealt round-robin to the warps of
//     the block (and, with split > 1, of the thread-block cluster that shares the row); a warp
//     streams its slabs through a private ring with no block barrier, keeps its own running
//     max/sum and p*V accumulators, and the partial softmaxes are merged once at the end in a
//     fixed order (across the cluster through distributed shared memory, SM 9.0).
//   Both are deterministic, without atomics. Rows whose length is a multiple of 64 bytes'
//   worth of 16-byte chunks are XOR-swizzled instead of padded, so a stage holds no padding.
// - sel_decode_simt (any dtype, the fp32 path): 8 warps, one block-wide ring of 32/64-key
//   tiles, dot products and p*V on CUDA cores, one block-wide online softmax per tile.
#include "sel_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <map>
#include <mutex>
#include <type_traits>
#include <tuple>
#include <utility>

// Host-side checks fail by returning false with the reason in a thread-local buffer, which
// the entry points copy into the caller's: no exception and no std::string leave this
// nvcc-compiled file, and messages are formatted without iostreams. On the H100 every
// failure reported the old way (TORCH_CHECK, c10::str) segfaulted the process, while a check
// thrown by the g++-compiled binding was raised to Python normally.
#define SEL_CHECK(cond, ...) \
  do {                        \
    if (!(cond)) return ::selgate::fail(__VA_ARGS__); \
  } while (0)
#define SEL_CUDA(call)                                                                     \
  do {                                                                                     \
    const cudaError_t sel_err_ = (call);                                                   \
    if (sel_err_ != cudaSuccess) return ::selgate::fail("sel_decode: ", #call, ": ", cudaGetErrorString(sel_err_)); \
  } while (0)
#define SEL_TRY(expr)   \
  do {                  \
    if (!(expr)) return false; \
  } while (0)

namespace selgate {
thread_local char t_err[512];
thread_local int t_len = 0;

inline void put(const char* x) {
  if (t_len < int(sizeof(t_err)) - 1) t_len += std::snprintf(t_err + t_len, sizeof(t_err) - t_len, "%s", x);
}
inline void put(long long x) {
  if (t_len < int(sizeof(t_err)) - 1) t_len += std::snprintf(t_err + t_len, sizeof(t_err) - t_len, "%lld", x);
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
inline void put(T x) { put(static_cast<long long>(x)); }

template <typename... A>
bool fail(const A&... parts) {
  t_len = 0;
  t_err[0] = 0;
  (put(parts), ...);
  t_len = std::min(t_len, int(sizeof(t_err)) - 1);
  return false;
}
}  // namespace selgate

namespace selgate {
namespace {

constexpr int kMaxVerifiedSplit = 4, kMaxVerifiedSplitWarps = 4;
constexpr int kMinStages = 3, kMaxStages = 6;
constexpr int kRingBudget = 104 * 1024;  // simt: bytes of K/V ring per block (2 blocks per SM)
constexpr int kMmaMaxWarps = 8;
constexpr int kMmaHeads = 16;
constexpr int kShortRowsKeys = 256;  // S_kv up to which the automatic launch always takes shared slabs
constexpr int kTailLandingKeys = 256;  // S_kv from which the automatic launch may land in the tail (run_mma)
constexpr int kMaxSplit = 8;  // portable cluster size
constexpr int kSimtThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Params {
  const void* q;
  const void* k;
  const void* v;
  const void* ranges;     // int32 or int64, see ranges_i64
  const void* positions;  // int32 or int64, see positions_i64; null: t = S_kv - 1
  bool ranges_i64, positions_i64;
  void* o;
  float* lse;
  int64_t G, h, S_kv;
  int64_t k_row, v_row;  // K, V strides (elements) of a (b, g) row
  int k_key, v_key;      // and of a key
  int Dk, Dv, n;
  int hpb;          // heads per block
  int head_groups;  // head groups per (b, g) row
  int split;        // mma: blocks (one cluster) per (row, head group)
  bool early_trigger;  // mma with PDL: let the next grid launch right after griddepcontrol.wait
  int prefetch;     // mma: L2 prefetch before the wait: 1 none, 2 ranges and q, 3 and 4 also keys
                    // [0, 64) (see prefetch_row)
  int tile;         // simt: keys per tile
  int stages;       // depth of the cp.async ring (mma: per warp)
  int k_stride, v_stride, q_stride, stage_elems;  // shared-memory row strides and stage size, in elements
  int k_xor, v_xor;  // mma: 7 = 16-byte chunks XOR-swizzled by row, 0 = padded rows
  int off_L, off_q, off_sc, off_stats, off_kv;  // byte offsets in dynamic shared memory
  float scale_log2;
  bool clip;                      // make the caller's ranges disjoint (DecodeArgs::clip)
  unsigned long long* counter;    // null, or [selected keys, K/V bytes] to add the row's to
  int64_t kv_bytes;
};

// ---------------------------------------------------------------- small device helpers
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Eight 16-bit or four 32-bit values, one 16-byte load (shared or global), widened to fp32.
template <typename T>
__device__ __forceinline__ void load_vec(float* out, const T* src) {
  constexpr int VEC = 16 / sizeof(T);
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = to_float(x[e]);
}

template <typename T>
__device__ __forceinline__ void store_vec(T* dst, const float* acc, float mul) {
  constexpr int VEC = 16 / sizeof(T);
  uint4 raw;
  T* x = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int e = 0; e < VEC; ++e) x[e] = from_float<T>(acc[e] * mul);
  *reinterpret_cast<uint4*>(dst) = raw;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; `valid == false` writes 16 zero bytes and reads nothing.
// `.ca` (through L1) rather than `.cg`: with `.cg` the kernel read each K/V sector twice
// from L2 (Nsight Compute: 4.2M sectors for 67 MB, L2 hit rate 50%; the Triton kernel's
// `.cg` copies did not, and why is not established), and on the H100 `.ca` was 0.7-5%
// faster at N=256 with bitwise-equal output (probes/decode_load_variants.py). With
// `.ca` the count matches the Triton kernel's (2.10M sectors at N=256 D=64 n=16).
// K, V and q are read-only while the kernel runs, so L1's lack of coherence does not matter.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// Wait until at most `pending` groups are in flight (the ring depth is a run-time value).
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    default: cp_async_wait<kMaxStages - 2>(); break;
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---------------------------------------------------------------- ranges and tile loads
__device__ __forceinline__ int64_t load_index(const void* base, int64_t i, bool is64) {
  return is64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
}

// Bound `side` (0 start, 1 end) of range j of `row`, clamped to [0, lim].
__device__ __forceinline__ int64_t range_bound(const Params& p, int64_t row, int j, int side, int64_t lim) {
  return min(max(load_index(p.ranges, (row * p.n + j) * 2 + side, p.ranges_i64), int64_t(0)), lim);
}

// Clamp the row's ranges to [0, lim), lim = min(t + 1, S_kv), and store per range the
// inclusive prefix sum of lengths (`cum`) and `off` = start - first position of the range,
// so position `pos` of the row's concatenated keys is key `off[j] + pos` for the first j
// with cum[j] > pos. Also stores the row's length L. Warp 0 scans 32 ranges per step with
// shuffles; the caller ends it with a block barrier. With p.clip each range's start is first
// raised to the furthest end of the ranges before it in (start, slot) order, so overlapping,
// unsorted ranges count each key once. `count`: this block adds the row's L to p.counter
// (one block per row does).
__device__ void setup_ranges(const Params& p, int64_t row, int64_t b, unsigned char* smem, bool count) {
  if (threadIdx.x < 32) {
    int64_t* cum = reinterpret_cast<int64_t*>(smem);
    int64_t* off = cum + p.n;
    const int lane = threadIdx.x;
    const int64_t t = p.positions ? load_index(p.positions, b, p.positions_i64) : p.S_kv - 1;
    const int64_t lim = max(min(t + 1, p.S_kv), int64_t(0));
    int64_t carry = 0;
    for (int base = 0; base < p.n; base += 32) {
      const int j = base + lane;
      int64_t s = 0, len = 0;
      if (j < p.n) {
        s = range_bound(p, row, j, 0, lim);
        const int64_t e = range_bound(p, row, j, 1, lim);
        if (p.clip) {
          int64_t reach = s;
          for (int i = 0; i < p.n; ++i) {
            const int64_t si = range_bound(p, row, i, 0, lim);
            if (si < s || (si == s && i < j)) reach = max(reach, range_bound(p, row, i, 1, lim));
          }
          s = reach;
        }
        len = max(e - s, int64_t(0));
      }
      int64_t x = len;  // inclusive scan of the lengths across the warp
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
      }
      if (j < p.n) {
        cum[j] = carry + x;
        off[j] = s - (carry + x - len);
      }
      carry += __shfl_sync(0xffffffffu, x, 31);
    }
    // L <= lim for normalised ranges; the clamp keeps positions in int32 whatever the input.
    if (lane == 0) {
      const int64_t L = min(carry, lim);
      *reinterpret_cast<int64_t*>(smem + p.off_L) = L;
      if (count && p.counter) {
        atomicAdd(p.counter, static_cast<unsigned long long>(L));
        atomicAdd(p.counter + 1, static_cast<unsigned long long>(L * p.kv_bytes));
      }
    }
  }
}

// What both kernels know about their row once its ranges are in shared memory.
template <typename T>
struct RowView {
  int64_t L;    // selected keys
  const T* kg;  // the row's K [S_kv, Dk] and V [S_kv, Dv], keys p.k_key and p.v_key elements apart
  const T* vg;
};

// Shared prologue of both kernels: the row's ranges into shared memory (warp 0), every
// thread's earlier cp.async copies (q) landed, then one block barrier.
template <typename T>
__device__ __forceinline__ RowView<T> begin_row(const Params& p, int64_t row, unsigned char* smem, bool count) {
  setup_ranges(p, row, row / p.G, smem, count);
  cp_async_wait<0>();
  __syncthreads();
  return {*reinterpret_cast<const int64_t*>(smem + p.off_L), static_cast<const T*>(p.k) + row * p.k_row,
          static_cast<const T*>(p.v) + row * p.v_row};
}

// Maps a thread's selected positions to key indices. Each thread visits its positions in
// increasing order (tile by tile, row by row), so the range index only ever moves forward.
struct KeyCursor {
  int j = -1;
  int64_t end = -1, off = 0;
  __device__ __forceinline__ int64_t key(int64_t pos, const unsigned char* smem, int n) {
    const int64_t* cum = reinterpret_cast<const int64_t*>(smem);
    while (pos >= end) {
      ++j;
      end = cum[j];
      off = cum[n + j];
    }
    return off + pos;
  }
};

// Issue the cp.async copies of keys [pos0, pos0 + tile) of the row: 8 threads per key row,
// each moving 16-byte chunks of K then V. Positions >= L are zero-filled.
template <typename T>
__device__ __forceinline__ void load_tile(const Params& p, const T* kg, const T* vg, int64_t pos0, int64_t L,
                                          T* ks, T* vs, const unsigned char* smem, KeyCursor& cursor) {
  constexpr int VEC = 16 / sizeof(T);
  const int ckk = p.Dk / VEC, ckv = p.Dv / VEC;
  for (int jj = threadIdx.x >> 3; jj < p.tile; jj += blockDim.x >> 3) {
    const int64_t pos = pos0 + jj;
    const bool valid = pos < L;
    const int64_t key = valid ? cursor.key(pos, smem, p.n) : 0;
    const T* krow = kg + key * p.k_key;
    const T* vrow = vg + key * p.v_key;
    for (int c = threadIdx.x & 7; c < ckk; c += 8) cp_async16(ks + jj * p.k_stride + c * VEC, krow + c * VEC, valid);
    for (int c = threadIdx.x & 7; c < ckv; c += 8) cp_async16(vs + jj * p.v_stride + c * VEC, vrow + c * VEC, valid);
  }
}

// ---------------------------------------------------------------- SM 9.0: PDL and clusters
// Programmatic dependent launch: with the launch attribute set, this grid may start while
// the previous kernel on the stream finishes; nothing global is read or written before
// `wait_prior_grids` returns (it returns at once when the attribute is not set).
__device__ __forceinline__ void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// L2 prefetch of every 128-byte line of [ptr, ptr + bytes), lines i, i + step, ...: a hint
// (no register is written, no memory-model effect), so it may run before griddepcontrol.wait;
// L2 is coherent, so a line the previous grid writes afterwards is seen by later loads.
__device__ __forceinline__ void prefetch_l2(const void* ptr, int64_t bytes, int i, int step, bool keep) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(ptr) + bytes;
  for (uintptr_t x = (reinterpret_cast<uintptr_t>(ptr) & ~uintptr_t(127)) + uintptr_t(i) * 128; x < end;
       x += uintptr_t(step) * 128) {
    if (keep) {
      asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(x));
    } else {
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(x));
    }
  }
}

// Bulk L2 prefetch of [ptr, ptr + bytes) (16-byte aligned, a multiple of 16 bytes); a hint,
// like prefetch_l2.
__device__ __forceinline__ void prefetch_bulk(const void* ptr, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(ptr), "r"(bytes) : "memory");
#endif
}

// What a block will read first, asked of L2 before the wait: the row's ranges, its q heads and
// (prefetch >= 3, no positions so t = S_kv - 1) its first kSpecKeys keys, which NSA always
// selects (block 0); for other ranges those bytes are read for nothing. 3: one line prefetch per
// 128 bytes; 4: bulk prefetches (one per contiguous K or V run).
constexpr int kSpecKeys = 64;
template <typename T>
__device__ __forceinline__ void prefetch_row(const Params& p, int64_t row, int head0, int HG) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t rsz = p.ranges_i64 ? 8 : 4;
  prefetch_l2(static_cast<const char*>(p.ranges) + row * p.n * 2 * rsz, p.n * 2 * rsz, tid, nt, true);
  prefetch_l2(static_cast<const T*>(p.q) + (row * p.h + head0) * p.Dk, int64_t(HG) * p.Dk * sizeof(T), tid, nt, true);
  if (p.prefetch < 3 || p.positions) return;
  const T* kg = static_cast<const T*>(p.k) + row * p.k_row;
  const T* vg = static_cast<const T*>(p.v) + row * p.v_row;
  const int nk = static_cast<int>(min(int64_t(kSpecKeys), p.S_kv));
  if (p.prefetch == 3) {
    for (int j = tid; j < nk; j += nt) {
      prefetch_l2(kg + int64_t(j) * p.k_key, int64_t(p.Dk) * sizeof(T), 0, 1, false);
      prefetch_l2(vg + int64_t(j) * p.v_key, int64_t(p.Dv) * sizeof(T), 0, 1, false);
    }
    return;
  }
  const int kb = p.Dk * int(sizeof(T)), vb = p.Dv * int(sizeof(T));
  if (tid == 0) {
    if (p.k_key == p.Dk) prefetch_bulk(kg, nk * kb);
    if (p.v_key == p.Dv) prefetch_bulk(vg, nk * vb);
  }
  for (int j = tid; j < nk; j += nt) {
    if (p.k_key != p.Dk) prefetch_bulk(kg + int64_t(j) * p.k_key, kb);
    if (p.v_key != p.Dv) prefetch_bulk(vg + int64_t(j) * p.v_key, vb);
  }
}

// Barrier over the thread-block cluster, ordering shared-memory writes before remote reads.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();  // the host launches clusters on SM >= 9.0 only
#endif
}
// Generic address of `local`'s counterpart in the shared memory of cluster block `rank`
// (ordinary loads through it batch well; cluster_sync orders them).
__device__ __forceinline__ const float* cluster_ptr(const float* local, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(local)), "r"(rank));
  return reinterpret_cast<const float*>(out);
#else
  __trap();
  return local;
#endif
}

// ---------------------------------------------------------------- tensor-core kernel
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 x = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&x);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&x);
}

template <typename T> __device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<__half>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Head row r's merge weights over the NW warps' partial softmaxes: e[w] = exp2(m_w - M) with
// M the largest m_w (-inf for an empty row, whose weights are 0); returns sum_w e[w] * l_w.
__device__ __forceinline__ float warp_weights(const float* m_s, const float* l_s, int NW, int r, float* e, float& M) {
  M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kMmaMaxWarps; ++w)
    if (w < NW) M = fmaxf(M, m_s[w * kMmaHeads + r]);
  float den = 0.f;
#pragma unroll
  for (int w = 0; w < kMmaMaxWarps; ++w) {
    if (w < NW) {
      e[w] = M == -INFINITY ? 0.f : exp2f(m_s[w * kMmaHeads + r] - M);
      den += e[w] * l_s[w * kMmaHeads + r];
    }
  }
  return den;
}

// x[0..8) = sum_w e[w] * src[w * stride + 0..8), in warp order; src 16-byte aligned.
__device__ __forceinline__ void combine8(float* x, const float* src, int stride, const float* e, int NW) {
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = 0.f;
#pragma unroll
  for (int w = 0; w < kMmaMaxWarps; ++w) {
    if (w < NW) {
      const float4 a = *reinterpret_cast<const float4*>(src + w * stride);
      const float4 b = *reinterpret_cast<const float4*>(src + w * stride + 4);
      x[0] += e[w] * a.x, x[1] += e[w] * a.y, x[2] += e[w] * a.z, x[3] += e[w] * a.w;
      x[4] += e[w] * b.x, x[5] += e[w] * b.y, x[6] += e[w] * b.z, x[7] += e[w] * b.w;
    }
  }
}

// One warp issues the copies of the KS keys at positions [pos0, pos0 + KS) of the row into
// its slab (K rows then V rows). Lane l finds the key of slab row l % KS (one cursor step per
// slab, not per copy) and hands it out by shuffle; then 8 lanes copy each key row, 4 rows per
// pass, so each instruction moves whole 128-byte lines. 16-byte chunk c of slab row r lands
// at chunk c ^ (r & xor). The chunk loops run to the compile-time widths DKB/DVB, guarded by
// the real ones unless FULL (Dk == DKB and Dv == DVB).
template <typename T, int DKB, int DVB, int KS, bool FULL>
__device__ __forceinline__ void load_slab(const Params& p, const RowView<T>& rv, int pos0, int L, T* ks, T* vs,
                                          const unsigned char* smem, KeyCursor& cursor, int lane) {
  const int ckk = p.Dk >> 3, ckv = p.Dv >> 3, c0 = lane & 7;
  const int mine = pos0 + lane % KS;
  const int my_key = mine < L ? static_cast<int>(cursor.key(mine, smem, p.n)) : -1;  // keys < S_kv < 2^31
#pragma unroll
  for (int it = 0; it < KS / 4; ++it) {
    const int r = (lane >> 3) + 4 * it;
    const int key = __shfl_sync(0xffffffffu, my_key, r);
    const bool valid = key >= 0;
    const T* krow = rv.kg + static_cast<int64_t>(valid ? key : 0) * p.k_key;
    const T* vrow = rv.vg + static_cast<int64_t>(valid ? key : 0) * p.v_key;
    T* kd = ks + r * p.k_stride;
    T* vd = vs + r * p.v_stride;
    const int kx = r & p.k_xor, vx = r & p.v_xor;
#pragma unroll
    for (int cc = 0; cc < DKB / 64; ++cc) {
      const int c = c0 + 8 * cc;
      if (FULL || c < ckk) cp_async16(kd + ((c ^ kx) << 3), krow + (c << 3), valid);
    }
#pragma unroll
    for (int cc = 0; cc < DVB / 64; ++cc) {
      const int c = c0 + 8 * cc;
      if (FULL || c < ckv) cp_async16(vd + ((c ^ vx) << 3), vrow + (c << 3), valid);
    }
  }
}

// DKB, DVB: Dk and Dv rounded up to 64, 128 or 256 (they size the unrolled loops and the
// register accumulators); FULL: Dk == DKB and Dv == DVB, so no loop needs a guard; KS: keys
// per warp step (16 or 32). q stays in registers as MMA A fragments for DKB <= 128 unless
// DVB <= 64, whose launch bound caps registers at 128 (it spilled there); for DKB = 256 they
// would crowd out the p*V accumulators.
template <typename T, int DKB, int DVB, int KS, bool FULL, bool SHARED>
__global__ void __launch_bounds__(kMmaMaxWarps * 32, DVB <= 64 ? 2 : 1) sel_decode_mma(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int NV = DVB / 8;               // n8 output tiles
  constexpr int NVW = SHARED ? NV / 2 : NV;  // those this warp accumulates (SHARED: its half of Dv)
  constexpr int NK = KS / 8;                // n8 score tiles per slab
  constexpr bool kQReg = DKB <= 128 && DVB > 64;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NW = blockDim.x >> 5;
  const int g = lane >> 2, tg = lane & 3, mi = lane >> 3, rr = lane & 7;
  const int rank = static_cast<int>(blockIdx.x % p.split);  // rank in the cluster (clusters run along x)
  const int64_t unit = blockIdx.x / p.split;
  const int64_t row = unit / p.head_groups;
  const int head0 = static_cast<int>(unit % p.head_groups) * p.hpb;
  const int HG = static_cast<int>(min(int64_t(p.hpb), p.h - head0));
  const int k16 = (p.Dk + 15) & ~15;
  T* qs = reinterpret_cast<T*>(smem + p.off_q);  // [16][q_stride], zero outside [HG, Dk)
  T* ring = reinterpret_cast<T*>(smem + p.off_kv) + (SHARED ? 0 : warp * p.stages * p.stage_elems);  // its slabs

  // Padded rows only (Dk not a multiple of 16): K columns [Dk, k16) meet zero q columns in
  // the last k-step, so they hold zeros, not garbage.
  for (int i = lane; i < p.stages * KS * (k16 - p.Dk); i += 32) {
    const int w = k16 - p.Dk, r = i / w;
    ring[(r / KS) * p.stage_elems + (r % KS) * p.k_stride + p.Dk + i % w] = from_float<T>(0.f);
  }
  if (p.prefetch >= 2 && rank == 0) prefetch_row<T>(p, row, head0, HG);
  wait_prior_grids();
  if (p.early_trigger) allow_next_grid();
  // q: 16-byte cp.async, zero-filled for heads >= HG and columns >= Dk; begin_row waits for it.
  const T* qg = static_cast<const T*>(p.q) + (row * p.h + head0) * p.Dk;
  for (int i = tid; i < kMmaHeads * (k16 / 8); i += blockDim.x) {
    const int r = i / (k16 / 8), c = (i % (k16 / 8)) * 8;
    const bool valid = r < HG && c < p.Dk;
    cp_async16(qs + r * p.q_stride + c, valid ? qg + r * p.Dk + c : qg, valid);
  }
  cp_async_commit();
  const RowView<T> rv = begin_row<T>(p, row, smem, rank == 0 && head0 == 0);
  const int L = static_cast<int>(rv.L);  // <= S_kv < 2^31 (setup_ranges clamps, the host checks S_kv)

  // This warp's slabs: u, u + U, u + 2U, ... with u its index among the U warps of the row
  // (SHARED: the block's slabs, u = its rank among the U blocks of the row).
  const int nslabs = (L + KS - 1) / KS;
  const int U = SHARED ? p.split : p.split * NW, u = SHARED ? rank : rank * NW + warp;
  const int count = u < nslabs ? (nslabs - 1 - u) / U + 1 : 0;
  const int kv_off = KS * p.k_stride;  // V rows follow the slab's K rows
  KeyCursor cursor;
  auto load = [&](int stage, int pos) {  // SHARED: warp w copies slab rows [w * KS / 2, (w + 1) * KS / 2)
    T* ks = ring + stage * p.stage_elems;
    if constexpr (SHARED) {
      constexpr int KH = KS / 2;
      load_slab<T, DKB, DVB, KH, FULL>(p, rv, pos + warp * KH, L, ks + warp * KH * p.k_stride,
                                       ks + kv_off + warp * KH * p.v_stride, smem, cursor, lane);
    } else {
      load_slab<T, DKB, DVB, KS, FULL>(p, rv, pos, L, ks, ks + kv_off, smem, cursor, lane);
    }
  };
  for (int s = 0; s < p.stages - 1; ++s) {
    if (s < count) load(s, (u + s * U) * KS);
    cp_async_commit();
  }

  float o[NVW][4];
#pragma unroll
  for (int nv = 0; nv < NVW; ++nv) o[nv][0] = o[nv][1] = o[nv][2] = o[nv][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g and g + 8
  const uint32_t q_addr = smem_u32(qs + ((mi & 1) * 8 + rr) * p.q_stride + (mi >> 1) * 8);
  uint32_t qa[kQReg ? DKB / 16 : 1][4];
  if constexpr (kQReg) {
#pragma unroll
    for (int kk = 0; kk < DKB / 16; ++kk)
      if (FULL || kk * 16 < k16) ldmatrix_x4(qa[kk], q_addr + kk * 32);
  }
  const int krow = (mi >> 1) * 8 + rr, vrow = (mi & 1) * 8 + rr;  // ldmatrix rows of this lane
  const int kx = rr & p.k_xor, vx = rr & p.v_xor;                 // their swizzles (krow, vrow = rr mod 8)
  const int k_rows16 = 16 * p.k_stride * int(sizeof(T)), v_rows16 = 16 * p.v_stride * int(sizeof(T));
  int slot = 0, next = p.stages - 1;

  for (int i = 0; i < count; ++i) {
    cp_async_wait_pending(p.stages - 2);
    // Every copy of slab i landed and every reader is done with slab i - 1: the warp's own
    // (per-warp slabs), or the block's (SHARED).
    if constexpr (SHARED) {
      __syncthreads();
    } else {
      __syncwarp();
    }
    if (next == p.stages) next = 0;
    if (i + p.stages - 1 < count) load(next, (u + (i + p.stages - 1) * U) * KS);
    cp_async_commit();
    ++next;
    const int pos0 = (u + i * U) * KS;
    const T* ks = ring + slot * p.stage_elems;
    slot = slot + 1 == p.stages ? 0 : slot + 1;
    const uint32_t k_base = smem_u32(ks + krow * p.k_stride), v_base = smem_u32(ks + kv_off + vrow * p.v_stride);

    float s[NK][4];
#pragma unroll
    for (int j = 0; j < NK; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DKB / 16; ++kk) {
      if (FULL || kk * 16 < k16) {
        uint32_t a[4];
        if constexpr (kQReg) {
          a[0] = qa[kk][0], a[1] = qa[kk][1], a[2] = qa[kk][2], a[3] = qa[kk][3];
        } else {
          ldmatrix_x4(a, q_addr + kk * 32);
        }
        const uint32_t col = ((2 * kk + (mi & 1)) ^ kx) << 4;
#pragma unroll
        for (int kc = 0; kc < KS / 16; ++kc) {
          uint32_t bk[4];
          ldmatrix_x4(bk, k_base + kc * k_rows16 + col);
          mma16816<T>(s[2 * kc], a, bk[0], bk[1]);
          mma16816<T>(s[2 * kc + 1], a, bk[2], bk[3]);
        }
      }
    }
    if (pos0 + KS > L) {  // the row's last slab: keys past L score -inf
#pragma unroll
      for (int j = 0; j < NK; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = pos0 + j * 8 + 2 * tg + (e & 1) < L ? s[j][e] * p.scale_log2 : -INFINITY;
    } else {
#pragma unroll
      for (int j = 0; j < NK; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= p.scale_log2;
    }
    float x0 = fmaxf(s[0][0], s[0][1]), x1 = fmaxf(s[0][2], s[0][3]);
#pragma unroll
    for (int j = 1; j < NK; ++j) {
      x0 = fmaxf(x0, fmaxf(s[j][0], s[j][1]));
      x1 = fmaxf(x1, fmaxf(s[j][2], s[j][3]));
    }
    const float mn0 = fmaxf(m0, quad_max(x0)), mn1 = fmaxf(m1, quad_max(x1));  // finite: slab holds a key
    const float a0 = exp2f(m0 - mn0), a1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float r0 = 0.f, r1 = 0.f;
#pragma unroll
    for (int j = 0; j < NK; ++j) {
      s[j][0] = exp2f(s[j][0] - mn0);
      s[j][1] = exp2f(s[j][1] - mn0);
      s[j][2] = exp2f(s[j][2] - mn1);
      s[j][3] = exp2f(s[j][3] - mn1);
      r0 += s[j][0] + s[j][1];
      r1 += s[j][2] + s[j][3];
    }
    l0 = l0 * a0 + r0;
    l1 = l1 * a1 + r1;
#pragma unroll
    for (int nv = 0; nv < NVW; ++nv) {
      o[nv][0] *= a0;
      o[nv][1] *= a0;
      o[nv][2] *= a1;
      o[nv][3] *= a1;
    }
    // The score accumulator layout is the A-operand layout of the p*V product: n8 tiles
    // 2kc and 2kc + 1 are the 16 keys of k-step kc.
#pragma unroll
    for (int kc = 0; kc < KS / 16; ++kc) {
      const uint32_t pa[4] = {pack2<T>(s[2 * kc][0], s[2 * kc][1]), pack2<T>(s[2 * kc][2], s[2 * kc][3]),
                              pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                              pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
      for (int n2 = 0; n2 < NVW / 2; ++n2) {
        const int c16 = SHARED ? warp * (NVW / 2) + n2 : n2;  // 16-column group of Dv
        if (FULL || c16 * 16 < p.Dv) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, v_base + kc * v_rows16 + (((2 * c16 + (mi >> 1)) ^ vx) << 4));
          mma16816<T>(o[2 * n2], pa, bv[0], bv[1]);
          mma16816<T>(o[2 * n2 + 1], pa, bv[2], bv[3]);
        }
      }
    }
  }

  // Merge the partial softmaxes in one fixed order: the block's warps first (weights
  // exp2(m_w - M) over the block's max M, recomputed by every thread that needs them instead
  // of a serial pass and another barrier), then, with split > 1, the cluster's blocks, read
  // through distributed shared memory. The rings are free once every copy landed.
  cp_async_wait<0>();
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  if (!p.early_trigger) allow_next_grid();
  if constexpr (SHARED) {
    // Both warps ran the same softmax over every key; each writes its half of Dv, straight
    // from the accumulator fragments (rows g and g + 8, columns 2tg, 2tg + 1 of each n8 tile).
    T* og = static_cast<T*>(p.o) + (row * p.h + head0) * p.Dv;
    const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int nv = 0; nv < NVW; ++nv) {
      const int c = (warp * NVW + nv) * 8 + 2 * tg;
      if (FULL || c < p.Dv) {
        if (g < HG) *reinterpret_cast<uint32_t*>(og + g * p.Dv + c) = pack2<T>(o[nv][0] * i0, o[nv][1] * i0);
        if (g + 8 < HG) *reinterpret_cast<uint32_t*>(og + (g + 8) * p.Dv + c) = pack2<T>(o[nv][2] * i1, o[nv][3] * i1);
      }
    }
    if (warp == 0 && tg == 0) {
      float* lse = p.lse + row * p.h + head0;
      if (g < HG) lse[g] = l0 != 0.f ? (m0 + log2f(l0)) * kLn2 : -INFINITY;
      if (g + 8 < HG) lse[g + 8] = l1 != 0.f ? (m1 + log2f(l1)) * kLn2 : -INFINITY;
    }
    return;
  }
  __syncthreads();
  constexpr int OS = DVB + 8;  // partial row stride in floats: conflict-free float2 writes
  float* m_s = reinterpret_cast<float*>(smem + p.off_kv);  // [NW][16] per-warp max
  float* l_s = m_s + NW * kMmaHeads;                       // [NW][16] per-warp sum
  float* cm = l_s + NW * kMmaHeads;                        // [16] block max
  float* cl = cm + kMmaHeads;                              // [16] block sum
  float* g_s = cl + kMmaHeads;                             // [kMaxSplit][16] per-block weight
  float* o_s = g_s + kMaxSplit * kMmaHeads;                // [NW][16][OS] per-warp p*V
  float* co = o_s + NW * kMmaHeads * OS;                   // [16][OS] block p*V (split > 1)
  if (tg == 0) {
    m_s[warp * 16 + g] = m0;
    m_s[warp * 16 + g + 8] = m1;
    l_s[warp * 16 + g] = l0;
    l_s[warp * 16 + g + 8] = l1;
  }
#pragma unroll
  for (int nv = 0; nv < NVW; ++nv) {
    if (FULL || nv * 8 < p.Dv) {
      float* r0 = o_s + (warp * 16 + g) * OS + nv * 8 + 2 * tg;
      *reinterpret_cast<float2*>(r0) = make_float2(o[nv][0], o[nv][1]);
      *reinterpret_cast<float2*>(r0 + 8 * OS) = make_float2(o[nv][2], o[nv][3]);
    }
  }
  __syncthreads();
  // One thread per 8 output columns of a head: the warps' partials combined and written as
  // one 16-byte store (Dv is a multiple of 8).
  const int cpr = p.Dv >> 3;
  T* og = static_cast<T*>(p.o) + (row * p.h + head0) * p.Dv;
  if (p.split == 1) {
    for (int i = tid; i < HG * cpr; i += blockDim.x) {
      const int r = i / cpr, c = (i - r * cpr) << 3;
      float e[kMmaMaxWarps], M, x[8];
      const float den = warp_weights(m_s, l_s, NW, r, e, M);
      combine8(x, o_s + r * OS + c, kMmaHeads * OS, e, NW);
      store_vec(og + r * p.Dv + c, x, den > 0.f ? 1.f / den : 0.f);
      if (c == 0) p.lse[row * p.h + head0 + r] = den != 0.f ? (M + log2f(den)) * kLn2 : -INFINITY;
    }
    return;
  }
  if (tid < HG) {
    float e[kMmaMaxWarps], M;
    cl[tid] = warp_weights(m_s, l_s, NW, tid, e, M);
    cm[tid] = M;
  }
  for (int i = tid; i < HG * cpr; i += blockDim.x) {
    const int r = i / cpr, c = (i - r * cpr) << 3;
    float e[kMmaMaxWarps], M, x[8];
    warp_weights(m_s, l_s, NW, r, e, M);
    combine8(x, o_s + r * OS + c, kMmaHeads * OS, e, NW);
    *reinterpret_cast<float4*>(co + r * OS + c) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4*>(co + r * OS + c + 4) = make_float4(x[4], x[5], x[6], x[7]);
  }
  cluster_sync();  // every block's cm, cl, co are written
  if (tid < HG) {
    const int r = tid;
    float bm[kMaxSplit], bl[kMaxSplit];
#pragma unroll
    for (int rk = 0; rk < kMaxSplit; ++rk) {  // independent remote loads, issued together
      bm[rk] = rk < p.split ? *cluster_ptr(cm + r, rk) : -INFINITY;
      bl[rk] = rk < p.split ? *cluster_ptr(cl + r, rk) : 0.f;
    }
    float M = -INFINITY, den = 0.f;
#pragma unroll
    for (int rk = 0; rk < kMaxSplit; ++rk) M = fmaxf(M, bm[rk]);
#pragma unroll
    for (int rk = 0; rk < kMaxSplit; ++rk) {
      bm[rk] = M == -INFINITY ? 0.f : exp2f(bm[rk] - M);
      den += bm[rk] * bl[rk];
    }
    const float inv = den > 0.f ? 1.f / den : 0.f;
#pragma unroll
    for (int rk = 0; rk < kMaxSplit; ++rk) g_s[rk * 16 + r] = bm[rk] * inv;
    if (rank == 0) p.lse[row * p.h + head0 + r] = den != 0.f ? (M + log2f(den)) * kLn2 : -INFINITY;
  }
  __syncthreads();
  for (int i = rank * blockDim.x + tid; i < HG * p.Dv; i += p.split * blockDim.x) {
    const int r = i / p.Dv, c = i % p.Dv;
    float x[kMaxSplit];
#pragma unroll
    for (int rk = 0; rk < kMaxSplit; ++rk) x[rk] = rk < p.split ? *cluster_ptr(co + r * OS + c, rk) : 0.f;
    float num = 0.f;
#pragma unroll
    for (int rk = 0; rk < kMaxSplit; ++rk) num += g_s[rk * 16 + r] * x[rk];
    og[i] = from_float<T>(num);
  }
  cluster_sync();  // keep this block's shared memory alive until the cluster has read it
}

// ---------------------------------------------------------------- CUDA-core kernel
// Two blocks per SM, as kRingBudget sizes the ring for: without the bound, ptxas capped the fp32
// kernel at 64 registers and spilled 8 bytes once K/V strides became run-time values.
template <typename T>
__global__ void __launch_bounds__(kSimtThreads, 2) sel_decode_simt(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int VEC = 16 / sizeof(T);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  const int64_t row = blockIdx.x / p.head_groups;
  const int head0 = static_cast<int>(blockIdx.x % p.head_groups) * p.hpb;
  const int HG = static_cast<int>(min(int64_t(p.hpb), p.h - head0));
  const int TL = p.tile;
  float* qs = reinterpret_cast<float*>(smem + p.off_q);   // [HG][Dk], pre-scaled by scale*log2(e)
  float* sc = reinterpret_cast<float*>(smem + p.off_sc);  // [HG][TL] scores, then probabilities
  float* m_run = reinterpret_cast<float*>(smem + p.off_stats);
  float* l_run = m_run + p.hpb;
  float* alpha = l_run + p.hpb;
  T* kv = reinterpret_cast<T*>(smem + p.off_kv);

  const T* qg = static_cast<const T*>(p.q) + (row * p.h + head0) * p.Dk;
  for (int i = tid; i < HG * (p.Dk / VEC); i += blockDim.x) {  // one 16-byte load per thread
    float f[VEC];
    load_vec(f, qg + i * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) qs[i * VEC + e] = f[e] * p.scale_log2;
  }
  for (int i = tid; i < HG; i += blockDim.x) {
    m_run[i] = -INFINITY;
    l_run[i] = 0.f;
  }
  const RowView<T> rv = begin_row<T>(p, row, smem, head0 == 0);
  const int64_t L = rv.L;
  const T* kg = rv.kg;
  const T* vg = rv.vg;
  const int64_t ntiles = (L + TL - 1) / TL;
  KeyCursor cursor;
  for (int s = 0; s < p.stages - 1; ++s) {
    if (s < ntiles) {
      T* ks = kv + s * p.stage_elems;
      load_tile<T>(p, kg, vg, int64_t(s) * TL, L, ks, ks + TL * p.k_stride, smem, cursor);
    }
    cp_async_commit();
  }

  // Scores: `tpp` lanes per (head, key) pair split the dot product (TL is a multiple of 32,
  // so each warp's lanes share one head and the loop trip count is warp-uniform).
  const int ckk = p.Dk / VEC, ckv = p.Dv / VEC;
  const int pairs = HG * TL;
  int tpp = 1;
  while (tpp < 8 && pairs * tpp * 2 <= static_cast<int>(blockDim.x)) tpp *= 2;
  const int groups = blockDim.x / tpp, gi = tid / tpp, sub = tid % tpp;
  // p*V: thread owns VEC output columns of one head for the keys j = part (mod kpart).
  const int slots = HG * ckv, kpart = blockDim.x / slots;
  const int part = tid / slots, slot = tid % slots, hh_pv = slot / ckv, c_pv = slot % ckv;
  float acc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] = 0.f;

  for (int64_t t = 0; t < ntiles; ++t) {
    cp_async_wait_pending(p.stages - 2);
    __syncthreads();
    {
      const int64_t tn = t + p.stages - 1;
      if (tn < ntiles) {
        T* ks = kv + (tn % p.stages) * p.stage_elems;
        load_tile<T>(p, kg, vg, tn * TL, L, ks, ks + TL * p.k_stride, smem, cursor);
      }
      cp_async_commit();
    }
    const T* ks = kv + (t % p.stages) * p.stage_elems;
    const T* vs = ks + TL * p.k_stride;
    const int nvalid = static_cast<int>(min(int64_t(TL), L - t * TL));

    for (int pr = gi; pr < pairs; pr += groups) {
      const int hh = pr / TL, j = pr % TL;
      float d = 0.f;
      if (j < nvalid) {
        const T* kr = ks + j * p.k_stride;
        const float* qr = qs + hh * p.Dk;
        for (int c = sub; c < ckk; c += tpp) {
          float kf[VEC];
          load_vec(kf, kr + c * VEC);
#pragma unroll
          for (int e4 = 0; e4 < VEC; e4 += 4) {
            const float4 q4 = *reinterpret_cast<const float4*>(qr + c * VEC + e4);
            d = fmaf(q4.x, kf[e4], d);
            d = fmaf(q4.y, kf[e4 + 1], d);
            d = fmaf(q4.z, kf[e4 + 2], d);
            d = fmaf(q4.w, kf[e4 + 3], d);
          }
        }
      }
      for (int o = tpp >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      if (sub == 0) sc[hh * TL + j] = j < nvalid ? d : -INFINITY;
    }
    __syncthreads();

    for (int hh = warp; hh < HG; hh += nwarps) {
      float* sr = sc + hh * TL;
      float mx = -INFINITY;
      for (int j = lane; j < TL; j += 32) mx = fmaxf(mx, sr[j]);
      const float m_old = m_run[hh];
      const float m_new = fmaxf(m_old, warp_max(mx));  // finite: the tile has a valid key
      float sum = 0.f;
      for (int j = lane; j < TL; j += 32) {
        const float e = exp2f(sr[j] - m_new);
        sr[j] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      __syncwarp();  // every lane's read of m_run[hh] is ordered before lane 0 rewrites it (racecheck)
      if (lane == 0) {
        const float a = exp2f(m_old - m_new);
        alpha[hh] = a;
        l_run[hh] = l_run[hh] * a + sum;
        m_run[hh] = m_new;
      }
    }
    __syncthreads();

    if (part < kpart) {
      const float a = alpha[hh_pv];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] *= a;
      const float* prob = sc + hh_pv * TL;
      for (int j = part; j < nvalid; j += kpart) {
        const float pj = prob[j];
        float vf[VEC];
        load_vec(vf, vs + j * p.v_stride + c_pv * VEC);
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = fmaf(pj, vf[e], acc[e]);
      }
    }
  }

  cp_async_wait<0>();
  __syncthreads();
  if (kpart > 1) {  // fixed-order sum of the key partitions (deterministic)
    float* red = reinterpret_cast<float*>(kv);
    if (part > 0 && part < kpart)
#pragma unroll
      for (int e = 0; e < VEC; ++e) red[((part - 1) * slots + slot) * VEC + e] = acc[e];
    __syncthreads();
    if (part == 0)
      for (int q2 = 1; q2 < kpart; ++q2)
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] += red[((q2 - 1) * slots + slot) * VEC + e];
  }
  if (part == 0) {
    const float l = l_run[hh_pv];
    T* og = static_cast<T*>(p.o) + (row * p.h + head0 + hh_pv) * p.Dv + c_pv * VEC;
    store_vec(og, acc, l != 0.f ? 1.f / l : 0.f);
  }
  for (int i = tid; i < HG; i += blockDim.x) {
    const float l = l_run[i];
    p.lse[row * p.h + head0 + i] = l != 0.f ? (m_run[i] + log2f(l)) * kLn2 : -INFINITY;
  }
}

// ---------------------------------------------------------------- host side
int align16(int64_t x) { return static_cast<int>((x + 15) & ~int64_t(15)); }

// simt ring depth: as many stages as fit the ring budget, at least 3, at most 6.
int ring_stages(int64_t stage_bytes) {
  return static_cast<int>(std::clamp<int64_t>(kRingBudget / stage_bytes, kMinStages, kMaxStages));
}

struct Device {
  int id, cc_major, sms, max_smem, smem_per_sm;
};
// The current device's attributes, queried once per device: a decode step pays host time
// for every driver call it makes.
bool current_device(Device& d) {
  static std::mutex mu;
  static std::map<int, Device> cache;
  int id = 0;
  SEL_CUDA(cudaGetDevice(&id));
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(id);
  if (it != cache.end()) {
    d = it->second;
    return true;
  }
  d.id = id;
  SEL_CUDA(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, id));
  SEL_CUDA(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, id));
  SEL_CUDA(cudaDeviceGetAttribute(&d.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, id));
  SEL_CUDA(cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, id));
  cache[id] = d;
  return true;
}

// Raises `kernel`'s dynamic shared memory limit on `device` to at least `smem_bytes`; the
// limits already set are remembered, so a repeated launch makes no attribute call.
template <typename Kernel>
bool allow_smem(Kernel kernel, int device, int smem_bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> set;
  const auto key = std::make_pair(device, reinterpret_cast<const void*>(kernel));
  std::lock_guard<std::mutex> lock(mu);
  const auto it = set.find(key);
  if (it != set.end() && it->second >= smem_bytes) return true;
  SEL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  set[key] = smem_bytes;
  return true;
}

// Resident blocks per SM of `kernel` at this launch shape; cached per device, kernel and shape
// (the occupancy query costs host time on every decode step otherwise).
template <typename Kernel>
bool blocks_per_sm(Kernel kernel, int device, int threads, int smem_bytes, int& nb) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int>, int> cache;
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel), threads, smem_bytes);
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      nb = it->second;
      return true;
    }
  }
  SEL_TRY(allow_smem(kernel, device, smem_bytes));
  SEL_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, threads, smem_bytes));
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = nb;
  return true;
}

template <typename Kernel>
bool launch(Kernel kernel, const Params& p, const Device& dev, const DecodePlan& plan, cudaStream_t stream) {
  SEL_CHECK(plan.smem_bytes <= dev.max_smem, "sel_decode: needs ", plan.smem_bytes,
              " bytes of shared memory per block, device allows ", dev.max_smem);
  SEL_CHECK(plan.blocks <= 0x7fffffff, "sel_decode: ", plan.blocks, " blocks exceed the grid limit");
  SEL_TRY(allow_smem(kernel, dev.id, plan.smem_bytes));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(plan.blocks));
  cfg.blockDim = dim3(static_cast<unsigned>(plan.threads));
  cfg.dynamicSmemBytes = plan.smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int na = 0;
  if (plan.split > 1) {
    attrs[na].id = cudaLaunchAttributeClusterDimension;
    attrs[na].val.clusterDim.x = plan.split;
    attrs[na].val.clusterDim.y = 1;
    attrs[na].val.clusterDim.z = 1;
    ++na;
  }
  if (plan.pdl != 0) {
    attrs[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = na;
  SEL_CUDA(cudaLaunchKernelEx(&cfg, kernel, p));
  SEL_CUDA(cudaGetLastError());
  return true;
}

template <typename T, int DKB, int DVB>
bool run_mma(Params p, const DecodeArgs& a, DecodePlan& plan, const Device& dev, cudaStream_t stream,
                    bool launch_it) {
  const int k16 = (p.Dk + 15) & ~15, v16 = (p.Dv + 15) & ~15;
  p.hpb = static_cast<int>(std::min<int64_t>(p.h, kMmaHeads));
  p.head_groups = static_cast<int>((p.h + p.hpb - 1) / p.hpb);
  const int64_t units = a.B * p.G * p.head_groups;  // (row, head group) pairs
  // Rows of whole 128-byte groups are XOR-swizzled (no padding); others padded by 16 bytes
  // so ldmatrix rows land in distinct banks.
  const bool swz_k = p.Dk % 64 == 0, swz_v = p.Dv % 64 == 0;
  p.k_stride = swz_k ? p.Dk : k16 + 8;
  p.v_stride = swz_v ? p.Dv : v16 + 8;
  p.k_xor = swz_k ? 7 : 0;
  p.v_xor = swz_v ? 7 : 0;
  p.q_stride = k16 + 8;
  p.off_L = 16 * p.n;
  p.off_q = align16(p.off_L + 8);
  p.off_kv = align16(p.off_q + kMmaHeads * p.q_stride * int64_t(sizeof(T)));
  // Schedule: each warp streams its own slabs (1) or the block's 2 warps share each slab (2).
  // Automatic (full H100 sweeps at 514d6fc, e1bd9f1 and 9acb5c3, docs/design/cuda-decode.md):
  // shared slabs with at least one (row, head group) per SM and Dk <= Dv, where they were
  // faster (median graph time 0.86x), and whenever S_kv <= 256 bounds every row's L by 256
  // (0.51-1.03x of per-warp slabs at L <= 256 on every shape); per-warp slabs otherwise: with
  // fewer rows (shared slabs were up to 1.26x slower at N = 64, L = 1024: every warp runs
  // every slab's softmax, and a lone row per SM is bound by that) and with Dk > Dv (up to
  // 1.15x slower at N = 1024, Dk = 128, Dv = 64: the duplicated QK^T outweighs the halved
  // p*V); and whenever the overrides ask for a launch shared slabs do not run (other warps,
  // a split, 16-key slabs).
  const bool shared_runs = (a.tune.warps <= 0 || a.tune.warps == 2) && a.tune.split <= 1 &&
                           (a.tune.slab <= 0 || a.tune.slab == 32);
  const bool shared_auto = shared_runs && ((units >= dev.sms && p.Dk <= p.Dv) || p.S_kv <= kShortRowsKeys);
  const int schedule = a.tune.schedule > 0 ? a.tune.schedule : shared_auto ? 2 : 1;
  SEL_CHECK(schedule == 1 || schedule == 2, "sel_decode: schedule must be 1 (per-warp slabs) or 2 (shared slabs), got ",
              schedule);
  SEL_CHECK(a.tune.pdl >= 0 && a.tune.pdl <= 3, "sel_decode: pdl must be 0 (automatic), 1 (on), 2 (off) or 3 (on, "
              "next grid triggered right after the wait), got ", a.tune.pdl);
  const bool shared = schedule == 2;
  auto smem_for = [&](int nw, int stages, int split, int slab) {
    const int64_t ring = int64_t(shared ? 1 : nw) * stages * slab * (p.k_stride + p.v_stride) * int64_t(sizeof(T));
    const int64_t merge = (2 * int64_t(nw) * kMmaHeads + (2 + kMaxSplit) * kMmaHeads +
                           int64_t(nw + (split > 1)) * kMmaHeads * (DVB + 8)) * 4;
    return p.off_kv + std::max(ring, merge);
  };
  // Automatic launch (measured on the H100, docs/design/cuda-decode.md): blocks of
  // 2 warps, so many rows stream at once. Rings 3 deep when there are many rows per SM; with
  // fewer rows each row needs more bytes in flight: shared slabs 4 deep (5 when a key's K and V
  // rows pass 256 bytes), per-warp slabs 2 deep (two rings). More warps per row were slower.
  const bool many_rows = units >= 4 * int64_t(dev.sms);
  int nw = a.tune.warps > 0 ? a.tune.warps : 2;
  const int few_rows_stages = !shared ? 2 : (p.Dk + p.Dv) * int(sizeof(T)) <= 256 ? 4 : 5;
  int stages = a.tune.stages > 0 ? a.tune.stages : many_rows ? 3 : few_rows_stages;
  SEL_CHECK(nw >= 1 && nw <= kMmaMaxWarps, "sel_decode: warps must be in [1, ", kMmaMaxWarps, "], got ", nw);
  // 8 warps crashed the host process on the H100 at Dk = Dv = 128 and 256 ((4,1,8,1), (2,4,8,0),
  // (2,8,8,0); cause not found) and kept parity at Dk + Dv <= 128.
  SEL_CHECK(nw <= 4 || p.Dk + p.Dv <= 128, "sel_decode: more than 4 warps are verified only for Dk + Dv <= 128, "
              "got ", nw, " warps at Dk=", p.Dk, ", Dv=", p.Dv);
  SEL_CHECK(stages >= 2 && stages <= kMaxStages, "sel_decode: stages must be in [2, ", kMaxStages, "], got ", stages);
  // Keys per warp step: 32 halves the per-step softmax and rescaling work against 16, at twice
  // the shared memory per ring stage; 16 where 32 would not fit the launch.
  int slab = a.tune.slab > 0 ? a.tune.slab : 32;
  SEL_CHECK(slab == 16 || slab == 32, "sel_decode: slab (keys per warp step) must be 16 or 32, got ", slab);
  if (!shared && a.tune.slab <= 0 && smem_for(nw, stages, kMaxSplit, slab) > dev.max_smem) slab = 16;
  while (smem_for(nw, stages, kMaxSplit, slab) > dev.max_smem && a.tune.stages <= 0 && stages > 2) --stages;
  while (smem_for(nw, stages, kMaxSplit, slab) > dev.max_smem && a.tune.warps <= 0 && nw > 1) nw /= 2;
  p.stage_elems = slab * (p.k_stride + p.v_stride);
  p.stages = stages;
  const int max_split = dev.cc_major >= 9 ? kMaxSplit : 1;
  const bool full = p.Dk == DKB && p.Dv == DVB;
  auto kernel = shared       ? (full ? sel_decode_mma<T, DKB, DVB, 32, true, true> : sel_decode_mma<T, DKB, DVB, 32, false, true>)
                : slab == 32 ? (full ? sel_decode_mma<T, DKB, DVB, 32, true, false> : sel_decode_mma<T, DKB, DVB, 32, false, false>)
                             : (full ? sel_decode_mma<T, DKB, DVB, 16, true, false> : sel_decode_mma<T, DKB, DVB, 16, false, false>);
  plan.threads = nw * 32;
  // Automatic launches use no cluster: splits were not measured faster (docs/design/cuda-decode.md).
  const int split = a.tune.split > 0 ? a.tune.split : 1;
  SEL_CHECK(split >= 1 && split <= max_split, "sel_decode: split must be in [1, ", max_split, "] on this device, got ",
              split);
  // Splits of 2 to 4 blocks of 2 to 4 warps kept parity on the H100; others are not verified.
  SEL_CHECK(split <= kMaxVerifiedSplit && (split == 1 || nw <= kMaxVerifiedSplitWarps), "sel_decode: a cluster split "
              "is verified only up to ", kMaxVerifiedSplit, " blocks of at most ", kMaxVerifiedSplitWarps,
              " warps, got split=", split, " with ", nw, " warps");
  SEL_CHECK(!shared || (nw == 2 && split == 1 && slab == 32), "sel_decode: the shared-slab schedule runs 2 warps, no "
              "split and 32-key slabs, got ", nw, " warps, split=", split, ", slab=", slab);
  p.split = split;
  plan.kernel = 1;
  plan.schedule = schedule;
  plan.slab = slab;
  plan.stages = stages;
  plan.warps = nw;
  plan.split = split;
  plan.smem_bytes = align16(smem_for(nw, stages, split, slab));
  plan.blocks = units * split;
  SEL_CHECK(plan.smem_bytes <= dev.max_smem, "sel_decode: ", nw, " warps with ", stages, "-deep rings need ",
              plan.smem_bytes, " bytes of shared memory per block, the device allows ", dev.max_smem);
  SEL_CHECK(a.tune.occupancy >= 0, "sel_decode: occupancy must be >= 0, got ", a.tune.occupancy);
  SEL_CHECK(a.tune.prefetch >= 0 && a.tune.prefetch <= 4, "sel_decode: prefetch must be in [0, 4], got ",
            a.tune.prefetch);
  SEL_TRY(blocks_per_sm(kernel, dev.id, plan.threads, plan.smem_bytes, plan.blocks_per_sm));
  const int64_t share = (plan.blocks + dev.sms - 1) / dev.sms;  // blocks per SM, spread evenly
  // Tail landing (automatic, shared slabs with PDL, SM >= 9.0): where the grid is one wave of at
  // least 2 blocks per SM, an SM could hold more, and rows may be long (S_kv >= kTailLandingKeys),
  // its shared memory is padded so an SM holds just its even share, and each block asks L2 for its
  // row's ranges, q and first 64 keys before its wait (prefetch 4). The next grid's blocks then land
  // only as this grid's finish, and their prefetches run in its tail, where DRAM has bandwidth to
  // spare. Measured on the H100 at 338408c (docs/design/cuda-decode.md): N = 256,
  // Dk = Dv = 64, L = 512: 1.29-1.30x the HBM floor against 1.41-1.42x; full sweep, N = 256 and
  // S_kv >= 256: 0.84-1.04x the previous launch's graph time (geomean 0.94 over 120 rows). Not
  // elsewhere: with S_kv <= 128 the 64 prefetched keys outweigh rows of 16-32 (geomean 1.08, up to
  // 1.23x slower); where the next grid already lands only in the tail (N = 1024) the prefetch alone
  // was up to 1.39x slower at L <= 64 and gained nothing at L >= 128 (geomean 1.01); where it lands
  // early, the prefetched keys were evicted by this grid's stream and read twice (1.44-1.47x at
  // N = 256, D = 64, L = 512).
  const bool tail = a.tune.occupancy == 0 && shared && dev.cc_major >= 9 && a.tune.pdl != 2 &&
                    plan.blocks <= int64_t(plan.blocks_per_sm) * dev.sms && share >= 2 &&
                    share < plan.blocks_per_sm && p.S_kv >= kTailLandingKeys;
  const int occupancy = a.tune.occupancy > 0 ? a.tune.occupancy : tail ? static_cast<int>(share) : 0;
  if (occupancy > 0 && occupancy < plan.blocks_per_sm) {  // 1 KB per block is the driver's reservation
    plan.smem_bytes = static_cast<int>(std::min<int64_t>(dev.max_smem, (dev.smem_per_sm / (occupancy + 1) + 16) & ~int64_t(15)));
    SEL_TRY(blocks_per_sm(kernel, dev.id, plan.threads, plan.smem_bytes, plan.blocks_per_sm));
  }
  // PDL lets the launch and prologue overlap the previous kernel's tail (nothing global is
  // read before griddepcontrol.wait). Automatic: on with shared slabs, where it was
  // measured faster; off with per-warp slabs, as those launches were measured. Where the next
  // grid lands evenly, it is triggered right after the wait (3), not after the loop (1): all of
  // it fits beside this grid, or an SM's capacity is no more than its even share of the blocks.
  // Otherwise its blocks fill the slots of the SMs that finish first, several rows deep (at
  // N = 256, Dk + Dv = 192, 3 blocks per SM: up to 1.20x slower); where it lands evenly it was
  // as fast or faster everywhere (full H100 sweep, docs/design/cuda-decode.md). A grid at the wait holds only its slots; the wait returns when this grid is done.
  const int64_t capacity = int64_t(plan.blocks_per_sm) * dev.sms;
  const bool lands_evenly = 2 * plan.blocks <= capacity || plan.blocks_per_sm <= share;
  const int pdl = a.tune.pdl != 0 ? a.tune.pdl : !shared ? 2 : lands_evenly ? 3 : 1;
  plan.pdl = pdl != 2 && dev.cc_major >= 9 ? pdl : 0;
  p.early_trigger = plan.pdl == 3;
  p.prefetch = a.tune.prefetch > 0 ? a.tune.prefetch : tail && plan.pdl != 0 ? 4 : 1;
  plan.prefetch = p.prefetch;
  return !launch_it || launch(kernel, p, dev, plan, stream);
}

template <typename T>
bool run_simt(Params p, const DecodeArgs& a, DecodePlan& plan, const Device& dev, cudaStream_t stream,
                     bool launch_it) {
  constexpr int VEC = 16 / sizeof(T);
  const int ckv = p.Dv / VEC;
  p.hpb = static_cast<int>(std::min<int64_t>({p.h, int64_t(kSimtThreads / ckv), 32, int64_t(std::max(1, 2048 / p.Dk))}));
  p.head_groups = static_cast<int>((p.h + p.hpb - 1) / p.hpb);
  p.split = 1;
  p.k_stride = p.Dk + VEC;  // +16 bytes per row: conflict-free 16-byte reads across rows
  p.v_stride = p.Dv + VEC;
  const int64_t row_bytes = int64_t(p.k_stride + p.v_stride) * sizeof(T);
  p.tile = kMinStages * 64 * row_bytes <= kRingBudget ? 64 : 32;
  p.stage_elems = p.tile * (p.k_stride + p.v_stride);
  p.stages = ring_stages(p.tile * row_bytes);
  p.off_L = 16 * p.n;
  p.off_q = align16(p.off_L + 8);
  p.off_sc = align16(p.off_q + int64_t(p.hpb) * p.Dk * 4);
  p.off_stats = align16(p.off_sc + int64_t(p.hpb) * p.tile * 4);
  p.off_kv = align16(p.off_stats + 3 * int64_t(p.hpb) * 4);
  const int64_t ring = int64_t(p.stages) * p.tile * row_bytes;
  const int64_t red = int64_t(kSimtThreads) * VEC * 4;
  plan.kernel = 0;
  plan.stages = p.stages;
  plan.warps = kSimtThreads / 32;
  plan.split = 1;
  plan.pdl = 0;
  plan.threads = kSimtThreads;
  plan.smem_bytes = align16(p.off_kv + std::max(ring, red));
  plan.blocks = a.B * p.G * p.head_groups;
  if (launch_it) return launch(sel_decode_simt<T>, p, dev, plan, stream);
  return blocks_per_sm(sel_decode_simt<T>, dev.id, plan.threads, plan.smem_bytes, plan.blocks_per_sm);
}

// Dv's compile-time width for the tensor-core kernel (Dk's is DKB).
template <typename T, int DKB>
bool run_mma_dv(const Params& p, const DecodeArgs& a, DecodePlan& plan, const Device& dev, cudaStream_t stream,
                bool launch_it) {
  if (p.Dv <= 64) return run_mma<T, DKB, 64>(p, a, plan, dev, stream, launch_it);
  if (p.Dv <= 128) return run_mma<T, DKB, 128>(p, a, plan, dev, stream, launch_it);
  return run_mma<T, DKB, 256>(p, a, plan, dev, stream, launch_it);
}

template <typename T>
bool run_typed(const Params& p, const DecodeArgs& a, DecodePlan& plan, const Device& dev, cudaStream_t stream,
                      bool launch_it) {
  if (!a.use_mma) return run_simt<T>(p, a, plan, dev, stream, launch_it);
  if constexpr (sizeof(T) == 2) {
    if (p.Dk <= 64) return run_mma_dv<T, 64>(p, a, plan, dev, stream, launch_it);
    if (p.Dk <= 128) return run_mma_dv<T, 128>(p, a, plan, dev, stream, launch_it);
    return run_mma_dv<T, 256>(p, a, plan, dev, stream, launch_it);
  }
  return fail("sel_decode: the tensor-core kernel takes fp16/bf16 only");
}

bool plan_or_launch(const DecodeArgs& a, cudaStream_t stream, bool launch_it, DecodePlan& plan) {
  SEL_CHECK(a.Dk > 0 && a.Dk <= 256 && a.Dk % 8 == 0, "sel_decode: Dk must be a multiple of 8 in [8, 256], got ", a.Dk);
  SEL_CHECK(a.Dv > 0 && a.Dv <= 256 && a.Dv % 8 == 0, "sel_decode: Dv must be a multiple of 8 in [8, 256], got ", a.Dv);
  SEL_CHECK(a.S_kv >= 0 && a.S_kv <= 0x7fffffff, "sel_decode: S_kv must be below 2^31 keys, got ", a.S_kv);
  SEL_CHECK(a.n >= 0 && a.n <= 4096, "sel_decode: n (ranges per row) must be in [0, 4096], got ", a.n);
  SEL_CHECK(!(a.use_mma && a.dtype == Dtype::kFloat), "sel_decode: the tensor-core kernel takes fp16/bf16 only");
  if (launch_it) {  // 16-byte copies: every K/V row starts on a 16-byte boundary
    const int64_t item = a.dtype == Dtype::kFloat ? 4 : 2;
    const int64_t strides[4] = {a.k_row, a.k_key, a.v_row, a.v_key};
    for (const int64_t st : strides)
      SEL_CHECK(st >= 0 && st * item % 16 == 0, "sel_decode: k and v row and key strides must be non-negative "
                "multiples of 16 bytes, got ", st, " elements of ", item, " bytes");
    SEL_CHECK(a.k_key <= 0x7fffffff && a.v_key <= 0x7fffffff, "sel_decode: k and v key strides must be below 2^31 "
              "elements, got ", a.k_key, " and ", a.v_key);
  }
  plan = DecodePlan{};
  if (a.B * a.G * a.h == 0) return true;
  Device dev{};
  SEL_TRY(current_device(dev));
  Params p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.ranges = a.ranges;
  p.positions = a.positions;
  p.ranges_i64 = a.ranges_i64;
  p.positions_i64 = a.positions_i64;
  p.o = a.o;
  p.lse = a.lse;
  p.G = a.G;
  p.h = a.h;
  p.S_kv = a.S_kv;
  p.k_row = a.k_row, p.v_row = a.v_row;
  p.k_key = static_cast<int>(a.k_key), p.v_key = static_cast<int>(a.v_key);
  p.Dk = a.Dk;
  p.Dv = a.Dv;
  p.n = a.n;
  p.scale_log2 = a.scale * kLog2e;
  p.clip = a.clip;
  p.counter = reinterpret_cast<unsigned long long*>(a.counter);
  p.kv_bytes = a.kv_bytes;
  switch (a.dtype) {
    case Dtype::kHalf: return run_typed<__half>(p, a, plan, dev, stream, launch_it);
    case Dtype::kBFloat16: return run_typed<__nv_bfloat16>(p, a, plan, dev, stream, launch_it);
    case Dtype::kFloat: return run_typed<float>(p, a, plan, dev, stream, launch_it);
  }
  return fail("sel_decode: unknown dtype");
}

}  // namespace

bool sel_decode_launch(const DecodeArgs& args, cudaStream_t stream, char* err, int cap) {
  DecodePlan plan{};
  const bool ok = plan_or_launch(args, stream, true, plan);
  if (!ok && cap > 0) std::snprintf(err, static_cast<size_t>(cap), "%s", t_err);
  return ok;
}

bool sel_decode_plan(const DecodeArgs& args, DecodePlan& plan, char* err, int cap) {
  const bool ok = plan_or_launch(args, nullptr, false, plan);
  if (!ok && cap > 0) std::snprintf(err, static_cast<size_t>(cap), "%s", t_err);
  return ok;
}

}  // namespace selgate
