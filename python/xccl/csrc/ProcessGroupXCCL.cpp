// ProcessGroupXCCL (see ProcessGroupXCCL.hpp; WorkXCCL and the group's shared state are in
// WorkXCCL.cpp).
//
// Tensors go to xccl without copies when they are contiguous. Operations that only move data
// (broadcast, gathers, scatters, all-to-all, send/recv) move bytes, so every dtype works;
// reductions map the dtype onto xccl's element types (complex as pairs of reals for sums and
// averages, bool as bytes for min and max). List forms go through one contiguous buffer and
// may have uneven sizes (xccl's uneven collectives).
#include "ProcessGroupXCCL.hpp"

#include <cstdlib>
#include <cstring>
#include <numeric>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace xccl_torch {
namespace {

using c10d::OpType;
using Tensor = at::Tensor;

// Throws xccl's last error for `rc`: a wrong argument as c10::Error (RuntimeError in
// Python), anything else as DistBackendError.
[[noreturn]] void fail(const std::string& call, xcclResult_t rc) {
    std::string msg = "xccl backend: " + call + ": " + xcclGetLastError();
    if (rc == xcclInvalidArgument || rc == xcclInvalidUsage) {
        TORCH_CHECK(false, msg);
    }
    C10_THROW_ERROR(DistBackendError, msg);
}

void check(xcclResult_t rc, const std::string& call) {
    if (rc != xcclSuccess) fail(call, rc);
}

void checkTensor(const Tensor& t, const char* call) {
    TORCH_CHECK(t.device().is_cpu(), "xccl backend: ", call, ": a tensor on ", t.device(),
                ": the xccl backend serves CPU tensors (for a mixed job use e.g. "
                "init_process_group('cpu:xccl,cuda:nccl'))");
    TORCH_CHECK(t.layout() == at::kStrided, "xccl backend: ", call, ": ", t.layout(),
                " tensors are not supported");
}

const Tensor& one(const std::vector<Tensor>& ts, const char* call) {
    TORCH_CHECK(ts.size() == 1, "xccl backend: ", call, ": ", ts.size(),
                " tensors per call; xccl takes one per process");
    checkTensor(ts[0], call);
    return ts[0];
}

size_t bytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

xcclRedOp_t redOp(const c10d::ReduceOp& op, const char* call) {
    switch (op.op_) {
        case c10d::ReduceOp::SUM: return xcclSum;
        case c10d::ReduceOp::PRODUCT: return xcclProd;
        case c10d::ReduceOp::MIN: return xcclMin;
        case c10d::ReduceOp::MAX: return xcclMax;
        case c10d::ReduceOp::AVG: return xcclAvg;
        default:
            const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
            int k = static_cast<int>(op.op_);
            TORCH_CHECK(false, "xccl backend: ", call, ": reduction ", k >= 0 && k < 9 ? names[k] : "?",
                        " is not supported (xccl reduces with SUM, PRODUCT, MIN, MAX and AVG; "
                        "bitwise and pre-multiplied reductions are not provided)");
    }
}

// xccl's element type for reducing `t` by `op`, and how many elements each of t's stands for.
std::pair<xcclDataType_t, size_t> reduceType(const Tensor& t, xcclRedOp_t op, const char* call) {
    switch (t.scalar_type()) {
        case at::kFloat: return {xcclFloat32, 1};
        case at::kDouble: return {xcclFloat64, 1};
        case at::kHalf: return {xcclFloat16, 1};
        case at::kBFloat16: return {xcclBfloat16, 1};
        case at::kChar: return {xcclInt8, 1};
        case at::kInt: return {xcclInt32, 1};
        case at::kLong: return {xcclInt64, 1};
        case at::kByte: return {xcclUint8, 1};
        case at::kUInt32: return {xcclUint32, 1};
        case at::kUInt64: return {xcclUint64, 1};
        case at::kBool:
            if (op == xcclMin || op == xcclMax) return {xcclUint8, 1};
            break;
        case at::kComplexFloat:
            if (op == xcclSum || op == xcclAvg) return {xcclFloat32, 2};
            break;
        case at::kComplexDouble:
            if (op == xcclSum || op == xcclAvg) return {xcclFloat64, 2};
            break;
        default: break;
    }
    TORCH_CHECK(false, "xccl backend: ", call, ": reducing ", t.scalar_type(),
                " tensors with this operator is not supported (xccl reduces float32/64, float16, "
                "bfloat16, int8/32/64 and uint8/32/64; bool with MIN/MAX; complex with SUM/AVG)");
}

// The contiguous tensor a call writes: `t` itself, or a stand-in copied back into `t` after.
Tensor writable(const Tensor& t, Pending& p, bool fill) {
    if (t.is_contiguous()) return t;
    Tensor tmp = fill ? t.contiguous() : at::empty_like(t, at::MemoryFormat::Contiguous);
    p.after.emplace_back([t, tmp]() mutable { t.copy_(tmp); });
    return tmp;
}

// One contiguous buffer holding `ts` one after the other (filled with their values when
// `fill`), copied back into them after the operation when `back`.
Tensor flat(const std::vector<Tensor>& ts, Pending& p, bool fill, bool back, const char* call) {
    TORCH_CHECK(!ts.empty(), "xccl backend: ", call, ": an empty list of tensors");
    int64_t n = 0;
    for (const auto& t : ts) {
        checkTensor(t, call);
        TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "xccl backend: ", call,
                    ": tensors of different dtypes ", ts[0].scalar_type(), " and ", t.scalar_type());
        n += t.numel();
    }
    Tensor buf = fill ? at::cat([&] {
        std::vector<Tensor> v;
        for (const auto& t : ts) v.push_back(t.reshape(-1));
        return v;
    }())
                      : at::empty({n}, ts[0].options().memory_format(at::MemoryFormat::Contiguous));
    if (back) {
        p.after.emplace_back([ts, buf]() mutable {
            int64_t off = 0;
            for (auto& t : ts) {
                t.copy_(buf.narrow(0, off, t.numel()).view_as(t));
                off += t.numel();
            }
        });
    }
    return buf;
}

