/* backend.c — picks the backend for a device. */
#include "backend/backend.h"

#include "util/status.h"

kiln_status kiln_backend_new(kiln_device device, int n_threads, kiln_backend **out) {
    *out = NULL;
    switch (device) {
    case KILN_DEVICE_CPU:
        return kiln_backend_cpu_new(n_threads, out);
    case KILN_DEVICE_CUDA:
#ifdef KILN_HAVE_CUDA
        return kiln_backend_cuda_new(n_threads, out);
#else
        return kiln_error(
            KILN_ERR_UNSUPPORTED,
            "--device cuda: this kiln was built without CUDA (no nvcc at build time)");
#endif
    }
    return kiln_error(KILN_ERR_INVALID_ARG, "unknown device %d", (int)device);
}
