// The C API from C++: a communicator made from a unique id that rank 0 draws and broadcasts
// over the launcher's communicator (as NCCL programs pass theirs over MPI), collectives on
// std::vector checked against a reference, an asynchronous all-gather, and an abort: rank 0
// aborts a duplicate while rank 1 waits on it, and rank 1's receive fails naming rank 0.
//
//   c++ -std=c++17 unique_id.cpp $(pkg-config --cflags --libs xccl) -o unique_id
//   xccl run -n 2 -- ./unique_id
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "xccl.h"

namespace {

// An xccl failure as an exception carrying the library's message.
struct Error : std::runtime_error {
    xcclResult_t code;
    int rank;
    Error(const char* what, xcclResult_t rc)
        : std::runtime_error(std::string(what) + ": " + xcclGetErrorString(rc) + ": " + xcclGetLastError()),
          code(rc), rank(xcclGetLastErrorRank()) {}
};

void check(xcclResult_t rc, const char* what) {
    if (rc != xcclSuccess) throw Error(what, rc);
}

// Owns one communicator.
class Comm {
  public:
    explicit Comm(xcclComm_t c) : c_(c) {}
    Comm(const Comm&) = delete;
    Comm(Comm&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
    ~Comm() { xcclCommDestroy(c_); }
    xcclComm_t get() const { return c_; }
    int rank() const {
        int r = -1;
        check(xcclCommUserRank(c_, &r), "xcclCommUserRank");
        return r;
    }
    int size() const {
        int n = 0;
        check(xcclCommCount(c_, &n), "xcclCommCount");
        return n;
    }

  private:
    xcclComm_t c_;
};

int checks = 0;

void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok) throw std::runtime_error("wrong result: " + what);
}

}  // namespace

int main() {
    try {
        xcclComm_t w = nullptr;
        check(xcclCommInitFromEnv(&w), "xcclCommInitFromEnv");
        Comm world(w);
        const int rank = world.rank(), size = world.size();

        // Rank 0 draws the id; everyone gets it over the launcher's communicator.
        xcclUniqueId id;
        std::memset(&id, 0, sizeof id);
        if (rank == 0) check(xcclGetUniqueId(&id), "xcclGetUniqueId");
        check(xcclBroadcast(&id, &id, sizeof id, xcclUint8, 0, world.get(), nullptr), "broadcast of the id");
        xcclComm_t c = nullptr;
        check(xcclCommInitRank(&c, size, id, rank), "xcclCommInitRank");
        Comm comm(c);
        expect(comm.rank() == rank && comm.size() == size, "rank and size of the new communicator");

        // All-reduce, in place.
        std::vector<float> v(1 << 16);
        std::iota(v.begin(), v.end(), float(rank));
        check(xcclAllReduce(v.data(), v.data(), v.size(), xcclFloat32, xcclSum, comm.get(), nullptr), "all-reduce");
        for (size_t i = 0; i < v.size(); i += 997) {
            float want = 0;
            for (int r = 0; r < size; ++r) want += float(r) + float(i);
            expect(v[i] == want, "all-reduce element " + std::to_string(i));
        }

        // Asynchronous all-gather, waited on with a timeout, as a program that watches a clock.
        std::vector<int64_t> mine(3, rank), all(3 * size, -1);
        xcclWork_t work = nullptr;
        check(xcclAllGather(mine.data(), all.data(), mine.size(), xcclInt64, comm.get(), &work), "all-gather");
        xcclResult_t rc;
        while ((rc = xcclWait(work, 10)) == xcclInProgress) {
        }
        check(rc, "waiting for the all-gather");
        xcclWorkFree(work);
        for (int r = 0; r < size; ++r)
            for (int i = 0; i < 3; ++i) expect(all[3 * r + i] == r, "all-gather block " + std::to_string(r));

        // Abort: rank 1 waits for a message that rank 0 will never send; rank 0 aborts.
        if (size >= 2) {
            xcclComm_t d = nullptr;
            check(xcclCommDup(comm.get(), &d), "xcclCommDup");
            if (rank == 0) {
                // The peer is waiting (or about to): abort names this rank to it.
                check(xcclCommAbortReason(d, "the example aborts on purpose"), "xcclCommAbortReason");
                double x = 0;
                xcclResult_t after = xcclSend(&x, 1, xcclFloat64, 1, 0, d, nullptr);
                expect(after == xcclAborted, std::string("a call after abort: ") + xcclGetLastError());
                xcclCommDestroy(d);
            } else if (rank == 1) {
                double x = 0;
                xcclResult_t got = xcclRecv(&x, 1, xcclFloat64, 0, 0, d, nullptr);
                std::string msg = xcclGetLastError();
                expect(got == xcclRemoteError && xcclGetLastErrorRank() == 0 &&
                           msg.find("aborts on purpose") != std::string::npos,
                       "the receive failed naming rank 0: " + msg);
                xcclCommDestroy(d);
            } else {
                xcclCommDestroy(d);
            }
        }
        check(xcclBarrier(comm.get(), nullptr), "barrier");
        std::printf("unique_id: %d checks passed on rank %d of %d\n", checks, rank, size);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "unique_id: %s\n", e.what());
        return 1;
    }
}