// Element counts (in `unit`s) of `ts`.
std::vector<size_t> counts(const std::vector<Tensor>& ts, size_t unit) {
    std::vector<size_t> c;
    for (const auto& t : ts) c.push_back(static_cast<size_t>(t.numel()) * unit);
    return c;
}

// Issues one xccl call: `start(work)` with work null (the caller waits at once: a
// synchronous dist.* call) or a handle slot; the call's tensors are kept in the Pending.
Pending issue(bool async, const std::string& call, std::vector<Tensor> keep,
              const std::function<xcclResult_t(xcclWork_t*)>& start, Pending p = Pending()) {
    p.keep = std::move(keep);
    check(start(async ? &p.handle : nullptr), call);
    if (!async) {
        for (auto& f : p.after) f();
        p.after.clear();
    }
    return p;
}

// The store PyTorch hands to the group, as xccl's store callbacks.
struct StoreBridge {
    c10::intrusive_ptr<c10d::Store> store;
    std::string error;

    static StoreBridge* self(void* ctx) { return static_cast<StoreBridge*>(ctx); }
    template <typename F>
    static int guarded(void* ctx, F f) {
        try {
            f();
            return 0;
        } catch (const std::exception& e) {
            self(ctx)->error = e.what();
            return 1;
        }
    }
    static int set(void* ctx, const char* key, const uint8_t* value, size_t len) {
        return guarded(ctx, [&] { self(ctx)->store->set(key, std::vector<uint8_t>(value, value + len)); });
    }
    static int get(void* ctx, const char* key, uint8_t** value, size_t* len) {
        return guarded(ctx, [&] {
            std::vector<uint8_t> v = self(ctx)->store->get(key);
            auto* out = static_cast<uint8_t*>(std::malloc(v.empty() ? 1 : v.size()));
            if (out == nullptr) throw std::bad_alloc();
            if (!v.empty()) std::memcpy(out, v.data(), v.size());
            *value = out;
            *len = v.size();
        });
    }
    static int add(void* ctx, const char* key, int64_t delta, int64_t* result) {
        return guarded(ctx, [&] { *result = self(ctx)->store->add(key, delta); });
    }
};

