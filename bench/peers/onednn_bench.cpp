// oneDNN as a peer: matmul and NHWC convolution at the shapes tessel tunes, one call timed
// the way tessel times kernels (median of repeated calls after warm-up).
//
//   g++ -O2 -std=c++17 onednn_bench.cpp -o onednn_bench -ldnnl
//   OMP_NUM_THREADS=1 ./onednn_bench matmul f32|u8s8s32|bf16 M N K [min_seconds]
//   OMP_NUM_THREADS=1 ./onednn_bench conv f32 N H W C K R S stride pad nhwc|any [min_seconds]
//
// Weights use format_tag::any and are reordered once outside the timing (pre-packed, as a
// deployed model's weights are). Convolution activations are NHWC (tessel's layout) or, with
// `any`, whatever blocked layout oneDNN prefers (reorders not timed). Prints one line:
// RESULT {json}.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;

static void fill(memory &m) {
    size_t n = m.get_desc().get_size();
    auto *p = static_cast<unsigned char *>(m.get_data_handle());
    for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)((i * 7 + 3) % 5);  // small values
}

// Weights in the layout the primitive chose (`format_tag::any`), reordered once and not timed:
// oneDNN's pre-packed weights.
static memory prepacked(memory plain, const memory::desc &want, engine &eng, stream &s) {
    if (plain.get_desc() == want) return plain;
    memory packed(want, eng);
    reorder(plain, packed).execute(s, plain, packed);
    s.wait();
    return packed;
}

static double time_it(primitive &prim, stream &s, std::unordered_map<int, memory> &args,
                      double min_s, size_t *iters) {
    for (int i = 0; i < 3; ++i) prim.execute(s, args);
    s.wait();
    std::vector<double> ts;
    auto start = std::chrono::steady_clock::now();
    while (true) {
        auto t0 = std::chrono::steady_clock::now();
        prim.execute(s, args);
        s.wait();
        auto t1 = std::chrono::steady_clock::now();
        ts.push_back(std::chrono::duration<double>(t1 - t0).count());
        if (std::chrono::duration<double>(t1 - start).count() > min_s && ts.size() >= 10) break;
    }
    std::sort(ts.begin(), ts.end());
    *iters = ts.size();
    return ts[ts.size() / 2];
}

static dt parse_dt(const std::string &d, dt *b, dt *c) {
    if (d == "f32") { *b = dt::f32; *c = dt::f32; return dt::f32; }
    if (d == "u8s8s32") { *b = dt::s8; *c = dt::s32; return dt::u8; }
    if (d == "bf16") { *b = dt::bf16; *c = dt::f32; return dt::bf16; }
    fprintf(stderr, "dtype: f32, u8s8s32 or bf16 (bf16 x bf16 -> f32)\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s matmul|conv DTYPE ...\n", argv[0]);
        return 2;
    }
    std::string op = argv[1];
    dt b_dt, c_dt;
    dt a_dt = parse_dt(argv[2], &b_dt, &c_dt);
    engine eng(engine::kind::cpu, 0);
    stream s(eng);
    double flop, med, min_s = 1.0;
    size_t iters = 0;
    std::string impl;
    if (op == "matmul" && argc >= 6) {
        memory::dim M = atol(argv[3]), N = atol(argv[4]), K = atol(argv[5]);
        if (argc > 6) min_s = atof(argv[6]);
        memory::desc a_md({M, K}, a_dt, tag::ab), c_md({M, N}, c_dt, tag::ab);
        memory::desc b_any({K, N}, b_dt, tag::any), b_plain({K, N}, b_dt, tag::ab);
        matmul::primitive_desc pd(matmul::desc(a_md, b_any, c_md), eng);
        matmul prim(pd);
        memory A(a_md, eng), Bp(b_plain, eng), C(c_md, eng);
        fill(A);
        fill(Bp);
        memory B = prepacked(Bp, pd.weights_desc(), eng, s);
        memory scratch(pd.scratchpad_desc(), eng);
        std::unordered_map<int, memory> args{{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B},
                                             {DNNL_ARG_DST, C}, {DNNL_ARG_SCRATCHPAD, scratch}};
        med = time_it(prim, s, args, min_s, &iters);
        flop = 2.0 * M * N * K;
        impl = pd.impl_info_str();
    } else if (op == "conv" && argc >= 13) {
        memory::dim N = atol(argv[3]), H = atol(argv[4]), W = atol(argv[5]), C = atol(argv[6]),
                    K = atol(argv[7]), R = atol(argv[8]), S = atol(argv[9]),
                    st = atol(argv[10]), pad = atol(argv[11]);
        bool any = std::string(argv[12]) == "any";
        if (argc > 13) min_s = atof(argv[13]);
        // Grouped and depthwise convolutions (groups = C): weights {G, K/G, C/G, R, S}.
        memory::dim G = argc > 14 ? atol(argv[14]) : 1;
        if (G < 1 || C % G != 0 || K % G != 0) {
            fprintf(stderr, "groups %ld must divide C %ld and K %ld\n", (long)G, (long)C, (long)K);
            return 2;
        }
        memory::dim P = (H + 2 * pad - R) / st + 1, Q = (W + 2 * pad - S) / st + 1;
        memory::desc src_plain({N, C, H, W}, a_dt, tag::nhwc), dst_plain({N, K, P, Q}, c_dt, tag::nhwc);
        memory::desc src_md = any ? memory::desc({N, C, H, W}, a_dt, tag::any) : src_plain;
        memory::desc dst_md = any ? memory::desc({N, K, P, Q}, c_dt, tag::any) : dst_plain;
        memory::dims w_dims = G == 1 ? memory::dims{K, C, R, S} : memory::dims{G, K / G, C / G, R, S};
        memory::desc w_any(w_dims, b_dt, tag::any),
            w_plain(w_dims, b_dt, G == 1 ? tag::ohwi : tag::gohwi);
        convolution_forward::desc cd(prop_kind::forward_inference, algorithm::convolution_direct,
                                     src_md, w_any, dst_md, {st, st}, {pad, pad}, {pad, pad});
        convolution_forward::primitive_desc pd(cd, eng);
        convolution_forward prim(pd);
        memory Src(pd.src_desc(), eng), Dst(pd.dst_desc(), eng), Wp(w_plain, eng);
        fill(Src);
        fill(Wp);
        memory Wt = prepacked(Wp, pd.weights_desc(), eng, s);
        memory scratch(pd.scratchpad_desc(), eng);
        std::unordered_map<int, memory> args{{DNNL_ARG_SRC, Src}, {DNNL_ARG_WEIGHTS, Wt},
                                             {DNNL_ARG_DST, Dst}, {DNNL_ARG_SCRATCHPAD, scratch}};
        med = time_it(prim, s, args, min_s, &iters);
        flop = 2.0 * N * P * Q * K * (C / G) * R * S;
        impl = pd.impl_info_str();
    } else {
        fprintf(stderr, "usage: %s matmul DTYPE M N K [s] | conv DTYPE N H W C K R S stride pad nhwc|any [s [groups]]\n", argv[0]);
        return 2;
    }
    printf("RESULT {\"onednn\": \"%d.%d.%d\", \"median_ms\": %.5f, \"gflops\": %.2f, \"iters\": %zu, \"impl\": \"%s\"}\n",
           dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, med * 1e3,
           flop / med / 1e9, iters, impl.c_str());
    return 0;
}
