// ProcessGroupXCCL from C++ (libtorch, c10d directly, no Python): the time of an all-reduce
// through c10d's Backend API, synchronous (asyncOp = false, as torch.distributed's blocking
// call) and asynchronous (a Work, then wait()), timed back to back between two barriers,
// averaged over ranks.
//
//   xccl run -n 2 -- ./c10d_latency 8 20000      (bytes, runs)
//
// Ranks meet through the launcher's store with PyTorch's TCPStore client (xccl run's store
// speaks PyTorch's protocol; under torchrun, MASTER_ADDR/MASTER_PORT lead to its store).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ProcessGroupXCCL.hpp"

static int env(const char* k, int dflt) {
    const char* v = std::getenv(k);
    return v ? std::atoi(v) : dflt;
}

int main(int argc, char** argv) {
    size_t bytes = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 8;
    long runs = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 20000;
    int rank = env("RANK", 0), size = env("WORLD_SIZE", 1);
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(env("MASTER_PORT", 29500));
    opts.isServer = false;
    opts.waitWorkers = false;
    const char* host = std::getenv("MASTER_ADDR");
    auto store = c10::make_intrusive<c10d::TCPStore>(host ? host : "127.0.0.1", opts);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("c10d_latency", store);
    auto pg = c10::make_intrusive<xccl_torch::ProcessGroupXCCL>(prefixed, rank, size, std::chrono::milliseconds(60000));
    std::vector<at::Tensor> t{at::ones({static_cast<int64_t>(bytes / 4 ? bytes / 4 : 1)}, at::kFloat)};
    c10d::AllreduceOptions sync, async;
    sync.asyncOp = false;
    async.asyncOp = true;
    c10d::BarrierOptions b;
    for (const auto& [name, o] : {std::pair{"sync", sync}, std::pair{"async", async}}) {
        for (int i = 0; i < 100; ++i) pg->allreduce(t, o)->wait();
        pg->barrier(b)->wait();
        auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < runs; ++i) pg->allreduce(t, o)->wait();
        double per = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / runs;
        pg->barrier(b)->wait();
        std::vector<at::Tensor> s{at::full({1}, per, at::kDouble)};
        pg->allreduce(s, sync)->wait();
        if (rank == 0)
            std::printf("c10d %s all_reduce %zu B %.3f us\n", name, t[0].numel() * 4, s[0].item<double>() / size * 1e6);
    }
    pg->shutdown();
    return 0;
}
