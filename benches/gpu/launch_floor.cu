// The host's floor for eager launches: what the CUDA driver itself costs per call on this
// machine, with no runtime around it. The tiny-op chain (`harness chain`) is compared
// with these figures: rtx's per-op cost minus the driver's is rtx's own.
//
// Build and run on the GPU host (`benches/gpu/run floor` does both):
//   nvcc -O2 -arch=sm_90 -o launch_floor benches/gpu/launch_floor.cu -lcuda
//   ./launch_floor
//
// Each case is 20,000 calls on one stream, after 2,000 of warm-up, timed on the host
// clock; 5 repetitions, the median printed as µs per call. `e2e` includes the final
// stream synchronize (the device must have run every kernel), `host` stops when the
// last call returns.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

__global__ void add_f32(const float* a, const float* b, float* y, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

#define CK(x)                                                                      \
    do {                                                                           \
        CUresult r_ = (x);                                                         \
        if (r_ != CUDA_SUCCESS) {                                                  \
            const char* s_ = nullptr;                                              \
            cuGetErrorString(r_, &s_);                                             \
            std::fprintf(stderr, "%s failed: %s\n", #x, s_ ? s_ : "?");            \
            std::exit(1);                                                          \
        }                                                                          \
    } while (0)

using Clock = std::chrono::steady_clock;

struct Timing {
    double host_us, e2e_us;
};

template <class F>
Timing time_case(CUstream s, int n, F&& body) {
    for (int i = 0; i < 2000; ++i) body(i);
    CK(cuStreamSynchronize(s));
    std::vector<double> host, e2e;
    for (int rep = 0; rep < 5; ++rep) {
        auto t0 = Clock::now();
        for (int i = 0; i < n; ++i) body(i);
        auto t1 = Clock::now();
        CK(cuStreamSynchronize(s));
        auto t2 = Clock::now();
        host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
        e2e.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / n);
    }
    std::sort(host.begin(), host.end());
    std::sort(e2e.begin(), e2e.end());
    return {host[2], e2e[2]};
}

int main() {
    cudaFree(nullptr);  // the primary context, current on this thread
    CUfunction f;
    if (cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&f), (const void*)add_f32) !=
        cudaSuccess) {
        std::fprintf(stderr, "cudaGetFuncBySymbol failed\n");
        return 1;
    }
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    const size_t n = 16;
    CUdeviceptr a, b, y;
    CK(cuMemAlloc(&a, n * 4));
    CK(cuMemAlloc(&b, n * 4));
    CK(cuMemAlloc(&y, n * 4));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = 0.25f + 0.01f * (float)i;
    CK(cuMemcpyHtoD(a, h.data(), n * 4));
    CK(cuMemcpyHtoD(b, h.data(), n * 4));
    size_t nn = n;
    void* params[] = {&a, &b, &y, &nn};
    auto launch = [&] { CK(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, s, params, nullptr)); };
    const int N = 20000;

    Timing t = time_case(s, N, [&](int) { launch(); });
    std::printf("floor launch host_us=%.3f e2e_us=%.3f\n", t.host_us, t.e2e_us);

    CUevent ev[64];
    for (auto& e : ev) CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    t = time_case(s, N, [&](int i) {
        launch();
        CK(cuEventRecord(ev[i & 63], s));
    });
    std::printf("floor launch+record host_us=%.3f e2e_us=%.3f\n", t.host_us, t.e2e_us);
    t = time_case(s, N, [&](int i) {
        launch();
        if ((i & 15) == 15) CK(cuEventRecord(ev[i & 63], s));
    });
    std::printf("floor launch+record/16 host_us=%.3f e2e_us=%.3f\n", t.host_us, t.e2e_us);
    t = time_case(s, N, [&](int i) { CK(cuEventRecord(ev[i & 63], s)); });
    std::printf("floor record host_us=%.3f e2e_us=%.3f\n", t.host_us, t.e2e_us);

    CUstream s2;
    CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CK(cuEventRecord(ev[0], s2));
    t = time_case(s, N, [&](int) { CK(cuStreamWaitEvent(s, ev[0], 0)); });
    std::printf("floor wait_event host_us=%.3f e2e_us=%.3f\n", t.host_us, t.e2e_us);

    CUmemoryPool pool;
    CUdevice dev;
    CK(cuCtxGetDevice(&dev));
    CK(cuDeviceGetDefaultMemPool(&pool, dev));
    cuuint64_t keep = ~0ull;
    CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    t = time_case(s, N, [&](int) {
        CUdeviceptr p;
        CK(cuMemAllocFromPoolAsync(&p, n * 4, pool, s));
        CK(cuMemFreeAsync(p, s));
    });
    std::printf("floor pool_alloc+free host_us=%.3f e2e_us=%.3f\n", t.host_us, t.e2e_us);

    // The 1,000-op chain's shape: a dependent chain y = y + b, the same launches.
    void* chain[] = {&y, &b, &y, &nn};
    t = time_case(s, N, [&](int) {
        CK(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, s, chain, nullptr));
    });
    std::printf("floor chain host_us=%.3f e2e_us=%.3f\n", t.host_us, t.e2e_us);
    // Several threads, each launching on its own stream at once (as rtx's actors do):
    // µs of wall time per launch over all threads. If the driver serializes launches,
    // this stays at the one-thread figure however many threads launch.
    {
        CUcontext ctx;
        CK(cuCtxGetCurrent(&ctx));
        for (int threads : {1, 2, 4, 8}) {
            const int per = 10000;
            std::vector<CUstream> ss(threads);
            std::vector<CUdeviceptr> ys(threads);
            for (int k = 0; k < threads; ++k) {
                CK(cuStreamCreate(&ss[k], CU_STREAM_NON_BLOCKING));
                CK(cuMemAlloc(&ys[k], n * 4));
                CK(cuMemcpyHtoD(ys[k], h.data(), n * 4));
            }
            std::vector<double> walls;
            for (int rep = 0; rep < 4; ++rep) {
                auto t0 = Clock::now();
                std::vector<std::thread> ts;
                for (int k = 0; k < threads; ++k) {
                    ts.emplace_back([&, k] {
                        CK(cuCtxSetCurrent(ctx));
                        CUdeviceptr yk = ys[k];
                        void* args[] = {&yk, &b, &yk, &nn};
                        for (int i = 0; i < per; ++i)
                            CK(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, ss[k], args, nullptr));
                        CK(cuStreamSynchronize(ss[k]));
                    });
                }
                for (auto& t : ts) t.join();
                auto t1 = Clock::now();
                if (rep > 0)
                    walls.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() /
                                    (double(per) * threads));
            }
            std::sort(walls.begin(), walls.end());
            std::printf("floor threads=%d wall_us_per_launch=%.3f (per thread %.3f)\n", threads,
                        walls[1], walls[1] * threads);
        }
    }

    // The host clock itself (Rust's `Instant::now` is the same CLOCK_MONOTONIC read): on
    // a virtual machine without a vDSO clock it is a system call.
    {
        const int M = 1000000;
        timespec ts;
        long long sink = 0;
        auto t0 = Clock::now();
        for (int i = 0; i < M; ++i) {
            clock_gettime(CLOCK_MONOTONIC, &ts);
            sink += ts.tv_nsec;
        }
        auto t1 = Clock::now();
        std::printf("floor clock_gettime host_us=%.4f (sink %lld)\n",
                    std::chrono::duration<double, std::micro>(t1 - t0).count() / M, sink & 1);
    }
    std::printf("floor done\n");
    return 0;
}
