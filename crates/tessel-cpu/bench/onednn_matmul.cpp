// The vendor baseline of `cargo xtask bench cpu`: one oneDNN matmul with pre-packed weights.
//
//   onednn_matmul M N K (f32|bf16|f16|u8s8)
//
// Threads follow OMP_NUM_THREADS. Prints one line: `impl=<name> min_ms=<..> median_ms=<..>
// gflops=<at the median>`. Built against Debian's libdnnl-dev (oneDNN 2.x API).
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace dnnl;

static int run_matmul(int argc, char **argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s M N K f32|bf16|f16|u8s8\n", argv[0]);
        return 2;
    }
    const memory::dim M = std::atol(argv[1]), N = std::atol(argv[2]), K = std::atol(argv[3]);
    const std::string dt = argv[4];
    memory::data_type a_dt, b_dt, c_dt;
    if (dt == "f32") {
        a_dt = b_dt = c_dt = memory::data_type::f32;
    } else if (dt == "bf16") {
        a_dt = b_dt = memory::data_type::bf16;
        c_dt = memory::data_type::f32;
    } else if (dt == "f16") {
        a_dt = b_dt = memory::data_type::f16;
        c_dt = memory::data_type::f32;
    } else if (dt == "u8s8") {
        a_dt = memory::data_type::u8;
        b_dt = memory::data_type::s8;
        c_dt = memory::data_type::s32;
    } else {
        std::fprintf(stderr, "unknown dtype %s\n", dt.c_str());
        return 2;
    }
    engine eng(engine::kind::cpu, 0);
    stream s(eng);
    memory::desc a_md({M, K}, a_dt, memory::format_tag::ab);
    memory::desc b_plain({K, N}, b_dt, memory::format_tag::ab);
    memory::desc b_any({K, N}, b_dt, memory::format_tag::any);
    memory::desc c_md({M, N}, c_dt, memory::format_tag::ab);
    matmul::primitive_desc pd(matmul::desc(a_md, b_any, c_md), eng);

    memory a(a_md, eng), b_user(b_plain, eng), b(pd.weights_desc(), eng), c(c_md, eng);
    std::memset(a.get_data_handle(), 1, a_md.get_size());
    std::memset(b_user.get_data_handle(), 1, b_plain.get_size());
    // Pre-pack the weights once, outside the timed loop.
    reorder(b_user, b).execute(s, b_user, b);
    s.wait();

    matmul mm(pd);
    auto run = [&] {
        mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
        s.wait();
    };
    for (int i = 0; i < 3; i++) run();
    std::vector<double> ms;
    auto start = std::chrono::steady_clock::now();
    while (ms.size() < 100) {
        auto t = std::chrono::steady_clock::now();
        run();
        auto e = std::chrono::steady_clock::now();
        ms.push_back(std::chrono::duration<double, std::milli>(e - t).count());
        if (ms.size() >= 3 && std::chrono::duration<double>(e - start).count() > 1.0) break;
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double gflops = 2.0 * M * N * K / (median * 1e6);
    std::printf("impl=%s min_ms=%.4f median_ms=%.4f gflops=%.2f\n", pd.impl_info_str(), ms[0], median, gflops);
    return 0;
}

int main(int argc, char **argv) {
    try {
        return run_matmul(argc, argv);
    } catch (const dnnl::error &e) {
        // oneDNN has no implementation for this dtype on this CPU (bf16 needs avx512_core).
        std::printf("unsupported: %s (status %d)\n", e.what(), (int)e.status);
        return 3;
    }
}
