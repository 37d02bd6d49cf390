// The host's floor for small cuBLASLt GEMMs: what one `cublasLtMatmul` call costs on this
// machine, from one thread and from several at once (each with its own handle, stream,
// plan and buffers, as rtx's actors have), with no runtime around it. The 8-chain
// workload's fused eager form (`harness streams`: relu(x·Wᵀ), bf16 256×256×256, one
// `cublasLtMatmul` per op) is compared with these figures.
//
// Build and run on the GPU host (`benches/gpu/run ltfloor` does both):
//   nvcc -O2 -arch=sm_90 -o lt_floor benches/gpu/lt_floor.cu -lcublasLt -lcuda
//   ./lt_floor
//
// Each thread count: every thread makes 4,000 calls (after 500 of warm-up, waited for)
// on its own stream; 5 repetitions, the median wall time over all threads' calls is
// printed as µs per call, and per thread (that times the thread count). Cases:
//   plain     the heuristic's first algorithm, the plan made once per thread;
//   share     the same with CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = SMs / threads (at
//             least 8), as rtx plans small GEMMs for a share of the SMs;
//   launch    a bare cuLaunchKernel of a 16-element add instead, for comparison.
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

__global__ void add_f32(const float* a, const float* b, float* y, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

#define CK(x)                                                                       \
    do {                                                                            \
        auto r_ = (x);                                                              \
        if ((int)r_ != 0) {                                                         \
            std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, (int)r_, __LINE__); \
            std::exit(1);                                                           \
        }                                                                           \
    } while (0)

using Clock = std::chrono::steady_clock;

constexpr int M = 256, N = 256, K = 256;

// One actor's worth of cuBLASLt state.
struct Lt {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    void *a, *b, *d, *ws;
    size_t ws_size = 32u << 20;
    cudaStream_t s;

    Lt(int sm_target) {
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CK(cublasLtCreate(&h));
        CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_RELU;
        CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        if (sm_target > 0)
            CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                              &sm_target, sizeof sm_target));
        CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, M, K));
        CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, N, K));
        CK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, M, N, M));
        cublasLtMatmulPreference_t pref;
        CK(cublasLtMatmulPreferenceCreate(&pref));
        CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws_size, sizeof ws_size));
        cublasLtMatmulHeuristicResult_t res;
        int count = 0;
        CK(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &res, &count));
        if (count < 1) {
            std::fprintf(stderr, "no cuBLASLt algorithm\n");
            std::exit(1);
        }
        algo = res.algo;
        CK(cublasLtMatmulPreferenceDestroy(pref));
        CK(cudaMalloc(&a, (size_t)M * K * 2));
        CK(cudaMalloc(&b, (size_t)N * K * 2));
        CK(cudaMalloc(&d, (size_t)M * N * 2));
        CK(cudaMalloc(&ws, ws_size));
        std::vector<__nv_bfloat16> hbuf((size_t)M * K);
        for (size_t i = 0; i < hbuf.size(); ++i)
            hbuf[i] = __float2bfloat16(0.01f * (float)((i * 37) % 101) - 0.5f);
        CK(cudaMemcpy(a, hbuf.data(), hbuf.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b, hbuf.data(), hbuf.size() * 2, cudaMemcpyHostToDevice));
    }

    void call() {
        const float alpha = 1.0f, beta = 0.0f;
        CK(cublasLtMatmul(h, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algo, ws,
                          ws_size, s));
    }
};