// The host the store is served on (to listen on the address that leads there), if known.
std::string storeHost(c10::intrusive_ptr<c10d::Store> s) {
    while (auto* p = dynamic_cast<c10d::PrefixStore*>(s.get())) s = p->getUnderlyingStore();
    if (auto* t = dynamic_cast<c10d::TCPStore*>(s.get())) return t->getHost();
    return "";
}

}  // namespace

// ---- ProcessGroupXCCL --------------------------------------------------------------------

ProcessGroupXCCL::ProcessGroupXCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout, std::string name)
    : c10d::Backend(rank, size), name_(std::move(name)), shared_(std::make_shared<GroupState>()) {
    StoreBridge bridge{store, ""};
    xcclStore s{&bridge, &StoreBridge::set, &StoreBridge::get, &StoreBridge::add};
    std::string host = storeHost(store);
    xcclComm_t c = nullptr;
    xcclResult_t rc = xcclCommInitStore(&c, &s, size, rank, host.empty() ? nullptr : host.c_str(),
                                        std::chrono::duration<double>(timeout).count());
    if (rc != xcclSuccess) {
        std::string msg = std::string("xccl backend: creating the group's communicator (rank ") +
                          std::to_string(rank) + " of " + std::to_string(size) + "): " + xcclGetLastError();
        if (!bridge.error.empty()) msg += " (the store said: " + bridge.error + ")";
        C10_THROW_ERROR(DistBackendError, msg);
    }
    shared_->comm = c;
}

ProcessGroupXCCL::~ProcessGroupXCCL() { shared_->stop(); }

xcclComm_t ProcessGroupXCCL::comm() const {
    xcclComm_t c = shared_->comm;
    TORCH_CHECK(c != nullptr, "xccl backend: the process group was shut down");
    return c;
}

void ProcessGroupXCCL::abort() { shared_->abortComm("ProcessGroup.abort()"); }

