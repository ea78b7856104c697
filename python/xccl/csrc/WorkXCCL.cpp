// WorkXCCL, the state a group's works share (GroupState), and the Pending operations they
// hold (see ProcessGroupXCCL.hpp).
#include <algorithm>
#include <thread>

#include <c10/util/Exception.h>

#include "ProcessGroupXCCL.hpp"

namespace xccl_torch {

using c10d::OpType;
using Tensor = at::Tensor;

namespace {

// Works dropped before they completed: their operations still use their tensors, which are
// kept here until the operations end.
class Reaper {
  public:
    static void take(std::vector<Pending> parts) {
        static Reaper* r = new Reaper();  // never destroyed: it may outlive static destruction
        std::lock_guard<std::mutex> g(r->mu_);
        r->q_.push_back(std::move(parts));
        r->cv_.notify_one();
    }

  private:
    Reaper() {
        std::thread([this] {
            for (;;) {
                std::vector<Pending> parts;
                {
                    std::unique_lock<std::mutex> g(mu_);
                    cv_.wait(g, [&] { return !q_.empty(); });
                    parts = std::move(q_.front());
                    q_.pop_front();
                }
                for (auto& p : parts)
                    if (p.handle) xcclWait(p.handle, -1);
            }
        }).detach();
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::vector<Pending>> q_;
};

}  // namespace

const char* opTitle(OpType t) {
    switch (t) {
        case OpType::BROADCAST: return "xccl:broadcast";
        case OpType::ALLREDUCE: return "xccl:all_reduce";
        case OpType::ALLREDUCE_COALESCED: return "xccl:all_reduce_coalesced";
        case OpType::REDUCE: return "xccl:reduce";
        case OpType::ALLGATHER: return "xccl:all_gather";
        case OpType::_ALLGATHER_BASE: return "xccl:all_gather_into_tensor";
        case OpType::ALLGATHER_COALESCED: return "xccl:all_gather_coalesced";
        case OpType::GATHER: return "xccl:gather";
        case OpType::SCATTER: return "xccl:scatter";
        case OpType::REDUCE_SCATTER: return "xccl:reduce_scatter";
        case OpType::_REDUCE_SCATTER_BASE: return "xccl:reduce_scatter_tensor";
        case OpType::ALLTOALL_BASE: return "xccl:all_to_all_single";
        case OpType::ALLTOALL: return "xccl:all_to_all";
        case OpType::SEND: return "xccl:send";
        case OpType::RECV: return "xccl:recv";
        case OpType::BARRIER: return "xccl:barrier";
        default: return "xccl:op";
    }
}


// ---- Pending, WorkXCCL -------------------------------------------------------------------

Pending::Pending(Pending&& o) noexcept
    : handle(std::exchange(o.handle, nullptr)), keep(std::move(o.keep)), after(std::move(o.after)) {}

Pending::~Pending() {
    if (handle) xcclWorkFree(handle);
}

WorkXCCL::WorkXCCL(OpType type, int rank, std::vector<Pending> parts, std::vector<Tensor> result,
                   std::shared_ptr<GroupState> group, uint64_t seq)
    : c10d::Work(rank, type, opTitle(type)),
      parts_(std::move(parts)),
      result_(std::move(result)),
      group_(std::move(group)),
      seq_(seq) {
    done_ = std::all_of(parts_.begin(), parts_.end(), [](const Pending& p) { return p.handle == nullptr; });
    if (done_) parts_.clear();
}

WorkXCCL::~WorkXCCL() {
    if (!done_ && !parts_.empty()) Reaper::take(std::move(parts_));
}

bool WorkXCCL::finish() {
    std::lock_guard<std::mutex> g(mu_);
    if (done_) return !error_;
    std::string first;
    for (auto& p : parts_) {
        if (!p.handle) continue;
        xcclResult_t rc = xcclWait(p.handle, -1);
        if (rc != xcclSuccess && first.empty()) first = xcclGetLastError();
    }
    if (first.empty()) {
        try {
            for (auto& p : parts_)
                for (auto& f : p.after) f();
        } catch (...) {
            error_ = std::current_exception();
        }
    } else {
        try {
            C10_THROW_ERROR(DistBackendError, std::string("xccl backend: ") + opTitle(opType_) + ": " + first);
        } catch (...) {
            error_ = std::current_exception();
        }
    }
    parts_.clear();
    done_ = true;
    return !error_;
}

bool WorkXCCL::isCompleted() {
    {
        std::lock_guard<std::mutex> g(mu_);
        if (done_) return true;
        for (auto& p : parts_) {
            int done = 0;
            if (p.handle && (xcclTest(p.handle, &done) != xcclSuccess || !done)) return false;
        }
    }
    finish();  // every operation has ended: this does not block
    return true;
}

bool WorkXCCL::isSuccess() const {
    std::lock_guard<std::mutex> g(mu_);
    return done_ && !error_;
}

std::exception_ptr WorkXCCL::exception() const {
    std::lock_guard<std::mutex> g(mu_);
    return error_;
}

std::vector<Tensor> WorkXCCL::result() {
    wait();
    return result_;
}

bool WorkXCCL::wait(std::chrono::milliseconds timeout) {
    if (timeout != kNoTimeout) {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        std::vector<xcclWork_t> handles;
        {
            std::lock_guard<std::mutex> g(mu_);
            if (!done_)
                for (auto& p : parts_)
                    if (p.handle) handles.push_back(p.handle);
        }
        for (auto h : handles) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
            if (xcclWait(h, std::max<int64_t>(left.count(), 0)) == xcclInProgress) {
                std::string why = std::string("Work.wait(") + std::to_string(timeout.count()) + " ms) timed out on " +
                                  opTitle(opType_) + " #" + std::to_string(seq_) + " of rank " + std::to_string(rank_);
                group_->abortComm(why);
                finish();
                C10_THROW_ERROR(DistBackendError, "xccl backend: " + why +
                                                      "; the communicator was aborted (its peers are told)");
            }
        }
    }
    if (!finish()) std::rethrow_exception(exception());
    return true;
}

void WorkXCCL::abort() { group_->abortComm(std::string("Work.abort() on ") + opTitle(opType_)); }

c10::intrusive_ptr<c10::ivalue::Future> WorkXCCL::getFuture() {
    std::unique_lock<std::mutex> g(mu_);
    if (future_) return future_;
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    auto f = future_;
    bool done = done_;
    g.unlock();
    if (done) {
        completeFuture();
        return f;
    }
    group_->submit(c10::intrusive_ptr<WorkXCCL>::reclaim_copy(this));
    return f;
}

// ---- GroupState --------------------------------------------------------------------------

void GroupState::abortComm(const std::string& why) {
    std::lock_guard<std::mutex> g(mu);
    if (comm) xcclCommAbortReason(comm, why.c_str());
}

void GroupState::submit(c10::intrusive_ptr<WorkXCCL> work) {
    std::unique_lock<std::mutex> g(mu);
    if (stopping) {
        g.unlock();
        work->finish();
        work->completeFuture();
        return;
    }
    futures.push_back(std::move(work));
    if (!started) {
        started = true;
        std::thread([self = shared_from_this()]() mutable {
            for (;;) {
                c10::intrusive_ptr<WorkXCCL> w;
                {
                    std::unique_lock<std::mutex> g(self->mu);
                    self->cv.wait(g, [&] { return self->stopping || !self->futures.empty(); });
                    if (self->futures.empty()) break;
                    w = std::move(self->futures.front());
                    self->futures.pop_front();
                }
                w->finish();
                w->completeFuture();
            }
            self.reset();  // may be the last reference: the state ends here, on this thread
        }).detach();
    }
    cv.notify_one();
}

void GroupState::stop() {
    std::lock_guard<std::mutex> g(mu);
    stopping = true;
    cv.notify_all();
}

GroupState::~GroupState() {
    if (comm) xcclCommDestroy(comm);
}

void WorkXCCL::completeFuture() {
    std::unique_lock<std::mutex> g(mu_);
    auto f = future_;
    auto err = error_;
    g.unlock();
    if (!f || f->completed()) return;
    if (err)
        f->setError(err);
    else
        f->markCompleted(c10::IValue(result_));
}

}  // namespace xccl_torch
