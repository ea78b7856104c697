// The Python module of the native backend: one function, the backend's constructor, which
// xccl/torch.py registers with torch.distributed.Backend.register_backend. The rendezvous it
// runs waits for the other ranks, so it releases the GIL.
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include "ProcessGroupXCCL.hpp"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "xccl's native PyTorch backend (ProcessGroupXCCL)";
    m.def("create", &xccl_torch::createProcessGroupXCCL, py::arg("store"), py::arg("rank"), py::arg("size"),
          py::arg("timeout"), py::arg("name") = "xccl", py::call_guard<py::gil_scoped_release>(),
          "The xccl backend of one process group: rank `rank` of `size`, meeting through `store`, "
          "named `name` (the name it is registered under).");
}