// µs of wall time per call over all threads (median of 5), `threads` threads each
// calling `body(k)` `per` times and then synchronizing its stream `sync(k)`.
template <class Body, class Sync>
double wall_per_call(int threads, int per, Body&& body, Sync&& sync) {
    std::vector<double> walls;
    for (int rep = 0; rep < 6; ++rep) {
        std::atomic<int> ready{0};
        std::atomic<bool> go{false};
        std::vector<std::thread> ts;
        for (int k = 0; k < threads; ++k) {
            ts.emplace_back([&, k] {
                ready.fetch_add(1);
                while (!go.load()) {
                }
                for (int i = 0; i < per; ++i) body(k);
                sync(k);
            });
        }
        while (ready.load() < threads) {
        }
        auto t0 = Clock::now();
        go.store(true);
        for (auto& t : ts) t.join();
        auto t1 = Clock::now();
        if (rep > 0)
            walls.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() /
                            (double(per) * threads));
    }
    std::sort(walls.begin(), walls.end());
    return walls[2];
}

int main() {
    CK(cudaFree(nullptr));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CUcontext ctx;
    CK(cuCtxGetCurrent(&ctx));
    CUfunction f;
    CK(cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&f), (const void*)add_f32));
    const size_t n = 16;
    const int per = 4000;

    // One thread, host time of the call alone and end to end (the device's time per
    // GEMM when it is slower than the host).
    {
        Lt lt(0);
        for (int i = 0; i < 500; ++i) lt.call();
        CK(cudaStreamSynchronize(lt.s));
        std::vector<double> host, e2e;
        for (int rep = 0; rep < 5; ++rep) {
            auto t0 = Clock::now();
            for (int i = 0; i < per; ++i) lt.call();
            auto t1 = Clock::now();
            CK(cudaStreamSynchronize(lt.s));
            auto t2 = Clock::now();
            host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / per);
            e2e.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / per);
        }
        std::sort(host.begin(), host.end());
        std::sort(e2e.begin(), e2e.end());
        std::printf("ltfloor one_thread host_us=%.3f e2e_us=%.3f (bf16 %dx%dx%d relu)\n",
                    host[2], e2e[2], M, N, K);
    }

    for (int threads : {1, 2, 4, 8}) {
        for (int mode = 0; mode < 3; ++mode) {
            const char* name = mode == 0 ? "plain" : mode == 1 ? "share" : "launch";
            std::vector<Lt*> lts;
            std::vector<cudaStream_t> ss(threads);
            std::vector<CUdeviceptr> ys(threads), bs(threads);
            if (mode < 2) {
                const int target = mode == 1 ? std::max(8, sms / threads) : 0;
                for (int k = 0; k < threads; ++k) lts.push_back(new Lt(target));
                for (auto* lt : lts) {
                    for (int i = 0; i < 500; ++i) lt->call();
                    CK(cudaStreamSynchronize(lt->s));
                }
            } else {
                for (int k = 0; k < threads; ++k) {
                    CK(cudaStreamCreateWithFlags(&ss[k], cudaStreamNonBlocking));
                    CK(cuMemAlloc(&ys[k], n * 4));
                    CK(cuMemAlloc(&bs[k], n * 4));
                    CK(cuMemsetD32(ys[k], 0x3e800000u, n));  // 0.25f
                    CK(cuMemsetD32(bs[k], 0x3c23d70au, n));  // 0.01f
                }
            }
            size_t nn = n;
            double w = wall_per_call(
                threads, per,
                [&](int k) {
                    if (mode < 2) {
                        lts[k]->call();
                    } else {
                        static thread_local bool bound = false;
                        if (!bound) {
                            CK(cuCtxSetCurrent(ctx));
                            bound = true;
                        }
                        CUdeviceptr yk = ys[k], bk = bs[k];
                        void* args[] = {&yk, &bk, &yk, &nn};
                        CK(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, (CUstream)ss[k], args,
                                          nullptr));
                    }
                },
                [&](int k) {
                    CK(cudaStreamSynchronize(mode < 2 ? lts[k]->s : ss[k]));
                });
            std::printf("ltfloor %s threads=%d wall_us_per_call=%.3f (per thread %.3f)\n", name,
                        threads, w, w * threads);
            for (auto* lt : lts) delete lt;  // handles and buffers leak: a short program
        }
    }
    std::printf("ltfloor done\n");
    return 0;
}