void ProcessGroupXCCL::shutdown() {
    shared_->stop();
    xcclComm_t c;
    {
        std::lock_guard<std::mutex> g(shared_->mu);
        c = std::exchange(shared_->comm, nullptr);
    }
    if (c) xcclCommDestroy(c);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::work(OpType type, std::vector<Pending> parts,
                                                      std::vector<Tensor> result) {
    return c10::make_intrusive<WorkXCCL>(type, rank_, std::move(parts), std::move(result), shared_, ++seq_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::allreduce(std::vector<Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
    if (tensors.size() != 1) {
        c10d::AllreduceCoalescedOptions o;
        o.reduceOp = opts.reduceOp;
        o.asyncOp = opts.asyncOp;
        return allreduce_coalesced(tensors, o);
    }
    const Tensor& t = one(tensors, "all_reduce");
    xcclRedOp_t op = redOp(opts.reduceOp, "all_reduce");
    auto [type, unit] = reduceType(t, op, "all_reduce");
    Pending p;
    Tensor buf = writable(t, p, true);
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "all_reduce", {buf}, [&](xcclWork_t* w) {
        return xcclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel() * unit, type, op, c, w);
    }, std::move(p)));
    return work(OpType::ALLREDUCE, std::move(parts), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::allreduce_coalesced(std::vector<Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
    xcclRedOp_t op = redOp(opts.reduceOp, "all_reduce_coalesced");
    Pending p;
    Tensor buf = flat(tensors, p, true, true, "all_reduce_coalesced");
    auto [type, unit] = reduceType(buf, op, "all_reduce_coalesced");
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "all_reduce_coalesced", {buf}, [&](xcclWork_t* w) {
        return xcclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel() * unit, type, op, c, w);
    }, std::move(p)));
    return work(OpType::ALLREDUCE_COALESCED, std::move(parts), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::broadcast(std::vector<Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
    Pending p;
    Tensor buf = tensors.size() == 1 ? (checkTensor(tensors[0], "broadcast"), writable(tensors[0], p, true))
                                     : flat(tensors, p, true, true, "broadcast");
    xcclComm_t c = comm();
    int root = static_cast<int>(opts.rootRank);
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "broadcast", {buf}, [&](xcclWork_t* w) {
        return xcclBroadcast(buf.data_ptr(), buf.data_ptr(), bytes(buf), xcclUint8, root, c, w);
    }, std::move(p)));
    return work(OpType::BROADCAST, std::move(parts), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::reduce(std::vector<Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
    const Tensor& t = one(tensors, "reduce");
    xcclRedOp_t op = redOp(opts.reduceOp, "reduce");
    auto [type, unit] = reduceType(t, op, "reduce");
    Pending p;
    Tensor buf = writable(t, p, true);
    xcclComm_t c = comm();
    int root = static_cast<int>(opts.rootRank);
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "reduce", {buf}, [&](xcclWork_t* w) {
        return xcclReduce(buf.data_ptr(), buf.data_ptr(), buf.numel() * unit, type, op, root, c, w);
    }, std::move(p)));
    return work(OpType::REDUCE, std::move(parts), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::allgather(std::vector<std::vector<Tensor>>& outputs,
                                                           std::vector<Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
    TORCH_CHECK(outputs.size() == 1, "xccl backend: all_gather: ", outputs.size(),
                " output lists per call; xccl takes one per process");
    const Tensor& in = one(inputs, "all_gather");
    auto& outs = outputs[0];
    TORCH_CHECK(static_cast<int>(outs.size()) == size_, "xccl backend: all_gather: the output list holds ",
                outs.size(), " tensors; the group has ", size_, " ranks");
    Pending p;
    Tensor src = in.contiguous();
    Tensor buf = flat(outs, p, false, true, "all_gather");
    TORCH_CHECK(buf.scalar_type() == in.scalar_type(), "xccl backend: all_gather: output dtype ",
                buf.scalar_type(), " differs from the input's ", in.scalar_type());
    std::vector<size_t> cnt = counts(outs, in.element_size());
    TORCH_CHECK(cnt[rank_] == bytes(src), "xccl backend: all_gather: this rank's output tensor has ",
                outs[rank_].numel(), " elements, its input ", in.numel());
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "all_gather", {src, buf}, [&](xcclWork_t* w) {
        return xcclAllGatherV(src.data_ptr(), buf.data_ptr(), bytes(src), cnt.data(), xcclUint8, c, w);
    }, std::move(p)));
    return work(OpType::ALLGATHER, std::move(parts), outs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::all_gather_single(Tensor& output, Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
    checkTensor(output, "all_gather_into_tensor");
    checkTensor(input, "all_gather_into_tensor");
    TORCH_CHECK(output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type(),
                "xccl backend: all_gather_into_tensor: the output has ", output.numel(), " elements of ",
                output.scalar_type(), "; it needs ", size_, " x the input's ", input.numel(), " of ",
                input.scalar_type());
    Pending p;
    Tensor src = input.contiguous();
    Tensor out = writable(output, p, false);
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "all_gather_into_tensor", {src, out}, [&](xcclWork_t* w) {
        return xcclAllGather(src.data_ptr(), out.data_ptr(), bytes(src), xcclUint8, c, w);
    }, std::move(p)));
    return work(OpType::_ALLGATHER_BASE, std::move(parts), {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::allgather_coalesced(std::vector<std::vector<Tensor>>& outputs,
                                                                     std::vector<Tensor>& inputs,
                                                                     const c10d::AllgatherOptions& opts) {
    // outputs[r][j]: input j of rank r (torch.distributed.all_gather_coalesced's layout).
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "xccl backend: all_gather_coalesced: ", outputs.size(),
                " output lists; it needs one per rank (", size_, ")");
    for (const auto& per_rank : outputs)
        TORCH_CHECK(per_rank.size() == inputs.size(), "xccl backend: all_gather_coalesced: an output list of ",
                    per_rank.size(), " tensors for ", inputs.size(), " inputs");
    std::vector<Pending> parts;
    std::vector<Tensor> result;
    for (size_t j = 0; j < inputs.size(); ++j) {
        std::vector<std::vector<Tensor>> o(1);
        for (int r = 0; r < size_; ++r) o[0].push_back(outputs[r][j]);
        std::vector<Tensor> in{inputs[j]};
        auto w = c10::static_intrusive_pointer_cast<WorkXCCL>(allgather(o, in, opts));
        for (auto& part : w->parts_) parts.push_back(std::move(part));
        w->parts_.clear();
        w->done_ = true;
    }
    for (const auto& per_rank : outputs) result.insert(result.end(), per_rank.begin(), per_rank.end());
    return work(OpType::ALLGATHER_COALESCED, std::move(parts), result);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::all_gather_single_coalesced(std::vector<Tensor>& outputs,
                                                                             std::vector<Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
    TORCH_CHECK(outputs.size() == inputs.size(), "xccl backend: all_gather_into_tensor_coalesced: ",
                outputs.size(), " outputs for ", inputs.size(), " inputs");
    std::vector<Pending> parts;
    for (size_t i = 0; i < inputs.size(); ++i) {
        auto w = c10::static_intrusive_pointer_cast<WorkXCCL>(all_gather_single(outputs[i], inputs[i], opts));
        for (auto& part : w->parts_) parts.push_back(std::move(part));
        w->parts_.clear();
        w->done_ = true;
    }
    return work(OpType::ALLGATHER_INTO_TENSOR_COALESCED, std::move(parts), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::gather(std::vector<std::vector<Tensor>>& outputs,
                                                        std::vector<Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
    const Tensor& in = one(inputs, "gather");
    int root = static_cast<int>(opts.rootRank);
    TORCH_CHECK(root >= 0 && root < size_, "xccl backend: gather: root ", root, " is outside the group of ", size_);
    Pending p;
    Tensor src = in.contiguous();
    Tensor buf;
    std::vector<size_t> cnt(size_, bytes(src));
    std::vector<Tensor> result;
    if (rank_ == root) {
        TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                    "xccl backend: gather: the root needs one output list of ", size_, " tensors");
        buf = flat(outputs[0], p, false, true, "gather");
        cnt = counts(outputs[0], in.element_size());
        result = outputs[0];
    }
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "gather", {src, buf}, [&](xcclWork_t* w) {
        return xcclGatherV(src.data_ptr(), buf.defined() ? buf.data_ptr() : nullptr, bytes(src), cnt.data(),
                           xcclUint8, root, c, w);
    }, std::move(p)));
    return work(OpType::GATHER, std::move(parts), result);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::gather_single(Tensor& output, Tensor& input,
                                                               const c10d::GatherOptions& opts) {
    std::vector<std::vector<Tensor>> outs;
    if (rank_ == opts.rootRank) outs.push_back(output.chunk(size_));
    std::vector<Tensor> in{input};
    auto w = gather(outs, in, opts);
    return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::scatter(std::vector<Tensor>& outputs,
                                                         std::vector<std::vector<Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
    const Tensor& out = one(outputs, "scatter");
    int root = static_cast<int>(opts.rootRank);
    TORCH_CHECK(root >= 0 && root < size_, "xccl backend: scatter: root ", root, " is outside the group of ", size_);
    Pending p;
    Tensor dst = writable(out, p, false);
    Tensor buf;
    std::vector<size_t> cnt(size_, bytes(dst));
    if (rank_ == root) {
        TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                    "xccl backend: scatter: the root needs one input list of ", size_, " tensors");
        buf = flat(inputs[0], p, true, false, "scatter");
        cnt = counts(inputs[0], out.element_size());
    }
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "scatter", {buf, dst}, [&](xcclWork_t* w) {
        return xcclScatterV(buf.defined() ? buf.data_ptr() : nullptr, dst.data_ptr(), cnt.data(), bytes(dst),
                            xcclUint8, root, c, w);
    }, std::move(p)));
    return work(OpType::SCATTER, std::move(parts), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::reduce_scatter(std::vector<Tensor>& outputs,
                                                                std::vector<std::vector<Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
    const Tensor& out = one(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "xccl backend: reduce_scatter: needs one input list of ", size_, " tensors");
    xcclRedOp_t op = redOp(opts.reduceOp, "reduce_scatter");
    auto [type, unit] = reduceType(out, op, "reduce_scatter");
    Pending p;
    Tensor src = flat(inputs[0], p, true, false, "reduce_scatter");
    TORCH_CHECK(src.scalar_type() == out.scalar_type(), "xccl backend: reduce_scatter: input dtype ",
                src.scalar_type(), " differs from the output's ", out.scalar_type());
    std::vector<size_t> cnt = counts(inputs[0], unit);
    TORCH_CHECK(cnt[rank_] == static_cast<size_t>(out.numel()) * unit, "xccl backend: reduce_scatter: input ",
                rank_, " has ", inputs[0][rank_].numel(), " elements, the output ", out.numel());
    Tensor dst = writable(out, p, false);
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "reduce_scatter", {src, dst}, [&](xcclWork_t* w) {
        return xcclReduceScatterV(src.data_ptr(), dst.data_ptr(), cnt.data(), type, op, c, w);
    }, std::move(p)));
    return work(OpType::REDUCE_SCATTER, std::move(parts), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::reduce_scatter_single(Tensor& output, Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
    checkTensor(output, "reduce_scatter_tensor");
    checkTensor(input, "reduce_scatter_tensor");
    TORCH_CHECK(input.numel() == output.numel() * size_ && input.scalar_type() == output.scalar_type(),
                "xccl backend: reduce_scatter_tensor: the input has ", input.numel(), " elements of ",
                input.scalar_type(), "; it needs ", size_, " x the output's ", output.numel(), " of ",
                output.scalar_type());
    xcclRedOp_t op = redOp(opts.reduceOp, "reduce_scatter_tensor");
    auto [type, unit] = reduceType(output, op, "reduce_scatter_tensor");
    Pending p;
    Tensor src = input.contiguous();
    Tensor dst = writable(output, p, false);
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "reduce_scatter_tensor", {src, dst}, [&](xcclWork_t* w) {
        return xcclReduceScatter(src.data_ptr(), dst.data_ptr(), dst.numel() * unit, type, op, c, w);
    }, std::move(p)));
    return work(OpType::_REDUCE_SCATTER_BASE, std::move(parts), {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::reduce_scatter_single_coalesced(
    std::vector<Tensor>& outputs, std::vector<Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
    TORCH_CHECK(outputs.size() == inputs.size(), "xccl backend: reduce_scatter_tensor_coalesced: ",
                outputs.size(), " outputs for ", inputs.size(), " inputs");
    std::vector<Pending> parts;
    for (size_t i = 0; i < inputs.size(); ++i) {
        auto w = c10::static_intrusive_pointer_cast<WorkXCCL>(reduce_scatter_single(outputs[i], inputs[i], opts));
        for (auto& part : w->parts_) parts.push_back(std::move(part));
        w->parts_.clear();
        w->done_ = true;
    }
    return work(OpType::REDUCE_SCATTER_TENSOR_COALESCED, std::move(parts), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::all_to_all_single(Tensor& output, Tensor& input,
                                                                   std::vector<int64_t>& outputSplits,
                                                                   std::vector<int64_t>& inputSplits,
                                                                   const c10d::AllToAllOptions& opts) {
    checkTensor(output, "all_to_all_single");
    checkTensor(input, "all_to_all_single");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "xccl backend: all_to_all_single: dtypes ",
                input.scalar_type(), " and ", output.scalar_type(), " differ");
    // Bytes per rank: splits are rows (the first dimension); none given means equal shares.
    auto split = [&](const Tensor& t, const std::vector<int64_t>& s, const char* what) {
        std::vector<size_t> c(size_);
        if (s.empty()) {
            TORCH_CHECK(t.numel() % size_ == 0, "xccl backend: all_to_all_single: the ", what, "'s ", t.numel(),
                        " elements do not split evenly over ", size_, " ranks");
            std::fill(c.begin(), c.end(), bytes(t) / size_);
            return c;
        }
        TORCH_CHECK(static_cast<int>(s.size()) == size_, "xccl backend: all_to_all_single: ", s.size(), " ", what,
                    " split sizes for ", size_, " ranks");
        size_t row = t.dim() > 0 && t.size(0) > 0 ? bytes(t) / t.size(0) : 0;
        int64_t rows = std::accumulate(s.begin(), s.end(), int64_t{0});
        TORCH_CHECK(t.dim() > 0 && rows == t.size(0), "xccl backend: all_to_all_single: ", what,
                    " split sizes add up to ", rows, " rows; the tensor has ", t.dim() > 0 ? t.size(0) : 0);
        for (int r = 0; r < size_; ++r) c[r] = static_cast<size_t>(s[r]) * row;
        return c;
    };
    std::vector<size_t> send = split(input, inputSplits, "input"), recv = split(output, outputSplits, "output");
    Pending p;
    Tensor src = input.contiguous();
    Tensor dst = writable(output, p, false);
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "all_to_all_single", {src, dst}, [&](xcclWork_t* w) {
        return xcclAllToAllV(src.data_ptr(), dst.data_ptr(), send.data(), recv.data(), xcclUint8, c, w);
    }, std::move(p)));
    return work(OpType::ALLTOALL_BASE, std::move(parts), {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
    TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
                "xccl backend: all_to_all: needs ", size_, " input and output tensors, got ", inputs.size(),
                " and ", outputs.size());
    Pending p;
    Tensor src = flat(inputs, p, true, false, "all_to_all");
    Tensor dst = flat(outputs, p, false, true, "all_to_all");
    std::vector<size_t> send = counts(inputs, src.element_size()), recv = counts(outputs, dst.element_size());
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "all_to_all", {src, dst}, [&](xcclWork_t* w) {
        return xcclAllToAllV(src.data_ptr(), dst.data_ptr(), send.data(), recv.data(), xcclUint8, c, w);
    }, std::move(p)));
    return work(OpType::ALLTOALL, std::move(parts), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::send(std::vector<Tensor>& tensors, int dst, int tag) {
    Tensor src = one(tensors, "send").contiguous();
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(true, "send", {src}, [&](xcclWork_t* w) {
        return xcclSend(src.data_ptr(), bytes(src), xcclUint8, dst, static_cast<uint32_t>(tag), c, w);
    }));
    return work(OpType::SEND, std::move(parts), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::recv(std::vector<Tensor>& tensors, int src, int tag) {
    const Tensor& t = one(tensors, "recv");
    Pending p;
    Tensor dst = writable(t, p, false);
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(true, "recv", {dst}, [&](xcclWork_t* w) {
        return xcclRecv(dst.data_ptr(), bytes(dst), xcclUint8, src, static_cast<uint32_t>(tag), c, w);
    }, std::move(p)));
    return work(OpType::RECV, std::move(parts), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::recvAnysource(std::vector<Tensor>&, int) {
    TORCH_CHECK(false, "xccl backend: recv from any source is not supported: xccl receives from a named rank "
                       "(pass src)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupXCCL::barrier(const c10d::BarrierOptions& opts) {
    xcclComm_t c = comm();
    std::vector<Pending> parts;
    parts.push_back(issue(opts.asyncOp, "barrier", {}, [&](xcclWork_t* w) { return xcclBarrier(c, w); }));
    return work(OpType::BARRIER, std::move(parts), {});
}

c10::intrusive_ptr<c10d::Backend> createProcessGroupXCCL(const c10::intrusive_ptr<c10d::Store>& store,
                                                         int64_t rank, int64_t size,
                                                         const std::chrono::duration<float>& timeout,
                                                         const std::string& name) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
    return c10::make_intrusive<ProcessGroupXCCL>(store, static_cast<int>(rank), static_cast<int>(size), ms, name);
}

}  // namespace xccl_torch
