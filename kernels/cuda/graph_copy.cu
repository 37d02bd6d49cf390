// graph_copy.cu — many device-to-device copies in one launch: a graph's state commits
// and bound-input copies (runtime/src/runtime/graph/segment.rs), one kernel node instead
// of one memcpy node per tensor.
//
//   extern "C" __global__ void copy_many(CopyTable t, unsigned n)
//
// Copy i < n (blockIdx.y) moves t.bytes[i] bytes from t.src[i] to t.dst[i]; the blocks
// along x share it in a grid-stride loop, 16-byte vectors when both addresses are
// 16-byte aligned, bytes otherwise (and for the tail). Block: any multiple of 32
// threads (256 by default); grid: (any, n). The table is passed by value (768 bytes of
// kernel parameters), so a captured launch keeps its addresses. Copies must not overlap
// one another's destinations or their own source. No shared memory.

#define RTX_COPY_MAX 32

struct CopyTable {
    unsigned long long src[RTX_COPY_MAX];
    unsigned long long dst[RTX_COPY_MAX];
    unsigned long long bytes[RTX_COPY_MAX];
};

extern "C" __global__ void copy_many(CopyTable t, unsigned n) {
    const unsigned i = blockIdx.y;
    if (i >= n || i >= RTX_COPY_MAX) return;
    const unsigned long long s = t.src[i], d = t.dst[i], nb = t.bytes[i];
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t nt = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (((s | d) & 15ull) == 0) {
        const uint4* s4 = reinterpret_cast<const uint4*>(s);
        uint4* d4 = reinterpret_cast<uint4*>(d);
        const size_t nv = nb / 16;
        size_t k = tid;
        // Two vectors in flight per thread per step.
        for (; k + nt < nv; k += 2 * nt) {
            const uint4 a = __ldg(s4 + k), b = __ldg(s4 + k + nt);
            d4[k] = a;
            d4[k + nt] = b;
        }
        for (; k < nv; k += nt) d4[k] = __ldg(s4 + k);
        done = nv * 16;
    }
    const unsigned char* s1 = reinterpret_cast<const unsigned char*>(s);
    unsigned char* d1 = reinterpret_cast<unsigned char*>(d);
    for (size_t k = done + tid; k < nb; k += nt) d1[k] = s1[k];
}
