// ProcessGroupXCCL: xccl as a native PyTorch c10d backend for CPU tensors, on xccl's C API
// (xccl.h). Each process group is one xccl communicator, made through the store PyTorch hands
// to the group; every call starts one xccl operation on the communicator's own stream (its
// progress thread, operations in issue order) and returns a WorkXCCL whose wait() waits for
// that operation and whose future completes when it does. No Python runs per call.
//
// Usable from Python (the package registers it as "xccl" and "xccl_cpu", see xccl/torch.py)
// and from C++ programs written against libtorch: construct it from a c10d::Store.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "xccl.h"

namespace xccl_torch {

// One started xccl operation and what must outlive it: its tensors (the memory xccl
// reads and writes) and the copies that bring results back into the caller's tensors.
struct Pending {
    xcclWork_t handle = nullptr;               // null: the operation ran to completion already
    std::vector<at::Tensor> keep;              // alive until the operation has completed
    std::vector<std::function<void()>> after;  // run once, after success
    Pending() = default;
    Pending(Pending&& o) noexcept;
    Pending& operator=(Pending&&) = delete;
    Pending(const Pending&) = delete;
    ~Pending();  // frees the handle: only once the operation has completed
};

class WorkXCCL;

// What a group's works keep of it: the communicator, and the thread that completes the
// futures of its operations in issue order (started by the first getFuture(); it holds the
// state alive while it runs, and ends once stopped and drained).
struct GroupState : std::enable_shared_from_this<GroupState> {
    xcclComm_t comm = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<c10::intrusive_ptr<WorkXCCL>> futures;
    bool started = false;
    bool stopping = false;
    // Aborts the communicator (operations in progress fail, peers are told), naming `why`.
    void abortComm(const std::string& why);
    // Queues `work`, whose future the completer completes when the work is done (at once, on
    // this thread, once the group is stopped).
    void submit(c10::intrusive_ptr<WorkXCCL> work);
    // Lets the completer end once it has completed what is queued.
    void stop();
    ~GroupState();
};

// The c10d Work of one call: done when its xccl operations are. wait(timeout) honours the
// timeout (on expiry the communicator is aborted, as NCCL does, and the error says so);
// errors carry xccl's message, which names the rank at fault.
class WorkXCCL : public c10d::Work {
  public:
    WorkXCCL(c10d::OpType type, int rank, std::vector<Pending> parts, std::vector<at::Tensor> result,
             std::shared_ptr<GroupState> group, uint64_t seq);
    ~WorkXCCL() override;

    bool isCompleted() override;
    bool isSuccess() const override;
    std::exception_ptr exception() const override;
    std::vector<at::Tensor> result() override;
    void synchronize() override {}
    bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
    void abort() override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
    uint64_t getSequencenumber() const override { return seq_; }

    // Waits without limit and records the outcome (once); true if it succeeded.
    bool finish();
    // Completes the future with the outcome (after finish()).
    void completeFuture();

  private:
    friend class ProcessGroupXCCL;
    friend struct GroupState;
    mutable std::mutex mu_;
    std::vector<Pending> parts_;
    std::vector<at::Tensor> result_;
    std::shared_ptr<GroupState> group_;
    uint64_t seq_;
    bool done_ = false;
    std::exception_ptr error_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupXCCL : public c10d::Backend {
  public:
    // Rank `rank` of `size`, meeting through `store` (the group's: its keys are the group's
    // alone); `timeout` bounds the rendezvous and, unless XCCL_TIMEOUT is set, every
    // operation's wait for progress; `name` is the name it was registered under.
    ProcessGroupXCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout, std::string name = "xccl");
    ~ProcessGroupXCCL() override;

    const std::string getBackendName() const override { return name_; }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const c10d::BroadcastOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const c10d::AllreduceOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceCoalescedOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const c10d::ReduceOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                     const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::GatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& output, at::Tensor& input,
                                                 const c10d::GatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ReduceScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                         const c10d::ReduceScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::ReduceScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                     std::vector<int64_t>& outputSplits,
                                                     std::vector<int64_t>& inputSplits,
                                                     const c10d::AllToAllOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                            const c10d::AllToAllOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

    // The group's sequence number: every rank starts at 0 when the group is made, and each
    // operation issued takes the next one (what PyTorch's checks of subgroups compare).
    void setSequenceNumberForGroup() override { seq_ = 0; }
    uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

    // Aborts the communicator: operations in progress fail, peers are told.
    void abort() override;
    // Ends the group: waits for issued operations, then frees the communicator.
    void shutdown() override;

  private:
    // The Work of `parts`, already issued (each ran to completion if the call was
    // synchronous); `result` is what result() and the future give.
    c10::intrusive_ptr<c10d::Work> work(c10d::OpType type, std::vector<Pending> parts,
                                        std::vector<at::Tensor> result);
    // The communicator; throws once the group was shut down.
    xcclComm_t comm() const;

    std::string name_;
    std::shared_ptr<GroupState> shared_;
    std::atomic<uint64_t> seq_{0};
};

// The title of an operation of type `t` ("xccl:all_reduce"), for the profiler and errors.
const char* opTitle(c10d::OpType t);

// Creates the backend for torch.distributed.Backend.register_backend (Python), with the
// group's store, rank, size and timeout, and the name it is registered under.
c10::intrusive_ptr<c10d::Backend> createProcessGroupXCCL(const c10::intrusive_ptr<c10d::Store>& store,
                                                         int64_t rank, int64_t size,
                                                         const std::chrono::duration<float>& timeout,
                                                         const std::string& name);

}  // namespace xccl_torch
